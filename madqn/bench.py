"""``madqn bench``: every speed figure next to the limit it is measured against, in the same run.

Each row times a madqn component and its limit side by side, interleaved (limit, component,
component, limit, ...) and repeated, and reports medians, so a busy machine slows both alike:

- env: ``AtariEnv.step`` decisions/s vs the bare emulator (ALE's C ``actMulti``, ``action_repeat``
  frames per decision, no screen read);
- learner: ``Trainer.learn`` (replay sampling, uint8 tensors, DQN3.0 targets, gradient injection,
  DQN3RMSprop, bookkeeping) vs a bare PyTorch update of the same network, batch and threads
  (float input ready, target forward, Huber loss, backward, ``torch.optim.RMSprop``);
- replay: allocated bytes per transition per agent vs one 84x84 frame, and minibatch sampling time;
- acting: time to choose the actions of all agents of one env step, independent vs shared;
- end-to-end: agent steps/s of a pong_v3 training run (learning on, epsilon 0.1) vs the bound
  computed from the rows above.

The rows run on CPU and, when CUDA is present, the learner and end-to-end rows again on CUDA.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from madqn.cli import command

CLEANRL_STEPS_PER_S = 84.0  # CleanRL dqn_atari on Pong, 2-core CPU (issue 5), the peer to beat by 1.3x


@dataclass
class Row:
    name: str
    value: float
    unit: str
    limit: float | None = None  # the limit / baseline measured in the same run (same unit)
    target: str = ""  # e.g. ">= 0.8" on value/limit, or "<= 7200" on value
    passed: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.limit else self.value / self.limit


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_table(rows: list[Row]) -> str:
    header = ["row", "measured", "unit", "limit (same run)", "ratio", "target", "result", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        result = "" if r.passed is None else ("pass" if r.passed else "MISS")
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append("| " + " | ".join([r.name, _fmt(r.value), r.unit, _fmt(r.limit), ratio, r.target, result,
                                        r.note]) + " |")
    return "\n".join(lines)


def machine_description(device: str) -> str:
    import os

    import torch

    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = (f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}, {platform.system()} {platform.release()}")
    if device.startswith("cuda"):
        text += f", GPU {torch.cuda.get_device_name(torch.device(device))}"
    try:
        text += f", load average {os.getloadavg()[0]:.1f} at start"
    except OSError:
        pass
    return text


# ---- measuring ------------------------------------------------------------------------------------

def interleaved(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median of each rate function over ``repeats`` rounds, the order reversed every other round."""
    results: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names if r % 2 == 0 else names[::-1]):
            results[k].append(fns[k]())
    return {k: statistics.median(v) for k, v in results.items()}


def rate(fn: Callable[[], None], n: int, sync: Callable[[], None] = lambda: None) -> float:
    """Calls per second of ``fn`` over ``n`` calls (``sync`` waits for queued device work)."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return n / (time.perf_counter() - start)


# ---- env --------------------------------------------------------------------------------------------

def bench_env(game: str, repeats: int, n: int) -> tuple[list[Row], float]:
    from madqn.atari import AtariEnv

    env = AtariEnv(game, seed=0, max_cycles=10**9)
    env.reset()
    rng = np.random.default_rng(0)
    n_actions = env.action_space(env.possible_agents[0]).n
    emulator = env._emulator  # the same ALE, through the same C calls, without any screen work
    mapping = env._action_mapping

    def raw() -> None:
        emulator.joint_action[:] = mapping[rng.integers(n_actions, size=len(env.possible_agents))]
        for _ in range(env.action_repeat):
            emulator.act()
            if emulator.game_over():
                emulator.reset()

    def pipeline() -> None:
        if not env.agents:
            env.reset()
        env.step({a: int(rng.integers(n_actions)) for a in env.agents})

    rates = interleaved({"raw": lambda: rate(raw, n), "pipeline": lambda: rate(pipeline, n)}, repeats)
    env.close()
    rows = [Row("env: AtariEnv (DQN3.0 preprocessing once per step)", rates["pipeline"], "decisions/s",
                rates["raw"], ">= 0.8 x limit", rates["pipeline"] >= 0.8 * rates["raw"],
                f"limit: bare emulator, {env.action_repeat} frames/decision, no screen read")]
    return rows, rates["pipeline"]


def bench_pettingzoo_raw(game: str, n: int) -> Row:
    """Reference only: PettingZoo's own parallel env (RGB observations per agent), 4 steps per decision."""
    import pettingzoo

    from madqn.atari import rom_dir

    env = pettingzoo.make("parallel", "atari/" + "-v".join(game.rsplit("_v", 1)), max_cycles=10**9,
                          auto_rom_install_path=str(rom_dir()))
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def step() -> None:
        for _ in range(4):
            if not env.agents:
                env.reset()
            env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})

    value = rate(step, n)
    env.close()
    return Row("env: PettingZoo pong_v3 parallel env, 4 steps (reference)", value, "decisions/s",
               note="no preprocessing; what SuperSuit chains start from")


