"""Agent steps/s of a training preset once learning runs, for several checkouts of madqn, interleaved.

Each trial is a real ``madqn train`` run of the preset as that checkout has it (``PRESET`` is a path inside
each checkout; learning from step ``--learn-start``, epsilon held
at the preset's final value so that acting takes its long-run share), started from one checkout with
``PYTHONPATH`` pointing at it; trials go round-robin over the checkouts so that every checkout sees the
same machine load. The rate of a trial is the agent steps of its train.csv rows after the first
learning row (which holds any compile warm-up) over their wall time.

    python docs/results/preset_speed.py configs/pong_fast.toml --checkout base=/tmp/madqn-2fd8111 \\
        --checkout new=. --rounds 3 --out docs/results/pong_fast_speed.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path


def trial(checkout: Path, preset: Path, learn_start: int, learn_steps: int, overrides: list[str], run_dir: Path,
          bin_dir: Path) -> tuple[float, int]:
    """(agent steps/s once learning, steps measured) of one run."""
    cfg = tomllib.loads(preset.read_text())
    eps = cfg.get("ep_end", 0.1)
    args = [str(bin_dir / "madqn"), "train", "--config", str(preset), "--steps", str(learn_start + learn_steps),
            "--run-dir", str(run_dir), "--force",
            "--set", f"learn_start={learn_start}", "--set", "prog_freq=500", "--set", "eval_freq=0",
            "--set", "save_freq=1000000", "--set", "save_replay=false", "--set", "final_eval_episodes=0",
            "--set", f"ep_start={eps}", "--set", f"ep_end={eps}"]
    for o in overrides:
        args += ["--set", o]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=checkout)
    rows = list(csv.DictReader((run_dir / "train.csv").open()))
    steps = sorted({(int(r["step"]), float(r["wall_time"])) for r in rows})
    learning = [(s, w) for s, w in steps if s > learn_start]
    (s0, w0), (s1, w1) = learning[0], learning[-1]
    return (s1 - s0) / (w1 - w0), s1 - s0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path, help="the preset's path inside each checkout, e.g. configs/pong_fast.toml")
    p.add_argument("--checkout", action="append", required=True, help="LABEL=PATH of a madqn checkout (repeatable)")
    p.add_argument("--set", action="append", dest="sets", default=[],
                   help="LABEL:KEY=VALUE override for one checkout's runs (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--learn-start", type=int, default=2000)
    p.add_argument("--learn-steps", type=int, default=4000, help="agent steps of each trial after learn_start")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    checkouts = dict(c.split("=", 1) for c in a.checkout)
    sets: dict[str, list[str]] = {k: [] for k in checkouts}
    for s in a.sets:
        label, kv = s.split(":", 1)
        sets[label].append(kv)
    bin_dir = Path(sys.executable).parent
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = list(checkouts) if r % 2 == 0 else list(reversed(checkouts))
            for label in order:
                checkout = Path(checkouts[label]).resolve()
                rate, n = trial(checkout, checkout / a.preset, a.learn_start, a.learn_steps,  # its own preset file
                                sets[label], Path(tmp) / f"{label}-{r}", bin_dir)
                results.append({"round": r, "checkout": label, "agent_steps_per_s": round(rate, 2), "steps": n})
                print(f"round {r} {label:>10}: {rate:7.2f} agent steps/s over {n} steps", flush=True)
    base = next(iter(checkouts))
    print(f"\n{'checkout':>10} {'median':>8} {'vs ' + base:>10}")
    med = {k: statistics.median(x["agent_steps_per_s"] for x in results if x["checkout"] == k) for k in checkouts}
    for k in checkouts:
        per_round = [x["agent_steps_per_s"] / y["agent_steps_per_s"] for x in results for y in results
                     if x["checkout"] == k and y["checkout"] == base and x["round"] == y["round"]]
        print(f"{k:>10} {med[k]:8.2f} {statistics.median(per_round):9.2f}x  (per round: "
              f"{', '.join(f'{v:.2f}' for v in per_round)})")
    if a.out:
        with a.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[0]))
            w.writeheader()
            w.writerows(results)


if __name__ == "__main__":
    main()
