"""Environments by spec, all presented through one internal parallel-style interface.

Specs: a PettingZoo Atari name (``pong_v3``), an import path ``package.module:callable`` or a file
path ``path/to/file.py:callable``; the callable takes no arguments and returns a PettingZoo
``ParallelEnv`` or ``AECEnv``. See ``docs/architecture.md`` for the interface the runner expects.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from madqn.config import Config
from madqn.errors import MadqnError

SPEC_FORMS = "a PettingZoo Atari name (e.g. pong_v3), 'package.module:callable' or 'path/to/file.py:callable'"


def load_env_factory(spec: str) -> Callable[[], Any]:
    """Resolve ``module:callable`` or ``file.py:callable`` to the callable (not yet called)."""
    if ":" not in spec:
        raise MadqnError(f"cannot resolve env '{spec}': expected {SPEC_FORMS}")
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise MadqnError(f"cannot resolve env '{spec}': expected {SPEC_FORMS}")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise MadqnError(f"env file not found: {path} (from --env {spec})")
        name = f"madqn_user_env_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise MadqnError(f"env file {path} failed to import: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise MadqnError(f"cannot import module '{target}' (from --env {spec}): {e}") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise MadqnError(f"'{target}' has no attribute '{attr}' (from --env {spec})") from None
    if not callable(factory):
        raise MadqnError(f"'{spec}' is not callable; it must be a function returning a PettingZoo env")
    return factory


def make_env(spec: Any, config: Config, seed: int | None = None):
    """Build one environment in the internal interface from a spec string, a factory or an env."""
    from madqn import atari

    if isinstance(spec, str) and ":" not in spec:
        return atari.make_atari_env(
            spec,
            action_repeat=config.action_repeat,
            max_cycles=config.max_cycles,
            noop_max=config.random_starts,
            sticky_actions=config.sticky_actions,
            terminal_on_life_loss=config.terminal_on_life_loss,
            full_action_space=config.full_action_space,
            seed=seed,
        )
    if isinstance(spec, str):
        spec = load_env_factory(spec)
    env = spec() if callable(spec) and not _is_pettingzoo_env(spec) else spec
    if not _is_pettingzoo_env(env):
        raise MadqnError(f"the env factory returned {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv")
    return PettingZooEnv(env, config, seed=seed)


def _is_pettingzoo_env(obj: Any) -> bool:
    from pettingzoo import AECEnv, ParallelEnv

    return isinstance(obj, (ParallelEnv, AECEnv))


class PettingZooEnv:
    """Adapter: a user's PettingZoo ``ParallelEnv`` in the internal interface (observations as stored)."""

    def __init__(self, env: Any, config: Config, seed: int | None = None):
        from pettingzoo import AECEnv
        from pettingzoo.utils.conversions import aec_to_parallel

        if isinstance(env, AECEnv):
            env = aec_to_parallel(env)
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self._seed = seed
        self._spaces = {a: _stored_space(env.observation_space(a)) for a in self.possible_agents}

    @property
    def agents(self) -> list[str]:
        return list(self.env.agents)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        space = self.env.action_space(agent)
        if not isinstance(space, spaces.Discrete):
            raise MadqnError(f"agent {agent}: DQN needs a Discrete action space, got {space}")
        return space

    def reset(self, seed: int | None = None):
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        obs, infos = self.env.reset(seed=seed)
        return {a: self._convert(a, o) for a, o in obs.items()}, infos

    def step(self, actions: dict[str, int]):
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        return {a: self._convert(a, o) for a, o in obs.items()}, rewards, terms, truncs, infos

    def _convert(self, agent: str, obs: Any) -> np.ndarray:
        space = self._spaces[agent]
        return np.asarray(obs, dtype=space.dtype).reshape(space.shape)

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def _stored_space(space: Any) -> spaces.Box:
    if not isinstance(space, spaces.Box):
        raise MadqnError(f"observation space {space} is not supported (need a Box of pixels or a flat vector)")
    if space.dtype == np.uint8:
        return space
    shape = (int(np.prod(space.shape)),)
    return spaces.Box(-np.inf, np.inf, shape, np.float32)
