"""Catch for several agents: a small pixel game that DQN3.0's conv stack learns on a CPU in minutes.

Every agent plays its own lane of ``width`` x ``height`` cells: a ball falls one row per step from
a random column of the top row, and the agent's paddle on the bottom row stays (action 0), moves
left (1) or right (2). When the ball reaches the paddle row the agent scores +1 if the paddle is
under it and -1 otherwise, and the next ball drops. After ``balls`` balls every agent terminates.

Observations are RGB images (uint8, ``height * cell`` x ``(lanes * (width + 1) - 1) * cell`` x 3,
or single-channel with ``rgb=False``): the agent's own lane on the left in white, the other agents'
lanes to its right in gray, walls in dark blue. madqn turns them into 84x84 luminance frames. Every agent sees its own task the same
way, so one shared network fits all of them.

Copy this file to start your own env; train on it with
``madqn train --env envs/catch.py:make_env --config configs/catch.toml``.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

OWN, OTHER, WALL = (255, 255, 255), (110, 110, 110), (0, 0, 80)


class CatchEnv(ParallelEnv):
    metadata = {"name": "catch_v0", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(self, n_agents: int = 2, width: int = 5, height: int = 8, balls: int = 5, cell: int = 6,
                 rgb: bool = True, render_mode: str | None = None):
        if n_agents < 1 or width < 2 or height < 2 or balls < 1 or cell < 1:
            raise ValueError("catch needs n_agents >= 1, width >= 2, height >= 2, balls >= 1, cell >= 1")
        self.width, self.height, self.balls, self.cell, self.rgb = width, height, balls, cell, rgb
        self.render_mode = render_mode
        self.possible_agents = [f"catcher_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        columns = n_agents * (width + 1) - 1
        self._shape = (height * cell, columns * cell, 3) if rgb else (height * cell, columns * cell)
        self._rng = np.random.default_rng()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0, 255, self._shape, np.uint8)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        n = len(self.possible_agents)
        self._paddle = self._rng.integers(0, self.width, n)
        self._ball_col = self._rng.integers(0, self.width, n)
        self._ball_row = np.zeros(n, dtype=np.int64)
        self._balls_left = np.full(n, self.balls)
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        rewards, terminations, truncations = {}, {}, {}
        for i, agent in enumerate(self.possible_agents):
            if agent not in self.agents:
                continue
            move = {0: 0, 1: -1, 2: 1}[int(actions[agent])]
            self._paddle[i] = min(max(self._paddle[i] + move, 0), self.width - 1)
            self._ball_row[i] += 1
            reward = 0.0
            if self._ball_row[i] == self.height - 1:
                reward = 1.0 if self._paddle[i] == self._ball_col[i] else -1.0
                self._balls_left[i] -= 1
                self._ball_row[i] = 0
                self._ball_col[i] = self._rng.integers(0, self.width)
            rewards[agent] = reward
            terminations[agent] = bool(self._balls_left[i] == 0)
            truncations[agent] = False
        observations = self._observations()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]]
        return observations, rewards, terminations, truncations, infos

    def _observations(self) -> dict[str, np.ndarray]:
        return {a: self._image(i) for i, a in enumerate(self.possible_agents) if a in self.agents}

    def _image(self, viewer: int) -> np.ndarray:
        """The screen as ``viewer`` sees it: its lane first (white), the others after it (gray)."""
        n, w, c = len(self.possible_agents), self.width, self.cell
        grid = np.zeros((self.height, n * (w + 1) - 1, 3), dtype=np.uint8)
        order = [viewer] + [i for i in range(n) if i != viewer]
        for slot, i in enumerate(order):
            x0 = slot * (w + 1)
            if slot > 0:
                grid[:, x0 - 1] = WALL
            color = OWN if slot == 0 else OTHER
            if self._balls_left[i] > 0:
                grid[self._ball_row[i], x0 + self._ball_col[i]] = color
            grid[self.height - 1, x0 + self._paddle[i]] = color
        if not self.rgb:
            grid = grid.max(axis=2)  # gray levels: own 255, others 110, walls 80
        return np.repeat(np.repeat(grid, c, axis=0), c, axis=1)

    def render(self):
        """The screen as catcher_0 sees it, the final one too once the episode has ended (videos show
        the last catch); None before the first reset."""
        return self._image(0) if hasattr(self, "_paddle") else None

    def close(self) -> None:
        pass


def make_env() -> CatchEnv:
    """Two catchers (the config in configs/catch.toml trains on this)."""
    return CatchEnv()


def make_env_3() -> CatchEnv:
    """Three catchers."""
    return CatchEnv(n_agents=3)


def make_small_env() -> CatchEnv:
    """Two catchers on 36x36 single-channel frames (lanes 4 wide, 9 high), fed to the conv net as they
    are (``preprocess = "none"``, configs/catch_small.toml): ~6x cheaper than 84x84 frames."""
    return CatchEnv(width=4, height=9, cell=4, rgb=False)
