"""GridRace: runners race to their own flags on a small grid and finish at different times.

A ParallelEnv with vector observations whose agents come and go: each runner starts on a random
cell of a ``size`` x ``size`` grid and must reach its own flag (another random cell). Every step
costs -0.05; reaching the flag gives +1 and terminates that runner while the others go on. With
``late_joiner`` the last runner is absent at reset and joins at step ``join_step``. After
``max_steps`` steps every runner still racing is truncated (not terminated).

Actions: 0 stay, 1 up, 2 down, 3 left, 4 right. Observation (float32): own x, y, flag x, y (in
[0, 1]) and the fraction of max_steps elapsed. ``heterogeneous=True`` gives runner_0 one extra
observation value (its distance to the flag) and no "stay" action: agents with different spaces,
which ``sharing = "independent"`` accepts and ``"shared"`` refuses.

Train on it with ``madqn train --env envs/gridrace.py:make_env --config configs/gridrace.toml``;
``make_aec_env`` is the same game as a PettingZoo AECEnv (agents move one after the other).
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

MOVES = {0: (0, 0), 1: (0, -1), 2: (0, 1), 3: (-1, 0), 4: (1, 0)}
STEP_COST = -0.05


class GridRaceEnv(ParallelEnv):
    metadata = {"name": "gridrace_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_agents: int = 3, size: int = 5, max_steps: int = 30, late_joiner: bool = True,
                 join_step: int = 3, heterogeneous: bool = False):
        if n_agents < 1 or size < 2 or max_steps < 1 or join_step < 1:
            raise ValueError("gridrace needs n_agents >= 1, size >= 2, max_steps >= 1, join_step >= 1")
        self.size, self.max_steps, self.join_step = size, max_steps, join_step
        self.late_joiner = late_joiner and n_agents > 1
        self.heterogeneous = heterogeneous
        self.render_mode = None
        self.possible_agents = [f"runner_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        n = 6 if (self.heterogeneous and agent == "runner_0") else 5
        return spaces.Box(0.0, 1.0, (n,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Discrete:
        if self.heterogeneous and agent == "runner_0":
            return spaces.Discrete(4, start=1)  # no "stay"
        return spaces.Discrete(5)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        n = len(self.possible_agents)
        self._pos = self._rng.integers(0, self.size, (n, 2))
        self._flag = self._rng.integers(0, self.size, (n, 2))
        for i in range(n):  # never start on the flag
            while (self._pos[i] == self._flag[i]).all():
                self._flag[i] = self._rng.integers(0, self.size, 2)
        self._t = 0
        self._joined = not self.late_joiner
        self.agents = list(self.possible_agents[:-1] if self.late_joiner else self.possible_agents)
        return self._observations(self.agents), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        self._t += 1
        acting = list(self.agents)
        rewards, terminations, truncations = {}, {}, {}
        time_up = self._t >= self.max_steps
        for agent in acting:
            i = self.possible_agents.index(agent)
            if not self.action_space(agent).contains(actions[agent]):
                raise ValueError(f"{agent}: action {actions[agent]} is not in {self.action_space(agent)}")
            dx, dy = MOVES[int(actions[agent])]
            self._pos[i] = np.clip(self._pos[i] + (dx, dy), 0, self.size - 1)
            arrived = bool((self._pos[i] == self._flag[i]).all())
            rewards[agent] = STEP_COST + (1.0 if arrived else 0.0)
            terminations[agent] = arrived
            truncations[agent] = time_up and not arrived
        self.agents = [a for a in acting if not (terminations[a] or truncations[a])]
        if not self._joined and self._t >= self.join_step and not time_up:
            self._joined = True
            late = self.possible_agents[-1]
            self.agents.append(late)
            rewards[late], terminations[late], truncations[late] = 0.0, False, False
        seen = acting + [a for a in self.agents if a not in acting]
        return self._observations(seen), rewards, terminations, truncations, {a: {} for a in seen}

    def _observations(self, agents: list[str]) -> dict[str, np.ndarray]:
        scale = self.size - 1
        out = {}
        for agent in agents:
            i = self.possible_agents.index(agent)
            values = [*(self._pos[i] / scale), *(self._flag[i] / scale), self._t / self.max_steps]
            if self.heterogeneous and agent == "runner_0":
                values.append(np.abs(self._pos[i] - self._flag[i]).sum() / (2 * scale))
            out[agent] = np.asarray(values, dtype=np.float32)
        return out

    def render(self):
        return None

    def close(self) -> None:
        pass


def make_env() -> GridRaceEnv:
    """Three runners, the third joining at step 3."""
    return GridRaceEnv()


def make_aec_env():
    """The same race as a PettingZoo AECEnv (turn by turn)."""
    return parallel_to_aec(GridRaceEnv())


def make_heterogeneous_env() -> GridRaceEnv:
    """runner_0 has a 6-value observation and 4 actions, the others 5 and 5."""
    return GridRaceEnv(heterogeneous=True)
