"""Beyond DQN3.0: the update time of each switchable extension against the DQN3.0 update, and a
prioritized draw against an update."""

from __future__ import annotations

import numpy as np

from madqn.bench.learner import _filled_trainer
from madqn.bench.measure import Section, Timings, _sync, compared, rate
from madqn.bench.table import Row
from madqn.training.trainer import Trainer


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
    trainer = Trainer(source.config.replace(device=device, **overrides))
    for src, dst in zip(source.groups, trainer.groups):
        for stream in range(src.replay.n_streams):
            for entry in src.replay.entries(stream):
                dst.replay.add(stream, *entry)
    return trainer


def _one_round(trainer) -> None:
    """One LearnerSet.learn of the first learner only (the rows time one learner's update)."""
    trainer.learners.learn(trainer.step, groups=trainer.groups[:1])


def extensions_section(device: str, n: int) -> Section:
    """One LearnerSet.learn with each extension on vs the DQN3.0 one (same replay contents, one learner),
    and a prioritized draw (sample + priority update) vs the DQN3.0 update."""
    sync = _sync(device)
    base = _filled_trainer("independent", device)
    variants = {name: _extension_trainer(base, o, device) for name, o in EXTENSIONS.items()}
    key = f"ext[{device}]"
    probes = {f"{key}/dqn3": lambda: rate(lambda: _one_round(base), n, sync)}
    probes.update({f"{key}/{name}": (lambda t=t: rate(lambda: _one_round(t), n, sync)) for name, t in variants.items()})
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
