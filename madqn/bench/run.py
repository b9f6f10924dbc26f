"""One ``madqn bench`` run: every section's probes in one measurement window, then the rows."""

from __future__ import annotations

from typing import Any

import torch

from madqn.bench.acting import acting_section
from madqn.bench.distributed import bench_actor_scaling, bench_distributed
from madqn.bench.e2e import e2e_section
from madqn.bench.env import bench_pettingzoo_raw, env_section
from madqn.bench.extensions import extensions_section
from madqn.bench.learner import learner_section
from madqn.bench.measure import interleaved
from madqn.bench.peak import peak_section
from madqn.bench.replay import bench_prioritized_bytes, bench_replay_bytes
from madqn.bench.table import Row
from madqn.training.trainer import resolve_device


def run_bench(args: Any) -> list[Row]:
    """Every row of a ``madqn bench`` run. ``args``: its options (the parsed command line or any object
    with ``quick``, ``device``, ``num_envs``, ``distributed`` and ``only_distributed``).

    A new figure is a :class:`~madqn.bench.measure.Section` added to ``sections`` below: its probes join
    the one measurement window, its ``rows`` turn the medians into rows."""
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
    say("acting alone: process backend with 1, 2 ... actor processes")
    rows += bench_actor_scaling(1500 if quick else 4000)
    if args.distributed:
        say("distributed: ray backend with 1, 2 actors vs the local backend")
        rows += bench_distributed(devices[-1], 400 if quick else 1500)
    return rows