# ---- learner and replay ---------------------------------------------------------------------------

def _filled_trainer(sharing: str, device: str, n_fill: int = 2_000):
    """A Trainer on pong_v3 whose replay holds ``n_fill`` real steps (random play)."""
    from madqn.config import make_config
    from madqn.runner import Trainer

    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "replay_memory": 10_000,
                             "learn_start": 10**9, "steps": 10**9, "vector_env": "inline", "seed": 0})
    trainer = Trainer(cfg)
    while trainer.step < n_fill:
        trainer.env_step()
    return trainer


def bare_update(network, device, batch: int = 32):
    """The limit: a textbook PyTorch DQN update of ``network`` (float input already on the device)."""
    import torch
    import torch.nn.functional as F

    online = copy.deepcopy(network).to(device)
    target = copy.deepcopy(network).to(device)
    opt = torch.optim.RMSprop(online.parameters(), lr=2.5e-4, alpha=0.95, eps=0.01, centered=True)
    g = torch.Generator().manual_seed(0)
    shape = (batch, online.hist_len, online.frame_size, online.frame_size)
    s = (torch.rand(shape, generator=g) * 255).to(device)
    s2 = (torch.rand(shape, generator=g) * 255).to(device)
    a = torch.randint(0, online.n_actions, (batch,), generator=g).to(device)
    r = torch.rand(batch, generator=g).to(device)
    term = torch.zeros(batch, device=device)

    def update() -> None:
        with torch.no_grad():
            y = r + 0.99 * (1 - term) * target(s2).max(1).values
        q = online(s).gather(1, a[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, y, reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return update


def bench_learner(device: str, repeats: int, n: int) -> tuple[list[Row], float]:
    import torch

    trainer = _filled_trainer("independent", device)
    group = trainer.groups[0]
    trainer.groups = [group]  # time one learner's round
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    bare = bare_update(group.learner.online_network, device)
    rates = interleaved({"bare": lambda: rate(bare, n, sync), "madqn": lambda: rate(trainer.learn, n, sync)},
                        repeats)
    sample = 1e3 / rate(lambda: group.replay.sample(32), 200)
    trainer.close()
    rows = [Row(f"learner [{device}]: Trainer.learn (sample, convert, DQN3.0 update)", rates["madqn"], "updates/s",
                rates["bare"], ">= 0.95 x limit", rates["madqn"] >= 0.95 * rates["bare"],
                f"limit: bare PyTorch update, same net, batch 32, {torch.get_num_threads()} threads")]
    if device == "cpu":
        rows.append(Row("replay: sample(32) (one gather of 32x5 frames)", sample, "ms",
                        note=f"{100 * sample * rates['madqn'] / 1e3:.1f}% of an update"))
    return rows, rates["madqn"]


def bench_replay_bytes() -> Row:
    from madqn.replay import ReplayMemory

    mem = ReplayMemory(10_000, (84, 84), 4, n_streams=2)
    per = mem.nbytes / (10_000 * 2)
    return Row("replay: bytes per stored transition per agent", per, "B", 84 * 84, "<= 7,200 B", per <= 7200,
               "limit: one 84x84 uint8 frame; + action, reward, 2 flags")


# ---- acting ---------------------------------------------------------------------------------------

def bench_acting(repeats: int, n: int, num_envs: int) -> Row:
    from madqn.config import make_config
    from madqn.runner import Trainer

    trainers = {}
    for sharing in ("shared", "independent"):
        cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": "cpu", "replay_memory": 100,
                                 "num_envs": num_envs, "vector_env": "inline", "seed": 0})
        trainers[sharing] = Trainer(cfg)
    rng = np.random.default_rng(0)
    for t in trainers.values():
        for slot in t.slots.values():
            slot.history.frames[:] = rng.integers(0, 256, slot.history.frames.shape, dtype=np.uint8)
    slots = {k: list(t.slots.values()) for k, t in trainers.items()}
    rates = interleaved({k: (lambda k=k: rate(lambda: trainers[k].act(slots[k], 0.0), n)) for k in trainers},
                        repeats)
    for t in trainers.values():
        t.close()
    ms = {k: 1e3 / v for k, v in rates.items()}
    n_agents = len(slots["shared"]) // num_envs
    return Row(f"acting: independent nets, {n_agents * num_envs} agents (vmap over stacked params)",
               ms["independent"], "ms/step", ms["shared"], "<= 1.3 x limit", ms["independent"] <= 1.3 * ms["shared"],
               f"limit: shared net, same agents, one forward ({num_envs} env copies)")


