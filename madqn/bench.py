"""``madqn bench``: every speed figure next to the limit it is measured against, in the same run.

Every timed figure is a *probe* (a function returning a rate). All probes of a bench run, the
components and the end-to-end training runs alike, are timed in ONE measurement window: round after
round, each probe once per round, the order reversed every other round. A ratio is taken inside
each round (a figure and its limit ran minutes apart at most, under the same load) and the table
reports the median over rounds, next to the median figures. When a row's per-round ratios disagree
by more than ``NOISY_SPREAD`` (or an end-to-end run beats the bound the component rows allow), the
machine was too noisy: the row shows "noisy" instead of a ratio and a pass/MISS.

- env: ``AtariEnv.step`` decisions/s vs the bare emulator (ALE's C ``actMulti``, ``action_repeat``
  frames per decision, no screen read);
- peak: a large fp32 and a large bf16 matmul, the arithmetic the core can do at best;
- learner: ``LearnerSet.learn`` (replay sampling, uint8 tensors, DQN3.0 targets, gradient injection,
  DQN3RMSprop, bookkeeping) in fp32 and bf16 vs a bare PyTorch fp32 update of the same network, batch
  and threads (float input ready, target forward, Huber loss, backward, ``torch.optim.RMSprop``), and
  its achieved GFLOP/s as a fraction of the peak; the bare update also in bf16 and channels_last;
- replay: allocated bytes per transition per agent vs one 84x84 frame, and minibatch sampling time;
- extensions beyond DQN3.0 (Double, dueling, n-step, prioritized, Adam, all five): the update time of
  each vs the DQN3.0 update, prioritized sampling vs an update, the sum-tree's bytes per transition;
- acting: time to choose the actions of all agents of one env step, independent vs shared, and
  shared under bf16 autocast;
- end-to-end: agent steps/s of a pong_v3 training run (learning on, epsilon 0.1) vs the bound
  computed from the rows above, fp32 and bf16.

The rows run on CPU and, when CUDA is present, the learner and end-to-end rows again on CUDA. A new
figure is a :class:`Section`: its probes join the window, its ``rows`` turn the medians into rows.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from madqn.cli import command

CLEANRL_STEPS_PER_S = 84.0  # CleanRL dqn_atari on Pong, 2-core CPU (issue 5), the peer to beat by 1.3x
NOISY_SPREAD = 0.3  # (max - min) / median of a row's per-round ratios above which it is not reported
BOUND_SLACK = 1.15  # an end-to-end run faster than this x the bound contradicts the component rows


@dataclass
class Row:
    name: str
    value: float
    unit: str
    limit: float | None = None  # the limit / baseline measured in the same run (same unit)
    target: str = ""  # e.g. ">= 0.8" on value/limit, or "<= 7200" on value
    passed: bool | None = None
    note: str = ""
    spread: float | None = None  # (max - min) / median of the per-round ratios (or values, without a limit)
    inconsistent: bool = False  # contradicts other rows of the same window (end-to-end above its bound)
    round_ratio: float | None = None  # median over rounds of value / limit measured in the same round

    @property
    def ratio(self) -> float | None:
        if self.round_ratio is not None:
            return self.round_ratio
        return None if not self.limit else self.value / self.limit

    @property
    def noisy(self) -> bool:
        return self.inconsistent or (self.spread is not None and self.spread > NOISY_SPREAD)


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def verdict(rows: list[Row]) -> str:
    """One line over the table: were the repeats steady enough for the ratios to mean anything?"""
    timed = [r for r in rows if r.spread is not None]
    noisy = [r for r in timed if r.noisy]
    if not noisy:
        worst = max((r.spread for r in timed), default=0.0)
        return (f"Repeats agreed: every timed row's per-round ratio within {100 * worst:.0f}% between rounds "
                f"(threshold {100 * NOISY_SPREAD:.0f}%), so the ratios are comparable.")
    contradictions = sum(r.inconsistent for r in noisy)
    extra = f"; {contradictions} end-to-end run(s) beat the bound of the component rows" if contradictions else ""
    return (f"The machine was too noisy for {len(noisy)} of {len(timed)} timed rows: their per-round ratios differed "
            f"by more than {100 * NOISY_SPREAD:.0f}%{extra}. Those rows say 'noisy' instead of a ratio; rerun on a "
            "quieter machine.")


def format_table(rows: list[Row]) -> str:
    header = ["row", "measured", "unit", "limit (same run)", "ratio", "target", "result", "note"]
    lines = [verdict(rows), "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if r.noisy:
            ratio = ""
            result = "noisy" + (" (above bound)" if r.inconsistent else f" ({100 * r.spread:.0f}%)")
        else:
            ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
            result = "" if r.passed is None else ("pass" if r.passed else "MISS")
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

@dataclass
class Timings:
    """Each probe's rate in every round of one measurement window."""

    rates: dict[str, list[float]]

    def median(self, key: str) -> float:
        return statistics.median(self.rates[key])

    __getitem__ = median  # timings["probe"]: its median rate

    def per_round(self, fn: Callable[[dict[str, float]], float]) -> list[float]:
        """``fn`` of each round's rates (a ratio of two probes, a bound from several)."""
        rounds = len(next(iter(self.rates.values())))
        return [fn({k: v[i] for k, v in self.rates.items()}) for i in range(rounds)]


