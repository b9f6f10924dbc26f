"""Repeated rock-paper-scissors: a two-player game that is zero-sum and symmetric by construction.

Each step both players pick rock (0), paper (1) or scissors (2); the winner of the round gets +1,
the loser -1, a tie 0. After ``rounds`` rounds the episode terminates. Observation: the opponent's
previous move, one-hot (float32, zeros at the start). Swapping the seats swaps the scores exactly, so
random players have an expected score of 0 in either seat: the reference for the random baseline.
"""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class RockPaperScissors(ParallelEnv):
    metadata = {"name": "rps_v0"}
    possible_agents = ["player_0", "player_1"]

    def __init__(self, rounds: int = 10):
        self.rounds = rounds
        self.agents = []

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        zeros = np.zeros(3, np.float32)
        return {a: zeros.copy() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        a, b = int(actions["player_0"]), int(actions["player_1"])
        r = 0.0 if a == b else (1.0 if (a - b) % 3 == 1 else -1.0)  # paper beats rock, ...
        self.t += 1
        done = self.t >= self.rounds
        obs = {"player_0": np.eye(3, dtype=np.float32)[b], "player_1": np.eye(3, dtype=np.float32)[a]}
        rewards = {"player_0": r, "player_1": -r}
        terms = {x: done for x in self.possible_agents}
        truncs = {x: False for x in self.possible_agents}
        infos = {x: {} for x in self.possible_agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def make_env():
    return RockPaperScissors()
