"""pong_v3 with the left player's screen mirrored: each seat sees its own paddle on the right.

In pong_v3 both seats receive the same frame, and the game is zero-sum: at every state first_0's return
is minus second_0's. A network shared by the two seats is therefore asked for opposite values on the
same picture, told apart only by the agent indicator; until it learns to make its features depend on
the indicator, the two seats' gradients cancel and the best it can do is one value per seat for every
frame (docs/results.md, "Fewer updates"). Mirroring second_0's frame left to right removes that
conflict: a ball moving towards the player's own paddle looks the same from both seats, and the values
to learn agree instead of cancel. The actions need no change: in pong_v3 RIGHT moves either paddle up
and LEFT moves it down, and a left-right mirror keeps up and down.

Everything else is pong_v3 through madqn's own Atari pipeline (``madqn.envs.atari``): frames, frame skip,
rewards, the serve timer, both seats learning in self-play. The score of a seat is its pong_v3 score.

    madqn train --env envs/pong_mirrored.py:make_env --config configs/pong_fast.toml
"""

from __future__ import annotations

import numpy as np
from pettingzoo import ParallelEnv

from madqn.envs.atari import make_atari_env


class MirroredSeats(ParallelEnv):
    """A madqn Atari env whose ``mirrored`` seats observe the frame flipped left to right (last axis)."""

    metadata = {"name": "pong_mirrored", "render_modes": ["rgb_array"]}

    def __init__(self, game: str = "pong_v3", mirrored: tuple[str, ...] = ("second_0",), **atari_kwargs) -> None:
        self.env = make_atari_env(game, **atari_kwargs)
        unknown = [a for a in mirrored if a not in self.env.possible_agents]
        if unknown:
            raise ValueError(f"{game} has no seat {unknown}; seats: {self.env.possible_agents}")
        self.mirrored = frozenset(mirrored)
        self.possible_agents = list(self.env.possible_agents)
        self.render_mode = getattr(self.env, "render_mode", None)

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def _view(self, observations: dict) -> dict:
        return {a: np.ascontiguousarray(o[..., ::-1]) if a in self.mirrored else o for a, o in observations.items()}

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._view(observations), infos

    def step(self, actions):
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        return self._view(observations), rewards, terminations, truncations, infos

    def render(self):
        return self.env.render()

    def state(self):
        return self.env.state()

    def close(self):
        self.env.close()


def make_env() -> MirroredSeats:
    """pong_v3 in self-play, second_0 (the left paddle) seeing the screen mirrored."""
    return MirroredSeats("pong_v3", ("second_0",))
