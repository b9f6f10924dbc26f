"""A tiny two-agent catch game with uint8 observations, for fast distributed-training tests.

A ball falls down a 5x5 grid from a random column; each agent moves its paddle on the bottom row
(0 left, 1 stay, 2 right). When the ball lands (5 agent steps) each agent gets +1 if its paddle is
under it, else -1, and the episode terminates. Observation: the grid flattened (25 uint8): ball 255,
own paddle 128, other paddle 64.
"""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

SIZE = 5


class TinyCatch(ParallelEnv):
    metadata = {"name": "tiny_catch"}
    possible_agents = ["left", "right"]

    def __init__(self):
        self.agents = []
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return spaces.Box(0, 255, (SIZE * SIZE,), np.uint8)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.ball = [0, int(self.rng.integers(SIZE))]
        self.paddles = {"left": 0, "right": SIZE - 1}
        return self._obs(), {a: {} for a in self.agents}

    def _obs(self):
        out = {}
        for a in self.agents:
            grid = np.zeros((SIZE, SIZE), np.uint8)
            for b, col in self.paddles.items():
                grid[SIZE - 1, col] = 128 if b == a else 64
            grid[self.ball[0], self.ball[1]] = 255
            out[a] = grid.ravel()
        return out

    def step(self, actions):
        for a, act in actions.items():
            self.paddles[a] = int(np.clip(self.paddles[a] + int(act) - 1, 0, SIZE - 1))
        self.ball[0] += 1
        landed = self.ball[0] == SIZE - 1
        obs = self._obs()
        rewards = {a: (1.0 if self.paddles[a] == self.ball[1] else -1.0) if landed else 0.0 for a in self.agents}
        terms = {a: landed for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if landed:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def make():
    return TinyCatch()


class HeterogeneousCatch(TinyCatch):
    """TinyCatch where "right" also sees its paddle column as one extra value (26 values, "left" 25):
    observation shapes differ, action counts are equal (MPE simple_adversary's kind of spaces)."""

    def observation_space(self, agent):
        return spaces.Box(0, 255, (SIZE * SIZE + (agent == "right"),), np.uint8)

    def _obs(self):
        out = super()._obs()
        if "right" in out:
            out["right"] = np.append(out["right"], np.uint8(self.paddles["right"]))
        return out


def make_heterogeneous():
    return HeterogeneousCatch()
