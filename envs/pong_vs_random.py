"""pong_v3 with one seat played by a uniformly random player inside the env: one learner, a fixed opponent.

The learner's seat (``first_0`` by default, the right paddle) is the env's only agent; the other seat
presses a uniformly random action at every agent step. Frames, rewards, frame skip and the serve timer
are pong_v3's, through madqn's own Atari pipeline (``madqn.envs.atari``, the DQN 3.0 settings).

It is the multi-player game with the opponent of the multiplayer-ALE evaluation protocol held fixed,
so a run on it tells apart what self-play changes from what pong_v3 itself changes (docs/results.md).
It is also a template for training one seat of any PettingZoo game against a fixed policy.

    madqn train --env envs/pong_vs_random.py:make_env --config configs/pong_single_fast.toml

(the score of an episode is the learner's score against the random player: the number the
multiplayer-ALE protocol reports).
"""

from __future__ import annotations

import numpy as np
from pettingzoo import ParallelEnv

from madqn.envs.atari import make_atari_env


class VersusRandom(ParallelEnv):
    """One seat of a multi-player madqn Atari env as a one-agent ParallelEnv; the other seats act at random."""

    metadata = {"name": "pong_vs_random", "render_modes": ["rgb_array"]}

    def __init__(self, game: str = "pong_v3", learner: str = "first_0", **atari_kwargs) -> None:
        self.env = make_atari_env(game, **atari_kwargs)
        if learner not in self.env.possible_agents:
            raise ValueError(f"{game} has no seat {learner!r}; seats: {self.env.possible_agents}")
        self.learner = learner
        self.possible_agents = [learner]
        self.agents: list[str] = []
        self.render_mode = getattr(self.env, "render_mode", None)
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        # the opponent's actions are seeded with the episode: the same seed plays the same opponent
        self.rng = np.random.default_rng(None if seed is None else [seed, 1])
        self.agents = [self.learner]
        return {self.learner: observations[self.learner]}, {self.learner: infos.get(self.learner, {})}

    def step(self, actions):
        joint = {a: int(actions[a]) if a == self.learner else int(self.rng.integers(self.env.action_space(a).n))
                 for a in self.env.agents}
        observations, rewards, terminations, truncations, infos = self.env.step(joint)
        me = self.learner
        out = ({me: observations[me]}, {me: rewards[me]}, {me: terminations[me]}, {me: truncations[me]},
               {me: infos.get(me, {})})
        if terminations[me] or truncations[me]:
            self.agents = []
        return out

    def render(self):
        return self.env.render()

    def state(self):
        return self.env.state()

    def close(self):
        self.env.close()


def make_env() -> VersusRandom:
    """pong_v3's first_0 (right paddle) against a random second_0."""
    return VersusRandom("pong_v3", "first_0")
