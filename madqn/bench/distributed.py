"""Distributed rows: the Ray backend with 1, 2 ... actors against the local backend with as many env copies."""

from __future__ import annotations

import os
import time

from madqn.bench.table import Row
from madqn.config import make_config
from madqn.training.distributed import DistributedTrainer
from madqn.training.trainer import Hook, Trainer


class _RateProbe(Hook):
    """Agent steps/s and learner updates/s between the first step past ``warmup`` and the end."""

    def __init__(self, warmup: int):
        self.warmup, self.start = warmup, None

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


def bench_actor_scaling(n: int, actor_counts: tuple[int, ...] | None = None) -> list[Row]:
    """Acting alone (no learning, epsilon 0.05: a greedy forward every step) with the process backend and 1, 2 ...
    actor processes, up to the machine's cores; each count against N x the one-actor rate. Agent steps/s as in
    the other rows (counter steps x 2 agents)."""
    if actor_counts is None:
        actor_counts = tuple(range(1, min(4, os.cpu_count() or 1) + 1))
    warmup = 300
    rates = {}
    for actors in actor_counts:
        cfg = make_config(None, {"env": "pong_v3", "sharing": "shared", "device": "cpu", "replay_memory": 20_000,
                                 "learn_start": 10**9, "ep_start": 0.05, "ep_end": 0.05, "steps": warmup + n,
                                 "seed": 0, "backend": "process", "actors": actors, "valid_size": 0,
                                 "num_threads": 1})
        probe = _RateProbe(warmup)
        trainer = DistributedTrainer(cfg, hooks=[probe], pool="process")
        try:
            trainer.run()
        finally:
            trainer.close()
        rates[actors] = probe.steps_per_s * 2
    return actor_scaling_rows(rates)


def actor_scaling_rows(rates: dict[int, float]) -> list[Row]:
    """One row per actor count: its acting rate against N x the one-actor rate (target >= 0.7 x)."""
    one = rates[1]
    return [Row(f"acting alone [cpu]: process backend, {n} actor{'s' if n > 1 else ''}", rate, "agent steps/s",
                n * one, ">= 0.7 x limit" if n > 1 else "", rate >= 0.7 * n * one if n > 1 else None,
                f"limit: {n} x the one-actor rate; no learning, epsilon 0.05")
            for n, rate in sorted(rates.items())]