def spread(values: list[float]) -> float:
    """(max - min) / median: how much the rounds disagreed."""
    return (max(values) - min(values)) / statistics.median(values)


def interleaved(fns: dict[str, Callable[[], float]], repeats: int) -> Timings:
    """Every rate function once per round, ``repeats`` rounds, the order reversed every other round."""
    results: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names if r % 2 == 0 else names[::-1]):
            results[k].append(fns[k]())
    return Timings(results)


def rate(fn: Callable[[], None], n: int, sync: Callable[[], None] = lambda: None) -> float:
    """Calls per second of ``fn`` over ``n`` calls (``sync`` waits for queued device work)."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return n / (time.perf_counter() - start)


def compared(t: Timings, name: str, value: str, limit: str, unit: str, *, target: str = "",
             check: Callable[[float], bool] | None = None, note: str = "", per: float = 1.0,
             inverse: bool = False) -> Row:
    """A row of probe ``value`` next to probe ``limit``: medians x ``per`` (``inverse``: 1000 / rate, in ms),
    the ratio per round and its median; ``check`` judges that median ratio."""
    conv = (lambda x: 1e3 / x) if inverse else (lambda x: x * per)
    ratios = t.per_round(lambda r: conv(r[value]) / conv(r[limit]))
    ratio = statistics.median(ratios)
    return Row(name, conv(t.median(value)), unit, conv(t.median(limit)), target,
               None if check is None else check(ratio), note, spread(ratios), round_ratio=ratio)


@dataclass
class Section:
    """Probes timed in the shared window, and the rows made from their medians once the window is over."""

    probes: dict[str, Callable[[], float]]
    rows: Callable[[Timings], list[Row]]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            c()


# ---- env --------------------------------------------------------------------------------------------

def env_section(game: str, n: int) -> Section:
    from madqn.envs.atari import AtariEnv

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

    def rows(t: Timings) -> list[Row]:
        return [compared(t, "env: AtariEnv (DQN3.0 preprocessing once per step)", "env/pipeline", "env/raw",
                         "decisions/s", target=">= 0.8 x limit", check=lambda ratio: ratio >= 0.8,
                         note=f"limit: bare emulator, {env.action_repeat} frames/decision, no screen read")]

    return Section({"env/raw": lambda: rate(raw, n), "env/pipeline": lambda: rate(pipeline, n)}, rows, [env.close])


def bench_pettingzoo_raw(game: str, n: int) -> Row:
    """Reference only: PettingZoo's own parallel env (RGB observations per agent), 4 steps per decision."""
    import pettingzoo

    from madqn.envs.atari import rom_dir

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


# ---- peak arithmetic --------------------------------------------------------------------------------

def peak_section(device: str, size: int, n: int) -> Section:
    """FLOP/s of a ``size`` x ``size`` x ``size`` matmul in fp32 and in bf16: what the core can do at best."""
    import torch

    sync = _sync(device)
    g = torch.Generator().manual_seed(0)
    a32, b32 = (torch.rand(size, size, generator=g).to(device) for _ in range(2))
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    flop = 2.0 * size**3

    def probe(a, b) -> Callable[[], float]:
        return lambda: flop * rate(lambda: torch.mm(a, b), n, sync)

    def rows(t: Timings) -> list[Row]:
        return [compared(t, f"peak [{device}]: bf16 matmul {size}^3", f"peak[{device}]/bf16", f"peak[{device}]/fp32",
                         "GFLOP/s", per=1e-9, note="limit: the same matmul in fp32")]

    return Section({f"peak[{device}]/fp32": probe(a32, b32), f"peak[{device}]/bf16": probe(a16, b16)}, rows)


