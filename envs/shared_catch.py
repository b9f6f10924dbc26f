"""Catch on ONE shared screen: every agent sees the same frame and must find its own paddle, as in Pong.

Agent i plays lane i of ``lanes`` side by side (``width`` x ``height`` cells each, separated by walls).
In every lane a ball falls one row per step while moving one column sideways, bouncing off the lane's
edges; the agent's paddle on the bottom row stays (action 0), moves left (1) or right (2). When the
ball reaches the paddle row the agent scores +1 if its paddle is under it and -1 otherwise, and a new
ball drops from a random column with a random sideways direction. After ``balls`` balls every agent
terminates.

Unlike ``envs/catch.py`` (each agent sees its own lane first), every agent receives the IDENTICAL
frame (the same array), and all lanes look alike: balls and paddles white, walls gray. So the only way
an agent can tell which paddle is its own is who it is: with one shared network, the agent indicator
(``agent_indicator = true``); with independent networks, each network learns its own lane. And a
single frame does not show which way a ball moves: ``hist_len = 4`` stacks let the network see it.

``optimal_moves(agent)`` gives, for the current state, the set of actions after which the agent can
still catch its ball (the ground truth that tests compare greedy actions against).

Train with ``madqn train --env envs/shared_catch.py:make_env --config configs/shared_catch.toml``.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

BALL_OR_PADDLE, WALL = 255, 110
MOVES = {0: 0, 1: -1, 2: 1}  # stay, left, right


class SharedCatchEnv(ParallelEnv):
    metadata = {"name": "shared_catch_v0", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(self, lanes: int = 2, width: int = 4, height: int = 9, balls: int = 5, cell: int = 4,
                 render_mode: str | None = None):
        if lanes < 1 or width < 2 or height < 2 or balls < 1 or cell < 1:
            raise ValueError("shared catch needs lanes >= 1, width >= 2, height >= 2, balls >= 1, cell >= 1")
        self.lanes, self.width, self.height, self.balls, self.cell = lanes, width, height, balls, cell
        self.render_mode = render_mode
        self.possible_agents = [f"catcher_{i}" for i in range(lanes)]
        self.agents: list[str] = []
        self._shape = (height * cell, (lanes * (width + 1) - 1) * cell)
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
        n = self.lanes
        self._paddle = self._rng.integers(0, self.width, n)
        self._ball_row = np.zeros(n, dtype=np.int64)
        self._ball_col = self._rng.integers(0, self.width, n)
        self._ball_dx = self._rng.choice([-1, 1], n)
        self._balls_left = np.full(n, self.balls)
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        rewards, terminations, truncations = {}, {}, {}
        for i, agent in enumerate(self.possible_agents):
            if agent not in self.agents:
                continue
            self._paddle[i] = min(max(self._paddle[i] + MOVES[int(actions[agent])], 0), self.width - 1)
            self._ball_row[i] += 1
            self._ball_col[i], self._ball_dx[i] = self._slide(self._ball_col[i], self._ball_dx[i])
            reward = 0.0
            if self._ball_row[i] == self.height - 1:
                reward = 1.0 if self._paddle[i] == self._ball_col[i] else -1.0
                self._balls_left[i] -= 1
                self._ball_row[i] = 0
                self._ball_col[i] = self._rng.integers(0, self.width)
                self._ball_dx[i] = self._rng.choice([-1, 1])
            rewards[agent] = reward
            terminations[agent] = bool(self._balls_left[i] == 0)
            truncations[agent] = False
        observations = self._observations()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terminations[a]]
        return observations, rewards, terminations, truncations, infos

    def optimal_moves(self, agent: str) -> set[int]:
        """Actions after which ``agent`` can still catch its current ball (all of them once it cannot)."""
        i = self.possible_agents.index(agent)
        steps_left = self.height - 1 - int(self._ball_row[i])  # moves until the ball lands, this one included
        col, dx = int(self._ball_col[i]), int(self._ball_dx[i])
        for _ in range(steps_left):
            col, dx = self._slide(col, dx)
        good = {a for a, m in MOVES.items()
                if abs(col - min(max(int(self._paddle[i]) + m, 0), self.width - 1)) <= steps_left - 1}
        return good or set(MOVES)

    def _slide(self, col: int, dx: int) -> tuple[int, int]:
        """One sideways ball move, bouncing off the lane's edges."""
        if not 0 <= col + dx < self.width:
            dx = -dx
        return col + dx, dx

    def _observations(self) -> dict[str, np.ndarray]:
        frame = self._screen()
        frame.flags.writeable = False  # one frame, shared by every agent
        return {a: frame for a in self.agents}

    def _screen(self) -> np.ndarray:
        w, c = self.width, self.cell
        grid = np.zeros((self.height, self.lanes * (w + 1) - 1), dtype=np.uint8)
        for i in range(self.lanes):
            x0 = i * (w + 1)
            if i > 0:
                grid[:, x0 - 1] = WALL
            if self._balls_left[i] > 0:
                grid[self._ball_row[i], x0 + self._ball_col[i]] = BALL_OR_PADDLE
            grid[self.height - 1, x0 + self._paddle[i]] = BALL_OR_PADDLE
        return np.repeat(np.repeat(grid, c, axis=0), c, axis=1)

    def render(self):
        """The shared screen as RGB (None before the first reset)."""
        return np.repeat(self._screen()[..., None], 3, axis=2) if hasattr(self, "_paddle") else None

    def close(self) -> None:
        pass


def make_env() -> SharedCatchEnv:
    """Two catchers on one 36x36 single-channel screen (lanes 4 wide, 9 high), fed to the conv net as it is
    (``preprocess = "none"``, configs/shared_catch.toml)."""
    return SharedCatchEnv()
