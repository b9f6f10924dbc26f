"""Acting rows: the time to choose every agent's action of one env step, independent vs shared networks,
and shared under bf16 autocast."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from madqn.bench.measure import Section, Timings, _threads, compared, rate
from madqn.bench.table import Row
from madqn.config import make_config
from madqn.training.trainer import Trainer


def acting_section(n: int, num_envs: int) -> Section:
    """ms per env step to choose every agent's action: independent vs shared nets, and shared under bf16."""
    trainers = {}
    for sharing in ("shared", "independent"):
        cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": "cpu", "replay_memory": 100,
                                 "num_envs": num_envs, "vector_env": "inline", "seed": 0,
                                 "num_threads": _threads()})
        trainers[sharing] = Trainer(cfg)
    rng = np.random.default_rng(0)
    for t in trainers.values():
        for slot in t.acting.slots.values():  # a full history of random frames: the forward of a game in play
            for _ in range(t.config.hist_len):
                slot.history.push(rng.integers(0, 256, slot.history.frames.shape[1:], dtype=np.uint8))
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