def peak_gflops(t: Timings, device: str, precision: str) -> float:
    return t.median(f"peak[{device}]/{precision}") * 1e-9


# ---- learner and replay ---------------------------------------------------------------------------

def _sync(device: str) -> Callable[[], None]:
    import torch

    return (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)


def _filled_trainer(sharing: str, device: str, precision: str = "fp32", n_fill: int = 2_000):
    """A Trainer on pong_v3 whose replay holds ``n_fill`` real steps (random play)."""
    from madqn.config import make_config
    from madqn.training.trainer import Trainer

    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "replay_memory": 10_000,
                             "learn_start": 10**9, "steps": 10**9, "vector_env": "inline", "seed": 0,
                             "precision": precision, "num_threads": _threads()})
    trainer = Trainer(cfg)
    while trainer.step < n_fill:
        trainer.env_step()
    return trainer


def bare_update(network, device, batch: int = 32, precision: str = "fp32", channels_last: bool = False):
    """The limit: a textbook PyTorch DQN update of ``network`` (float input already on the device);
    ``precision = "bf16"``: its forwards under bf16 autocast; ``channels_last``: weights and input NHWC."""
    import torch
    import torch.nn.functional as F

    from madqn.core.learner import cuda_fp32_precision

    online = copy.deepcopy(network).to(device)
    target = copy.deepcopy(network).to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    online.to(memory_format=fmt)
    target.to(memory_format=fmt)
    opt = torch.optim.RMSprop(online.parameters(), lr=2.5e-4, alpha=0.95, eps=0.01, centered=True)
    g = torch.Generator().manual_seed(0)
    shape = (batch, online.hist_len, online.frame_size, online.frame_size)
    s = (torch.rand(shape, generator=g) * 255).to(device).contiguous(memory_format=fmt)
    s2 = (torch.rand(shape, generator=g) * 255).to(device).contiguous(memory_format=fmt)
    a = torch.randint(0, online.n_actions, (batch,), generator=g).to(device)
    r = torch.rand(batch, generator=g).to(device)
    term = torch.zeros(batch, device=device)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    on_cuda = torch.device(device).type == "cuda"

    def update() -> None:
        # on CUDA the same fp32 arithmetic as the Learner's: IEEE for fp32, TF32 beside bf16 autocast
        with cuda_fp32_precision("tf32" if precision == "bf16" else "ieee") if on_cuda else contextlib.nullcontext():
            with autocast:
                with torch.no_grad():
                    y = r + 0.99 * (1 - term) * target(s2).max(1).values.float()
                q = online(s).gather(1, a[:, None]).squeeze(1).float()
            loss = F.smooth_l1_loss(q, y, reduction="sum")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return update


