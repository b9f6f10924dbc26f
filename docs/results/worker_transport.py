"""Env worker copies: observations through shared memory vs pickled through the pipe (madqn.envs.vecenv).

Steps ``n`` worker copies together (``step_async`` to every copy, then ``step_wait`` from every copy, random
actions, a reset when a game ends) with each transport, the probes interleaved round by round
(madqn.bench.measure.interleaved), and prints env steps/s (one step of one copy = one env step) with the
per-round ratio shm / pipe, and the CPU time all processes (this one and the workers) spent per env step,
which a loaded machine disturbs far less than the wall-clock rate. Two envs: pong_v3 (the real emulator, 4 frames per step) and ``transport-only``,
a two-agent ParallelEnv that emulates nothing and hands each agent its own 84x84 uint8 frame, so that only
the transport's cost is left (stepped ``--steps`` x 10 per probe: its steps are that much shorter).

    PYTHONPATH=. python docs/results/worker_transport.py --copies 2 4 --steps 300 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from madqn.bench.measure import interleaved, rate
from madqn.config import make_config
from madqn.envs.vecenv import WorkerEnv

TRANSPORT_ONLY = textwrap.dedent('''
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    class Frames(ParallelEnv):
        metadata = {"name": "frames"}
        possible_agents = ["a", "b"]

        def __init__(self):
            self.agents = []
            self.frames = np.random.default_rng(0).integers(0, 256, (16, 84, 84), dtype=np.uint8)
            self.t = 0

        def observation_space(self, agent):
            return spaces.Box(0, 255, (84, 84), np.uint8)

        def action_space(self, agent):
            return spaces.Discrete(2)

        def _obs(self):
            self.t += 1
            return {a: self.frames[(self.t + k) % 16] for k, a in enumerate(self.agents)}

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            return self._obs(), {a: {} for a in self.agents}

        def step(self, actions):
            zero, false = {a: 0.0 for a in self.agents}, {a: False for a in self.agents}
            return self._obs(), zero, false, dict(false), {a: {} for a in self.agents}

    def make():
        return Frames()
''')


def stepper(envs: list[WorkerEnv], seed: int):
    rng = np.random.default_rng(seed)
    n_actions = {a: envs[0].action_space(a).n for a in envs[0].possible_agents}

    def step() -> None:
        for env in envs:
            if not env.agents:
                env.reset()
            env.step_async({a: int(rng.integers(n_actions[a])) for a in env.agents})
        for env in envs:
            env.step_wait()
    return step


def cpu_seconds(envs: list[WorkerEnv]) -> float:
    """CPU time (user + system) of this process and of the copies' worker processes so far."""
    total = time.process_time()
    for env in envs:
        fields = Path(f"/proc/{env._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=300, help="joint steps of all copies per probe and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frames_env.py"
        path.write_text(TRANSPORT_ONLY)
        cases = {"pong_v3": "pong_v3", "transport-only": f"{path}:make"}
        envs: dict[str, list[WorkerEnv]] = {}
        probes = {}
        cpu: dict[str, list[float]] = defaultdict(list)  # CPU seconds per env step, one per round

        def probe(key: str, step, n: int, steps: int):
            def run() -> float:
                start = cpu_seconds(envs[key])
                value = n * rate(step, steps)
                cpu[key].append((cpu_seconds(envs[key]) - start) / (n * steps))
                return value
            return run
        try:
            for label, spec in cases.items():
                cfg = make_config(None, {"env": spec, "vector_env": "process"})
                for n in args.copies:
                    for transport in ("pipe", "shm"):
                        key = f"{label}/{n}/{transport}"
                        envs[key] = [WorkerEnv(spec, cfg, cfg.seed + 1000 * i, index=i,
                                               shared_memory=transport == "shm") for i in range(n)]
                        for env in envs[key]:
                            env.reset()
                        step = stepper(envs[key], seed=n)
                        step()  # warm up
                        probes[key] = probe(key, step, n, args.steps * (10 if label == "transport-only" else 1))
            timings = interleaved(probes, args.rounds)
        finally:
            for group in envs.values():
                for env in group:
                    env.close()
    print(f"{'env':<15} {'copies':>6} | {'pipe steps/s':>12} {'shm steps/s':>11} {'shm/pipe':>8} {'rounds':>11} | "
          f"{'CPU us/step: pipe':>17} {'shm':>6} {'shm/pipe':>8}")
    for label in cases:
        for n in args.copies:
            pipe, shm = f"{label}/{n}/pipe", f"{label}/{n}/shm"
            ratios = timings.per_round(lambda r: r[shm] / r[pipe])
            cpu_pipe, cpu_shm = (statistics.median(cpu[k]) * 1e6 for k in (pipe, shm))
            print(f"{label:<15} {n:>6} | {timings[pipe]:>12.0f} {timings[shm]:>11.0f} {statistics.median(ratios):>7.2f}x "
                  f"{min(ratios):>5.2f}-{max(ratios):.2f}x | {cpu_pipe:>17.0f} {cpu_shm:>6.0f} {cpu_shm / cpu_pipe:>7.2f}x")


if __name__ == "__main__":
    main()
