"""Replay rows: bytes per stored transition, without and with prioritized replay."""

from __future__ import annotations

from madqn.bench.table import Row
from madqn.core.replay import ReplayMemory

def bench_replay_bytes() -> Row:
    mem = ReplayMemory(10_000, (84, 84), 4, n_streams=2)
    per = mem.nbytes / (10_000 * 2)
    return Row("replay: bytes per stored transition per agent", per, "B", 84 * 84, "<= 7,200 B", per <= 7200,
               "limit: one 84x84 uint8 frame; + action, reward, 2 flags")


def bench_prioritized_bytes() -> Row:
    plain = ReplayMemory(10_000, (84, 84), 4, n_streams=2)
    prio = ReplayMemory(10_000, (84, 84), 4, n_streams=2, prioritized=True)
    extra = (prio.nbytes - plain.nbytes) / (10_000 * 2)
    return Row("replay: extra bytes per transition with prioritized = true", extra, "B", 16.0, "<= 16 B",
               extra <= 16, f"sum-tree (float32 nodes); {prio.nbytes / 20_000:,.0f} B per transition in all")