def update_flops(learner, batch: int = 32) -> float:
    """FLOPs of one ``Learner.update`` on a batch of ``batch``, counted by PyTorch from the layer shapes
    (every matmul and convolution of the target forward, the online forward and the backward)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    net = learner.online_network
    learner = copy.deepcopy(learner)  # the update below must not move the benchmarked weights
    shape = (batch, net.hist_len, net.frame_size, net.frame_size)
    frames = torch.zeros(shape, dtype=torch.uint8, device=learner.device)
    zeros = torch.zeros(batch, device=learner.device)
    ids = torch.zeros(batch, dtype=torch.long, device=learner.device)
    with FlopCounterMode(display=False) as counter:
        learner.update(frames, ids, zeros, frames, zeros, agent_ids=ids)
    return float(counter.get_total_flops())


def learner_section(device: str, n: int) -> Section:
    """LearnerSet.learn in fp32 and bf16, and the bare PyTorch update in fp32 / bf16 / channels_last, one learner."""
    sync = _sync(device)
    trainers = {p: _filled_trainer("independent", device, p) for p in ("fp32", "bf16")}
    for t in trainers.values():
        t.learners.groups = t.learners.groups[:1]  # time one learner's round
    network = trainers["fp32"].groups[0].learner.online_network
    flops = update_flops(trainers["fp32"].groups[0].learner)
    key = f"learner[{device}]"
    probes = {}
    for precision in ("fp32", "bf16"):
        for cl in (False, True):
            bare = bare_update(network, device, precision=precision, channels_last=cl)
            probes[f"{key}/bare-{precision}{'-cl' if cl else ''}"] = lambda bare=bare: rate(bare, n, sync)
        probes[f"{key}/madqn-{precision}"] = lambda t=trainers[precision]: rate(
            lambda: t.learners.learn(t.step), n, sync)
    replay = trainers["fp32"].groups[0].replay
    sample_ms = 1e3 / rate(lambda: replay.sample(32), 200) if device == "cpu" else None
    threads = _threads()

    def rows(t: Timings) -> list[Row]:
        return learner_rows(t, device, flops, threads, sample_ms)

    return Section(probes, rows, [t.close for t in trainers.values()])


def learner_rows(t: Timings, device: str, flops: float, threads: int, sample_ms: float | None = None) -> list[Row]:
    """LearnerSet.learn per precision against the bare fp32 update, the achieved GFLOP/s against the matmul
    peak of the same precision (``flops`` per update), and the bare update in bf16 and channels_last."""
    key = f"learner[{device}]"
    out = [compared(t, f"learner [{device}]: LearnerSet.learn fp32 (sample, convert, DQN3.0 update)",
                    f"{key}/madqn-fp32", f"{key}/bare-fp32", "updates/s", target=">= 0.95 x limit",
                    check=lambda ratio: ratio >= 0.95,
                    note=f"limit: bare PyTorch fp32 update, same net, batch 32, {threads} threads"),
           compared(t, f"learner [{device}]: LearnerSet.learn bf16 (precision = \"bf16\")",
                    f"{key}/madqn-bf16", f"{key}/bare-fp32", "updates/s",
                    note="limit: the same bare PyTorch fp32 update")]
    for precision in ("fp32", "bf16"):
        peak = f"peak[{device}]/{precision}"
        row = compared(t, f"learner [{device}]: achieved arithmetic, {precision}", f"{key}/madqn-{precision}", peak,
                       "GFLOP/s", target=">= 0.5 x limit" if precision == "bf16" else "",
                       check=(lambda ratio: ratio >= 0.5) if precision == "bf16" else None,
                       note=f"{flops / 1e9:.2f} GFLOP per update x updates/s; limit: the {precision} matmul peak")
        row.value, row.limit = t.median(f"{key}/madqn-{precision}") * flops * 1e-9, peak_gflops(t, device, precision)
        row.round_ratio *= flops  # updates/s x FLOP per update over FLOP/s
        out.append(row)
    out += [compared(t, f"learner [{device}]: bare update, bf16 autocast", f"{key}/bare-bf16", f"{key}/bare-fp32",
                     "updates/s", note="limit: the bare fp32 update"),
            compared(t, f"learner [{device}]: bare update, fp32 channels_last", f"{key}/bare-fp32-cl",
                     f"{key}/bare-fp32", "updates/s", note="limit: the bare fp32 update (NCHW)"),
            compared(t, f"learner [{device}]: bare update, bf16 channels_last", f"{key}/bare-bf16-cl",
                     f"{key}/bare-bf16", "updates/s", note="limit: the bare bf16 update (NCHW)")]
    if sample_ms is not None:
        share = 100 * sample_ms * t.median(f"{key}/madqn-fp32") / 1e3
        out.append(Row("replay: sample(32) (one gather of 32x5 frames)", sample_ms, "ms",
                       note=f"{share:.1f}% of an fp32 update"))
    return out


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def bench_replay_bytes() -> Row:
    from madqn.core.replay import ReplayMemory

    mem = ReplayMemory(10_000, (84, 84), 4, n_streams=2)
    per = mem.nbytes / (10_000 * 2)
    return Row("replay: bytes per stored transition per agent", per, "B", 84 * 84, "<= 7,200 B", per <= 7200,
               "limit: one 84x84 uint8 frame; + action, reward, 2 flags")


# ---- beyond DQN3.0: cost of each switchable extension -------------------------------------------------

EXTENSIONS = {  # row name -> config overrides (each off by default)
    "double": {"double": True},
    "dueling": {"dueling": True},
    "n_step 3": {"n_step": 3},
    "prioritized": {"prioritized": True},
    "adam": {"optimizer": "adam"},
    "rainbow_lite (all five)": {"double": True, "dueling": True, "n_step": 3, "prioritized": True, "optimizer": "adam"},
}


def _extension_trainer(source, overrides: dict, device: str):
    """A Trainer with ``overrides`` whose replay holds the same entries as ``source``'s (no learning yet)."""
    from madqn.training.trainer import Trainer

    trainer = Trainer(source.config.replace(device=device, **overrides))
    for src, dst in zip(source.groups, trainer.groups):
        for stream in range(src.replay.n_streams):
            for n in range(int(src.replay.written[stream])):
                pos = n % src.replay.capacity
                r = src.replay
                dst.replay.add(stream, r.frames[stream, pos], int(r.actions[stream, pos]), float(r.rewards[stream, pos]),
                               bool(r.terminal[stream, pos]), bool(r.episode_end[stream, pos]))
    trainer.learners.groups = trainer.learners.groups[:1]  # time one learner's round
    return trainer