# ---- end to end -----------------------------------------------------------------------------------

def e2e_trainer(sharing: str, device: str, overlap: bool, num_envs: int):
    from madqn.config import make_config
    from madqn.runner import Trainer

    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "overlap": overlap,
                             "num_envs": num_envs, "replay_memory": 20_000, "learn_start": 400,
                             "ep_start": 0.1, "ep_end": 0.1, "target_q": 10_000, "steps": 10**9, "seed": 0})
    trainer = Trainer(cfg)
    while trainer.step <= cfg.learn_start + 8:
        trainer.env_step()
    return trainer


def bench_e2e(device: str, repeats: int, n: int, num_envs: int, bounds: dict[str, float]) -> list[Row]:
    trainers = {(sharing, overlap): e2e_trainer(sharing, device, overlap, num_envs)
                for sharing in ("shared", "independent") for overlap in (False, True)}

    def measure(key) -> float:
        t = trainers[key]
        start_step, start = t.step, time.perf_counter()
        while t.step < start_step + n:
            t.env_step()
        if t.background is not None:
            t.background.drain()
        return (t.step - start_step) * len(t.agents) / (time.perf_counter() - start)

    rates = interleaved({k: (lambda k=k: measure(k)) for k in trainers}, repeats)
    for t in trainers.values():
        t.close()
    rows = []
    for (sharing, overlap), value in rates.items():
        bound = bounds[sharing]
        rows.append(Row(f"end-to-end [{device}]: {sharing}, {'overlap' if overlap else 'serial'}, "
                        f"{num_envs} env{'s' if num_envs > 1 else ''}", value, "agent steps/s", bound,
                        ">= 0.9 x bound and >= 110", value >= 0.9 * bound and value >= 1.3 * CLEANRL_STEPS_PER_S,
                        "bound: min(learner, env+acting) rows; CleanRL: 84"))
    return rows


class _RateProbe:
    """Hook: agent steps/s and learner updates/s between the first step past ``warmup`` and the end."""

    def __init__(self, warmup: int):
        self.warmup, self.start = warmup, None

    def on_start(self, trainer) -> None: ...
    def on_episode(self, trainer, record) -> None: ...
    def on_scalars(self, trainer, step, scalars) -> None: ...

    def on_step(self, trainer) -> None:
        if self.start is None and trainer.step >= self.warmup:
            self.start = (time.perf_counter(), trainer.step, sum(g.updates for g in trainer.groups))

    def on_end(self, trainer) -> None:
        t0, s0, u0 = self.start
        dt = time.perf_counter() - t0
        self.steps_per_s = (trainer.step - s0) / dt
        self.updates_per_s = (sum(g.updates for g in trainer.groups) - u0) / dt


def bench_distributed(device: str, n: int, actor_counts: tuple[int, ...] = (1, 2)) -> list[Row]:
    """pong_v3 training (learning on from step 400, epsilon 0.1, independent): the Ray backend with 1, 2 ...
    actors (one env copy each, this process learning) beside the local backend with as many env copies.
    Steps are counter steps (one per env copy step) x 2 agents, as in the end-to-end rows."""
    from madqn.config import make_config
    from madqn.distributed import DistributedTrainer
    from madqn.runner import Trainer

    rows = []
    warmup = 600
    for actors in actor_counts:
        rates = {}
        for backend in ("local", "ray"):
            cfg = make_config(None, {"env": "pong_v3", "device": device, "replay_memory": 20_000, "learn_start": 400,
                                     "ep_start": 0.1, "ep_end": 0.1, "steps": warmup + n, "seed": 0,
                                     "backend": backend, "actors": actors,
                                     "num_envs": 1 if backend == "ray" else actors, "valid_size": 0})
            probe = _RateProbe(warmup)
            trainer = (DistributedTrainer if backend == "ray" else Trainer)(cfg, hooks=[probe])
            try:
                trainer.run()
            finally:
                trainer.close()
            rates[backend] = (probe.steps_per_s * 2, probe.updates_per_s)
        (local_sps, local_ups), (ray_sps, ray_ups) = rates["local"], rates["ray"]
        rows.append(Row(f"distributed [{device}]: ray, {actors} actor{'s' if actors > 1 else ''}", ray_sps,
                        "agent steps/s", local_sps, note=f"limit: local backend, {actors} env cop"
                        f"{'ies' if actors > 1 else 'y'}; learner updates/s ray {ray_ups:,.1f}, local {local_ups:,.1f}"))
    return rows


