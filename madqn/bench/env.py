"""Env rows: ``AtariEnv.step`` against the bare emulator, and PettingZoo's own env as a reference."""

from __future__ import annotations

import numpy as np
import pettingzoo

from madqn.bench.measure import Section, Timings, compared, rate
from madqn.bench.table import Row
from madqn.envs.atari import AtariEnv, rom_dir


def env_section(game: str, n: int) -> Section:
    """AtariEnv.step decisions/s vs the bare emulator (``AtariEnv.emulate``: the same frames, no screen read)."""
    env = AtariEnv(game, seed=0, max_cycles=10**9)
    env.reset()
    rng = np.random.default_rng(0)
    n_actions = env.action_space(env.possible_agents[0]).n

    def raw() -> None:  # the same ALE, through the same C calls, without any screen work
        env.emulate(rng.integers(n_actions, size=len(env.possible_agents)))

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