def extensions_section(device: str, n: int) -> Section:
    """One LearnerSet.learn with each extension on vs the DQN3.0 one (same replay contents, one learner),
    and a prioritized draw (sample + priority update) vs the DQN3.0 update."""
    sync = _sync(device)
    base = _filled_trainer("independent", device)
    base.learners.groups = base.learners.groups[:1]
    variants = {name: _extension_trainer(base, o, device) for name, o in EXTENSIONS.items()}
    key = f"ext[{device}]"
    probes = {f"{key}/dqn3": lambda: rate(lambda: base.learners.learn(base.step), n, sync)}
    probes.update({f"{key}/{name}": (lambda t=t: rate(lambda: t.learners.learn(t.step), n, sync))
                   for name, t in variants.items()})
    replay = variants["prioritized"].groups[0].replay
    rng = np.random.default_rng(0)

    def prioritized_draw() -> None:
        batch = replay.sample(32, beta=0.5)
        replay.update_priorities(batch.streams, batch.indices, rng.random(32))

    probes[f"{key}/prioritized-draw"] = lambda: rate(prioritized_draw, 20 * n)
    uniform_ms = 1e3 / rate(lambda: base.groups[0].replay.sample(32), 200)

    def rows(t: Timings) -> list[Row]:
        out = []
        for name in EXTENSIONS:
            expect = " (one more forward of the four an update costs: ~1.25)" if name == "double" else ""
            out.append(compared(t, f"extension [{device}]: {name}, one update", f"{key}/{name}", f"{key}/dqn3", "ms",
                                inverse=True, note=f"limit: the DQN3.0 update, same replay{expect}"))
        out.append(compared(t, f"extension [{device}]: prioritized sample(32) + priority update",
                            f"{key}/prioritized-draw", f"{key}/dqn3", "ms", inverse=True, target="< 0.05 x limit",
                            check=lambda ratio: ratio < 0.05,
                            note=f"limit: a DQN3.0 update; a uniform sample(32) takes {uniform_ms:.3g} ms"))
        return out

    return Section(probes, rows, [t.close for t in (base, *variants.values())])


def bench_prioritized_bytes() -> Row:
    from madqn.core.replay import ReplayMemory

    plain = ReplayMemory(10_000, (84, 84), 4, n_streams=2)
    prio = ReplayMemory(10_000, (84, 84), 4, n_streams=2, prioritized=True)
    extra = (prio.nbytes - plain.nbytes) / (10_000 * 2)
    return Row("replay: extra bytes per transition with prioritized = true", extra, "B", 16.0, "<= 16 B",
               extra <= 16, f"sum-tree (float32 nodes); {prio.nbytes / 20_000:,.0f} B per transition in all")


# ---- acting ---------------------------------------------------------------------------------------