def run_bench(args: argparse.Namespace) -> list[Row]:
    import torch

    from madqn.runner import resolve_device

    quick = args.quick
    repeats = 3 if quick else 5
    devices = ["cpu"]
    if args.device != "cpu" and torch.cuda.is_available():
        devices.append(str(resolve_device("cuda" if args.device == "auto" else args.device)))

    def say(msg: str) -> None:
        print(f"[bench] {msg}", flush=True)

    rows: list[Row] = []
    if args.only_distributed:
        say("distributed: ray backend with 1, 2 actors vs the local backend")
        return bench_distributed(devices[-1], 400 if quick else 1500)
    say("env pipeline vs bare emulator")
    env_rows, env_rate = bench_env("pong_v3", repeats, 300 if quick else 1000)
    rows += env_rows
    if not quick:
        rows.append(bench_pettingzoo_raw("pong_v3", 300))
    rows.append(bench_replay_bytes())
    say("acting: independent vs shared")
    rows.append(bench_acting(repeats, 100 if quick else 300, args.num_envs))
    act_ms_shared = rows[-1].limit
    act_ms_indep = rows[-1].value
    for device in devices:
        say(f"learner vs bare PyTorch update [{device}]")
        learner_rows, updates = bench_learner(device, repeats, 8 if quick else 20)
        rows += learner_rows
        # bounds in agent steps/s (decisions of all agents; 2 agents in pong, 1 counter step = 2 decisions):
        # learner: each learner does 1 update per update_freq (4) counter steps
        n_agents = 2
        act_ms = {"shared": act_ms_shared, "independent": act_ms_indep}
        env_bound = {k: n_agents / (1 / env_rate + act_ms[k] / 1e3 / args.num_envs) for k in act_ms}
        learner_bound = {"shared": updates * 4 * n_agents, "independent": updates * 4 * n_agents / 2}
        bounds = {k: min(env_bound[k], learner_bound[k]) for k in act_ms}
        for k in ("shared", "independent"):
            rows.append(Row(f"bound [{device}]: {k}", bounds[k], "agent steps/s", note=(
                f"learner {learner_bound[k]:,.0f}, env+acting {env_bound[k]:,.0f}")))
        say(f"end-to-end training runs [{device}]")
        rows += bench_e2e(device, repeats, 160 if quick else 400, args.num_envs, bounds)
    if args.distributed:
        say("distributed: ray backend with 1, 2 actors vs the local backend")
        rows += bench_distributed(devices[-1], 400 if quick else 1500)
    return rows


@command
def _bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure madqn's speed against the machine's limits (one table)",
                       description="Times the env pipeline, learner, replay, acting and end-to-end training, each "
                                   "next to its limit measured in the same run (medians of interleaved repeats).")
    p.add_argument("--quick", action="store_true", help="fewer repeats and shorter runs (about 3 minutes on 2 cores)")
    p.add_argument("--device", default="auto", help="auto (also CUDA rows when a GPU is present), cpu, cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--num-envs", type=int, default=1, help="env copies for the acting and end-to-end rows")
    p.add_argument("--distributed", action="store_true",
                   help="add the Ray backend rows (1 and 2 actors vs the local backend; needs madqn[ray])")
    p.add_argument("--only-distributed", action="store_true", help="only the distributed rows")
    p.add_argument("--out", help="also write the table (markdown, with the machine) to this file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from madqn.errors import MadqnError

    if args.num_envs < 1:
        raise MadqnError("--num-envs must be >= 1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    machine = machine_description(args.device)
    start = time.time()
    rows = run_bench(args)
    text = (f"Machine: {machine}\n\n{format_table(rows)}\n\n"
            f"(`madqn bench{' --quick' if args.quick else ''}`, {time.time() - start:.0f} s)\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0
