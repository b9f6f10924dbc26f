"""Why Adam killed the pong_v3 networks: short runs of equal update counts, then per layer the units still
alive and the step each optimizer takes.

    python docs/results/adam_probe.py --out docs/results/adam_probe.csv [--jobs 2] [--cases a,b,...]

The `*_rmsprop_2k` cases (docs/results/rmsprop_regime.csv) train other games' shared networks for 2,000
updates with DQN3.0's RMSProp instead, for the gradient's scale per layer (the `*_grad_rms` columns).

Every case trains 10,000 minibatch updates per learner from scratch (seed 1, one torch thread, the
presets' settings otherwise: `configs/pong_fast.toml` for pong_v3 and boxing_v2, `configs/pong_single_fast.toml`
for one-agent games), so every optimizer has seen the same number of steps. Then, on the final checkpoint:

- the ReLU units alive on 400 states of random pong_v3 play (docs/results/dead_units.py): per layer the
  fraction of units active on at least one state, and the spread of Q across states;
- per layer, from the optimizer's own running moments (Adam: m and v with bias correction; DQN3.0's
  RMSProp: g and g2), the gradient's RMS on the summed-minibatch scale (sqrt(v), resp. sqrt(g2)), and
  the RMS over the layer's weights of one step, lr * m / (sqrt(v) + eps) for Adam (lr * g / sqrt(g2 - g^2
  + 0.01) for RMSProp), next to what DQN3.0's RMSProp would step with the same moments: their ratio says
  how much larger Adam's steps are than RMSProp's on that layer; and the mean signed step of the layer's
  biases (negative: pushed down, towards units that never fire).
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "results"))
from dead_units import layer_activity, random_play_states  # noqa: E402

UPDATES = 10_000
LEARN_START = 10_000
COMMON = ["--set", "backend='local'", "--set", "eval_freq=0", "--set", "final_eval_episodes=0",
          "--set", "save_replay=false", "--set", "save_freq=1000000", "--set", f"learn_start={LEARN_START}",
          "--set", "prog_freq=5000"]
ADAM = ["--set", "optimizer='adam'", "--set", "lr=0.0001", "--set", "lr_end=0.0001", "--set", "adam_eps=0.00015"]
RMSPROP = ["--set", "optimizer='rmsprop'", "--set", "lr=0.00025", "--set", "lr_end=0.00025"]
PONG_V3 = ["--config", "configs/pong_fast.toml"]
ONE_AGENT = ["--config", "configs/pong_single_fast.toml"]


def steps_for(updates_per_step: float, updates: int = UPDATES) -> int:
    return LEARN_START + int(round(updates / updates_per_step))


def rmsprop_regime(config: str, updates: int = 2_000) -> list[str]:
    """A game's preset with DQN3.0's RMSProp at lr 2.5e-4 for ``updates`` updates: is the gradient small enough
    that RMSProp's eps floor (sqrt(0.01) = 0.1) sets its step, i.e. does it act as plain SGD there?"""
    return ["--config", config] + RMSPROP + ["--set", "n_step=1", "--set", "target_q=2000",
                                             "--set", f"steps={steps_for(0.5, updates)}"]


# case -> (what it changes, madqn train arguments, updates per agent step, game the units are probed on)
CASES = {
    "v3_shared_adam": ("pong_v3 shared, Adam lr 1e-4, adam_eps 1.5e-4 (the first preset)",
                       PONG_V3 + ADAM + ["--set", f"steps={steps_for(0.5)}"], "pong_v3"),
    "v3_shared_rmsprop": ("pong_v3 shared, DQN3.0's RMSProp lr 2.5e-4 (today's preset)",
                          PONG_V3 + RMSPROP + ["--set", f"steps={steps_for(0.5)}"], "pong_v3"),
    "v3_shared_adam_lr1e-5": ("as the first, lr 1e-5", PONG_V3 + ADAM + ["--set", "lr=0.00001", "--set", "lr_end=0.00001",
                                                                        "--set", f"steps={steps_for(0.5)}"], "pong_v3"),
    "v3_shared_adam_eps0.1": ("as the first, adam_eps 0.1, lr 2.5e-4 (RMSProp's floor: sqrt(0.01))",
                              PONG_V3 + ADAM + ["--set", "adam_eps=0.1", "--set", "lr=0.00025", "--set", "lr_end=0.00025",
                                                "--set", f"steps={steps_for(0.5)}"], "pong_v3"),
    "v3_independent_adam": ("pong_v3 independent (no agent indicator), Adam as the first",
                            ["--config", "configs/pong_fast_independent.toml"] + ADAM + ["--set", f"steps={steps_for(0.25)}"],
                            "pong_v3"),
    "v3_vs_random_adam": ("pong_v3 first_0 against a random player (no self-play), Adam as the first",
                          ["--env", "envs/pong_vs_random.py:make_env"] + ONE_AGENT + ADAM + ["--set", f"steps={steps_for(0.25)}"],
                          "pong_v3"),
    "pong_v5_adam": ("ALE/Pong-v5, one agent against the built-in player, Adam as the first",
                     ONE_AGENT + ADAM + ["--set", f"steps={steps_for(0.25)}"], "ALE/Pong-v5"),
    "boxing_shared_adam": ("boxing_v2 shared, Adam as the first", ["--config", "configs/boxing_fast.toml"] + ADAM
                           + ["--set", f"steps={steps_for(0.5)}"], "boxing_v2"),
    # the gradient's scale in other games, DQN3.0's RMSProp, 2,000 updates (the `*_grad_rms` columns)
    "boxing_shared_rmsprop_2k": ("boxing_v2 shared, DQN3.0's RMSProp lr 2.5e-4, 2,000 updates",
                                 rmsprop_regime("configs/boxing_fast.toml"), "boxing_v2"),
    "tennis_shared_rmsprop_2k": ("tennis_v3 shared, DQN3.0's RMSProp lr 2.5e-4, 2,000 updates",
                                 rmsprop_regime("configs/tennis_fast.toml"), "tennis_v3"),
    "surround_shared_rmsprop_2k": ("surround_v2 shared, DQN3.0's RMSProp lr 2.5e-4, 2,000 updates",
                                   rmsprop_regime("configs/surround_fast.toml"), "surround_v2"),
    "space_invaders_shared_rmsprop_2k": ("space_invaders_v2 shared, DQN3.0's RMSProp lr 2.5e-4, 2,000 updates",
                                         rmsprop_regime("configs/space_invaders_fast.toml"), "space_invaders_v2"),
    "v3_shared_rmsprop_2k": ("pong_v3 shared, DQN3.0's RMSProp lr 2.5e-4, 2,000 updates",
                             rmsprop_regime("configs/pong_fast.toml"), "pong_v3"),
}