def acting_section(n: int, num_envs: int) -> Section:
    """ms per env step to choose every agent's action: independent vs shared nets, and shared under bf16."""
    import torch

    from madqn.config import make_config
    from madqn.training.trainer import Trainer

    trainers = {}
    for sharing in ("shared", "independent"):
        cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": "cpu", "replay_memory": 100,
                                 "num_envs": num_envs, "vector_env": "inline", "seed": 0,
                                 "num_threads": _threads()})
        trainers[sharing] = Trainer(cfg)
    rng = np.random.default_rng(0)
    for t in trainers.values():
        for slot in t.acting.slots.values():
            slot.history.frames[:] = rng.integers(0, 256, slot.history.frames.shape, dtype=np.uint8)
    slots = {k: list(t.acting.slots.values()) for k, t in trainers.items()}

    def act(sharing: str, bf16: bool = False) -> Callable[[], float]:
        def one() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                trainers[sharing].acting.act(slots[sharing], 0.0)
        return lambda: rate(one, n)

    n_agents = len(slots["shared"]) // num_envs
    agents = n_agents * num_envs

    def rows(t: Timings) -> list[Row]:
        return [compared(t, f"acting: independent nets, {agents} agents (vmap over stacked params)",
                         "acting/independent", "acting/shared", "ms/step", target="<= 1.3 x limit",
                         check=lambda ratio: ratio <= 1.3, inverse=True,
                         note=f"limit: shared net, same agents, one forward ({num_envs} env copies)"),
                compared(t, f"acting: shared net under bf16 autocast, {agents} agents", "acting/shared-bf16",
                         "acting/shared", "ms/step", inverse=True, note="limit: the same in fp32")]

    probes = {"acting/shared": act("shared"), "acting/independent": act("independent"),
              "acting/shared-bf16": act("shared", bf16=True)}
    return Section(probes, rows, [t.close for t in trainers.values()])


# ---- end to end -----------------------------------------------------------------------------------

E2E_VARIANTS = (("fp32", False), ("fp32", True), ("bf16", False))  # (precision, overlap)


def e2e_trainer(sharing: str, device: str, overlap: bool, num_envs: int, precision: str = "fp32"):
    from madqn.config import make_config
    from madqn.training.trainer import Trainer

    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "overlap": overlap,
                             "num_envs": num_envs, "replay_memory": 20_000, "learn_start": 400,
                             "ep_start": 0.1, "ep_end": 0.1, "target_q": 10_000, "steps": 10**9, "seed": 0,
                             "precision": precision, "num_threads": _threads()})
    trainer = Trainer(cfg)
    while trainer.step <= cfg.learn_start + 8:
        trainer.env_step()
    return trainer


def bounds(env_rate: float, act_ms: dict[str, float], updates: float, num_envs: int,
           n_agents: int = 2, update_freq: int = 4) -> dict[str, tuple[float, float, float]]:
    """Agent steps/s each sharing mode could reach: ``(bound, learner bound, env+acting bound)``.

    Agent steps count the decisions of all agents (``n_agents`` per counter step). The learner bound:
    every learner does 1 update per ``update_freq`` counter steps, so the shared learner allows
    updates/s x update_freq x n_agents agent steps/s and each of the n_agents independent learners
    (run one after another) 1/n_agents of that. Env+acting: n_agents decisions per env step, one env
    step and 1/num_envs of a batched action choice at a time.
    """
    out = {}
    for sharing, ms in act_ms.items():
        env_acting = n_agents / (1 / env_rate + ms / 1e3 / num_envs)
        learner = updates * update_freq * n_agents / (1 if sharing == "shared" else n_agents)
        out[sharing] = (min(env_acting, learner), learner, env_acting)
    return out


def e2e_section(device: str, n: int, num_envs: int) -> Section:
    trainers = {(sharing, precision, overlap): e2e_trainer(sharing, device, overlap, num_envs, precision)
                for sharing in ("shared", "independent") for precision, overlap in E2E_VARIANTS}

    def measure(key) -> float:
        t = trainers[key]
        start_step, start = t.step, time.perf_counter()
        while t.step < start_step + n:
            t.env_step()
        if t.background is not None:
            t.background.drain()
        return (t.step - start_step) * len(t.agents) / (time.perf_counter() - start)

    probes = {e2e_key(device, *k): (lambda k=k: measure(k)) for k in trainers}

    def rows(t: Timings) -> list[Row]:
        return e2e_rows(t, device, num_envs)

    return Section(probes, rows, [t.close for t in trainers.values()])


def e2e_key(device: str, sharing: str, precision: str, overlap: bool) -> str:
    return f"e2e[{device}]/{sharing}/{precision}/{'overlap' if overlap else 'serial'}"