def train(case: str, runs: Path) -> Path:
    run_dir = runs / case
    if (run_dir / "checkpoints" / "latest.pt").exists():
        return run_dir
    args = [sys.executable, "-m", "madqn", "train", *CASES[case][1], *COMMON, "--run-dir", str(run_dir)]
    start = time.time()
    with open(runs / f"{case}.log", "w") as log:
        subprocess.run(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    print(f"{case}: trained in {time.time() - start:.0f} s", flush=True)
    return run_dir


def optimizer_steps(state: dict, net: torch.nn.Module, config: dict) -> dict[str, tuple[float, float, float, float]]:
    """Per layer: the RMS over its weights of the gradient (sqrt of the second moment), of this optimizer's
    step, and of the step DQN3.0's RMSProp would take with the same moments; and the mean signed step of the
    layer's biases (negative: the biases are being pushed down, towards units that never fire)."""
    opt = state["optimizer"]
    names = [n for n, _ in net.named_parameters()]
    adam = config["optimizer"] == "adam"
    lr = float(opt["param_groups"][0]["lr"])
    out: dict[str, dict[str, list[torch.Tensor]]] = {}
    for i, name in enumerate(names):
        s = opt["state"][i]
        if adam:
            t = float(s["step"])
            m = s["exp_avg"].double() / (1 - 0.9 ** t)
            v = s["exp_avg_sq"].double() / (1 - 0.999 ** t)
            step = -lr * m / (v.sqrt() + float(config["adam_eps"]))
        else:
            m, v = s["g"].double(), s["g2"].double()
            step = -lr * m / (v - m * m + 0.01).clamp_min(1e-12).sqrt()
        rms_step = -2.5e-4 * m / (v - m * m + 0.01).clamp_min(1e-12).sqrt()
        layer, kind = name.split(".")
        d = out.setdefault(layer, {"v": [], "step": [], "rms_step": [], "bias": []})
        d["v"].append(v.flatten())
        d["step"].append(step.flatten())
        d["rms_step"].append(rms_step.flatten())
        if kind == "bias":
            d["bias"].append(step.flatten())

    def rms(parts: list[torch.Tensor]) -> float:
        return float(torch.cat(parts).pow(2).mean().sqrt())

    return {layer: (float(torch.cat(d["v"]).mean().sqrt()), rms(d["step"]), rms(d["rms_step"]),
                    float(torch.cat(d["bias"]).mean()))
            for layer, d in out.items()}


def measure(case: str, run_dir: Path) -> list[dict]:
    from madqn.evaluation.agents import load_agents
    path = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    agents = load_agents(path, seed=0)
    game = CASES[case][2]
    states = random_play_states(game, agents)
    rows = []
    for name, group in state["groups"].items():
        a = group["agents"][0]
        net = agents.networks[a]
        steps = optimizer_steps(group["learner"], net, state["config"])
        for agent in group["agents"]:
            activity, q = layer_activity(net, states[agent], agents.agent_ids[agent] if net.n_agents else None)
            row = {"case": case, "setting": CASES[case][0], "learner": name, "agent": agent,
                   "updates": int(group["updates"]), "agent_steps": int(state["step"]),
                   "q_std_across_states": round(float(q.std(0).mean()), 6)}
            for layer, (ever, mean) in activity.items():
                row[f"{layer}_ever"], row[f"{layer}_mean"] = round(ever, 3), round(mean, 3)
            for layer, (grad_rms, step, rms_step, bias_step) in steps.items():
                row[f"{layer}_grad_rms"] = f"{grad_rms:.3g}"
                row[f"{layer}_step_rms"] = f"{step:.3g}"
                row[f"{layer}_step_over_rmsprop"] = f"{step / rms_step:.3g}" if rms_step > 0 else ""
                row[f"{layer}_bias_step_mean"] = f"{bias_step:.3g}"
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default="runs/adam_probe")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    torch.set_num_threads(1)
    cases = args.cases.split(",")
    runs = ROOT / args.runs
    runs.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        dirs = dict(zip(cases, pool.map(lambda c: train(c, runs), cases)))
    rows = [r for c in cases for r in measure(c, dirs[c])]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(r["case"], r["agent"], r["updates"], "conv1-3,fc ever:", r["conv1_ever"], r["conv2_ever"], r["conv3_ever"],
              r["fc_ever"], "Q std", r["q_std_across_states"], "| step/rmsprop conv1..out:",
              [r.get(f"{k}_step_over_rmsprop") for k in ("conv1", "conv2", "conv3", "fc", "out")],
              "| bias step conv1..fc:", [r.get(f"{k}_bias_step_mean") for k in ("conv1", "conv2", "conv3", "fc")])


if __name__ == "__main__":
    main()