def e2e_rows(t: Timings, device: str, num_envs: int) -> list[Row]:
    """The bound rows (from the env, acting and learner rates) and the end-to-end rows against them, each
    bound taken per round; a run above ``BOUND_SLACK`` x its bound contradicts the component rows and is
    marked noisy."""
    def bound_in(r: dict[str, float], precision: str, sharing: str) -> tuple[float, float, float]:
        act = {k: 1e3 / r[f"acting/{k}"] for k in ("shared", "independent")}
        return bounds(r["env/pipeline"], act, r[f"learner[{device}]/madqn-{precision}"], num_envs)[sharing]

    rows = []
    for precision in ("fp32", "bf16"):
        for sharing in ("shared", "independent"):
            per_round = t.per_round(lambda r: bound_in(r, precision, sharing)[0])
            learner = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[1]))
            env_acting = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[2]))
            rows.append(Row(f"bound [{device}]: {sharing}, {precision}", statistics.median(per_round), "agent steps/s",
                            note=f"learner {learner:,.0f}, env+acting {env_acting:,.0f}", spread=spread(per_round)))
        for sharing in ("shared", "independent"):
            for p, overlap in E2E_VARIANTS:
                if p != precision:
                    continue
                key = e2e_key(device, sharing, precision, overlap)
                ratios = t.per_round(lambda r: r[key] / bound_in(r, precision, sharing)[0])
                ratio, value = statistics.median(ratios), t.median(key)
                bound = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[0]))
                rows.append(Row(f"end-to-end [{device}]: {sharing}, {precision}, "
                                f"{'overlap' if overlap else 'serial'}, {num_envs} env{'s' if num_envs > 1 else ''}",
                                value, "agent steps/s", bound, ">= 0.9 x bound and >= 110",
                                ratio >= 0.9 and value >= 1.3 * CLEANRL_STEPS_PER_S,
                                "bound: min(learner, env+acting) rows; CleanRL: 84", spread(ratios),
                                inconsistent=ratio > BOUND_SLACK, round_ratio=ratio))
    for sharing in ("shared", "independent"):
        keys = [e2e_key(device, sharing, p, False) for p in ("bf16", "fp32")]
        rows.append(compared(t, f"end-to-end [{device}]: {sharing}, bf16 vs fp32 (serial)", *keys, "agent steps/s",
                             target=">= 1.5 x limit", check=lambda ratio: ratio >= 1.5,
                             note="limit: the fp32 serial run of the same window"))
    return rows


# ---- distributed ----------------------------------------------------------------------------------

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
    from madqn.training.distributed import DistributedTrainer
    from madqn.training.trainer import Trainer

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

    from madqn.training.trainer import resolve_device

    quick = args.quick
    repeats = 3 if quick else 5
    devices = ["cpu"]
    if args.device != "cpu" and torch.cuda.is_available():
        devices.append(str(resolve_device("cuda" if args.device == "auto" else args.device)))

    def say(msg: str) -> None:
        print(f"[bench] {msg}", flush=True)

    if args.only_distributed:
        say("distributed: ray backend with 1, 2 actors vs the local backend")
        return bench_distributed(devices[-1], 400 if quick else 1500)
    say("setting up: env, acting, peak matmuls, learners, end-to-end trainers")
    sections = [env_section("pong_v3", 300 if quick else 1000), acting_section(100 if quick else 300, args.num_envs)]
    for device in devices:
        sections += [peak_section(device, 1024 if device == "cpu" else 8192, 4 if quick else 10),
                     learner_section(device, 8 if quick else 20),
                     extensions_section(device, 8 if quick else 20),  # beyond DQN3.0
                     e2e_section(device, 160 if quick else 400, args.num_envs)]
    probes = {k: fn for s in sections for k, fn in s.probes.items()}
    say(f"one measurement window: {len(probes)} probes, {repeats} interleaved rounds")
    try:
        timings = interleaved(probes, repeats)
    finally:
        for s in sections:
            s.close()
    rows = [*sections[0].rows(timings), bench_replay_bytes(), bench_prioritized_bytes()]
    if not quick:
        rows.append(bench_pettingzoo_raw("pong_v3", 300))
    for s in sections[1:]:
        rows += s.rows(timings)
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
