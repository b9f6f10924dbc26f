"""Environments by spec, all presented through one internal parallel-style interface.

Specs: a PettingZoo Atari name (``pong_v3``), a single-player Atari game by its Gymnasium id
(``ALE/Pong-v5``, ``gym:PongNoFrameskip-v4``: a one-agent env, ``madqn.envs.atari.SingleAtariEnv``), an
import path ``package.module:callable`` or a file path ``path/to/file.py:callable``; the callable takes no arguments and returns a PettingZoo
``ParallelEnv`` or ``AECEnv``. ``make_env`` also takes such a callable or an env directly.

Adapters (``ParallelAdapter``, ``AECAdapter``) give every user env the interface the runner expects
(``docs/architecture.md``): observations converted by each agent's :class:`ObservationSpec` (images
to DQN3.0's 84x84 luminance frames, anything else to a flat float32 vector) and legal-action masks
in ``infos[agent]["action_mask"]``. AEC envs are played turn by turn: ``observations`` holds only
the agent whose turn it is (and the final observation of every agent that finished meanwhile), and
each agent's reward is everything it received since its previous move.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from madqn.config import Config
from madqn.envs import atari
from madqn.envs.atari import FRAME_SHAPE, area_resize_84, luminance
from madqn.errors import MadqnError

SPEC_FORMS = ("a PettingZoo Atari name (e.g. pong_v3), a single-player Atari id (ALE/Pong-v5, gym:PongNoFrameskip-v4), "
              "'package.module:callable' or 'path/to/file.py:callable'")

IMAGE_MIN_SIDE = 8  # uint8 arrays with both spatial sides >= this are images under network = "auto"

_FACTORIES: dict[tuple[str, str], Callable[[], Any]] = {}  # file specs, so num_envs copies import once


# ---- specs -------------------------------------------------------------------------------------

def load_env_factory(spec: str) -> Callable[[], Any]:
    """Resolve ``module:callable`` or ``file.py:callable`` to the callable (not yet called)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        hint = " (missing ':callable' after the file name)" if spec.endswith(".py") else ""
        raise MadqnError(f"cannot resolve env '{spec}'{hint}: expected {SPEC_FORMS}")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise MadqnError(f"env file not found: {path} (from env '{spec}'; expected {SPEC_FORMS})")
        key = (str(path.resolve()), attr)
        if key in _FACTORIES:
            return _FACTORIES[key]
        name = f"madqn_user_env_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise MadqnError(f"env file {path} failed to import: {type(e).__name__}: {e}") from e
    else:
        key = None
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise MadqnError(f"cannot import module '{target}' (from env '{spec}'): {e}") from None
        except Exception as e:
            raise MadqnError(f"module '{target}' failed to import: {type(e).__name__}: {e}") from e
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise MadqnError(f"'{target}' has no attribute '{attr}' (from env '{spec}')") from None
    if not callable(factory):
        raise MadqnError(f"'{spec}' is not callable; it must be a function returning a PettingZoo env")
    if key is not None:
        _FACTORIES[key] = factory
    return factory


def make_env(spec: Any, config: Config, seed: int | None = None, *, convert: bool = True):
    """Build one environment in the internal interface from a spec string, a factory or an env.

    ``convert=False`` keeps the env's raw observations (masks still go to ``infos``): what
    :class:`madqn.evaluation.agents.Agents` and :func:`madqn.evaluation.evaluate` consume.
    """
    if isinstance(spec, str) and (":" not in spec or spec.startswith(atari.GYM_PREFIX)):
        if spec.endswith(".py"):
            load_env_factory(spec)  # raises the "missing ':callable'" error
        try:
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
        except atari.UnknownGameError as e:
            raise MadqnError(f"cannot resolve env '{spec}': {e}. Custom envs: 'package.module:callable' or "
                             "'path/to/file.py:callable'") from None
    if isinstance(spec, str):
        spec = load_env_factory(spec)
    return adapt(instantiate(spec), config, seed=seed, convert=convert)


def instantiate(spec: Any) -> Any:
    """A PettingZoo env from an env or a zero-argument factory (errors as one line)."""
    if is_pettingzoo_env(spec):
        return spec
    if not callable(spec):
        raise MadqnError(f"env must be a spec string, a PettingZoo env or a zero-argument callable, "
                         f"got {type(spec).__name__}")
    name = getattr(spec, "__name__", type(spec).__name__)
    try:
        env = spec()
    except Exception as e:
        raise MadqnError(f"env factory {name}() raised {type(e).__name__}: {e}") from e
    if not is_pettingzoo_env(env):
        raise MadqnError(f"env factory {name}() returned {type(env).__name__}, not a PettingZoo ParallelEnv or AECEnv")
    return env


def is_pettingzoo_env(obj: Any) -> bool:
    from pettingzoo import AECEnv, ParallelEnv

    return isinstance(obj, (ParallelEnv, AECEnv))


def adapt(env: Any, config: Config, seed: int | None = None, convert: bool = True):
    """``AECAdapter`` for an ``AECEnv``, ``ParallelAdapter`` for a ``ParallelEnv``."""
    from pettingzoo import AECEnv

    cls = AECAdapter if isinstance(env, AECEnv) else ParallelAdapter
    return cls(env, config, seed=seed, convert=convert)


# ---- observations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ObservationSpec:
    """How one agent's raw observations become what madqn stores; plain data, saved in checkpoints.

    ``kind = "image"``: a uint8 array laid out ``HW``, ``HWC`` or ``CHW``; with ``preprocess`` it
    becomes DQN3.0's frame (luminance Y = 0.299 R + 0.587 G + 0.114 B for 3 or 4 (RGBA) channels,
    the channel mean for other counts, then an area resize of the whole image to 84x84, uint8),
    otherwise it is kept as a 2-D uint8 frame. ``kind = "vector"``: a Box flattened to float32
    (``layout = "box"``) or a Discrete one-hot (``layout = "discrete"``, ``size`` values).
    ``dict_obs``: observations are ``{"observation": ..., "action_mask": ...}`` (PettingZoo classic).
    """

    kind: str  # "image" | "vector"
    layout: str  # image: "HW" | "HWC" | "CHW"; vector: "box" | "discrete"
    raw_shape: tuple[int, ...]
    preprocess: bool = False
    size: int = 0  # discrete: number of values
    start: int = 0  # discrete: the space's first value
    dict_obs: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one stored observation."""
        if self.kind == "vector":
            return (self.size if self.layout == "discrete" else int(np.prod(self.raw_shape, dtype=np.int64)),)
        if self.preprocess:
            return FRAME_SHAPE
        return self.raw_shape[1:] if self.layout == "CHW" else self.raw_shape[:2]

    @property
    def space(self) -> spaces.Box:
        if self.kind == "image":
            return spaces.Box(0, 255, self.shape, np.uint8)
        return spaces.Box(-np.inf, np.inf, self.shape, np.float32)

    def convert(self, raw: Any) -> np.ndarray:
        """One raw observation (the dict's "observation" if ``dict_obs``) as it is stored."""
        x = raw["observation"] if self.dict_obs else raw
        if self.kind == "vector":
            if self.layout == "discrete":
                return np.eye(self.size, dtype=np.float32)[int(x) - self.start]
            return np.asarray(x, dtype=np.float32).reshape(self.shape)
        x = np.asarray(x)
        if self.layout == "CHW":
            x = np.moveaxis(x, 0, -1)
        if x.ndim == 3 and x.shape[2] == 1:
            x = x[..., 0]
        if not self.preprocess:
            return x if x.dtype == np.uint8 else np.clip(x, 0, 255).astype(np.uint8)
        if x.ndim == 2:
            gray = x.astype(np.float32)
        elif x.shape[2] in (3, 4):
            gray = luminance(x[..., :3])
        else:
            gray = x.mean(axis=2, dtype=np.float32)
        if x.dtype != np.uint8:
            gray = np.clip(gray, 0, 255)
        return area_resize_84(gray)

    def action_mask(self, raw: Any, info: Any, n_actions: int) -> np.ndarray | None:
        """Legal actions as an (n_actions,) bool array, from the observation dict or ``info``; None if absent."""
        mask = None
        if self.dict_obs and isinstance(raw, dict) and "action_mask" in raw:
            mask = raw["action_mask"]
        elif isinstance(info, dict) and info.get("action_mask") is not None:
            mask = info["action_mask"]
        if mask is None:
            return None
        mask = np.asarray(mask).astype(bool).reshape(-1)
        if mask.shape != (n_actions,):
            raise MadqnError(f"action mask of shape {mask.shape} for {n_actions} actions")
        return mask

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["raw_shape"] = list(self.raw_shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ObservationSpec":
        return cls(**{**d, "raw_shape": tuple(int(n) for n in d["raw_shape"])})


def observation_spec(agent: str, space: Any, config: Config) -> ObservationSpec:
    """Decide how ``agent``'s observations are read, from its space and ``config.network``/``preprocess``.

    ``network = "auto"``: a uint8 array of shape (H, W), (H, W, C) or (C, H, W) (C <= 4 for
    channels-first) with H, W >= 8 is an image, everything else a vector. ``"conv"`` forces an
    image, ``"mlp"`` a vector. Images are preprocessed to 84x84 luminance unless ``preprocess`` is
    "none", or it is "auto" and they already are 84x84 single-channel frames.
    """
    dict_obs = False
    if isinstance(space, spaces.Dict):
        if "observation" not in space.spaces:
            raise MadqnError(f"agent {agent}: Dict observation space {space} is not supported "
                             "(need an 'observation' entry, optionally with an 'action_mask')")
        dict_obs = True
        space = space.spaces["observation"]
    if isinstance(space, spaces.Discrete):
        if config.network == "conv":
            raise MadqnError(f"agent {agent}: network = conv needs image observations, got {space}")
        return ObservationSpec("vector", "discrete", (), size=int(space.n), start=int(space.start), dict_obs=dict_obs)
    if not isinstance(space, (spaces.Box, spaces.MultiBinary)):
        raise MadqnError(f"agent {agent}: observation space {space} is not supported "
                         "(need a Box of pixels or numbers, a Discrete, or a Dict with 'observation')")
    shape = tuple(int(n) for n in space.shape)
    layout = _image_layout(shape)
    is_image = (config.network == "conv" or (
        config.network == "auto" and layout is not None and space.dtype == np.uint8))
    if not is_image:
        return ObservationSpec("vector", "box", shape, dict_obs=dict_obs)
    if layout is None:
        raise MadqnError(f"agent {agent}: network = conv needs image observations of shape (H, W), (H, W, C) "
                         f"or (C, H, W), got {space}")
    channels = 1 if layout == "HW" else (shape[0] if layout == "CHW" else shape[2])
    side = shape[1:] if layout == "CHW" else shape[:2]
    if config.preprocess == "none":
        if channels != 1 or side[0] != side[1] or side[0] < 36:
            raise MadqnError(f"agent {agent}: preprocess = none keeps frames as given, but the conv Q-network "
                             f"needs square single-channel frames of side >= 36 and {space} is not one; "
                             "use preprocess = auto")
        preprocess = False
    else:
        preprocess = not (config.preprocess == "auto" and channels == 1 and tuple(side) == (84, 84))
    return ObservationSpec("image", layout, shape, preprocess=preprocess, dict_obs=dict_obs)


def _image_layout(shape: tuple[int, ...]) -> str | None:
    if len(shape) == 2:
        layout, side = "HW", shape
    elif len(shape) == 3 and (shape[2] <= 4 or shape[0] > 4):
        layout, side = "HWC", shape[:2]
    elif len(shape) == 3:
        layout, side = "CHW", shape[1:]
    else:
        return None
    return layout if min(side) >= IMAGE_MIN_SIDE else None


def action_starts(env: Any) -> dict[str, int]:
    """Each agent's ``Discrete.start``: madqn's action k is the env's action ``start + k``."""
    return {a: int(getattr(env._action_spaces[a] if isinstance(env, Adapter) else env.action_space(a), "start", 0))
            for a in env.possible_agents}


def observation_specs(env: Any, config: Config) -> dict[str, ObservationSpec]:
    """Each agent's spec of an env in the internal interface (adapters know theirs; Atari frames are images)."""
    if isinstance(getattr(env, "specs", None), dict):
        return dict(env.specs)
    return {a: observation_spec(a, env.observation_space(a), config) for a in env.possible_agents}


# ---- adapters ----------------------------------------------------------------------------------

class Adapter:
    """Shared parts of the two adapters: spaces, seeding on the first reset, observation conversion."""

    def __init__(self, env: Any, config: Config, seed: int | None = None, convert: bool = True):
        self.env = env
        self.convert = convert
        self.possible_agents = list(env.possible_agents)
        self._seed = seed
        self.specs = {a: observation_spec(a, env.observation_space(a), config) for a in self.possible_agents}
        self._action_spaces = {}
        for a in self.possible_agents:
            space = env.action_space(a)
            if not isinstance(space, spaces.Discrete):
                raise MadqnError(f"agent {a}: DQN needs a Discrete action space, got {space}")
            self._action_spaces[a] = space

    @property
    def agents(self) -> list[str]:
        return list(self.env.agents)

    def observation_space(self, agent: str):
        return self.specs[agent].space if self.convert else self.env.observation_space(agent)

    def action_space(self, agent: str) -> spaces.Discrete:
        """``Discrete(n)``: madqn's actions are 0..n-1 (an env's ``start`` offset is added when stepping);
        with ``convert=False`` the env's own space (actions are passed through)."""
        if not self.convert:
            return self._action_spaces[agent]
        return spaces.Discrete(int(self._action_spaces[agent].n))

    def _env_action(self, agent: str, action: Any) -> Any:
        return int(action) + int(self._action_spaces[agent].start) if self.convert else action

    def _first_seed(self, seed: int | None) -> int | None:
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        return seed

    def _observe(self, agent: str, raw: Any, info: Any) -> tuple[Any, dict]:
        spec = self.specs[agent]
        info = dict(info) if isinstance(info, dict) else {}
        try:
            mask = spec.action_mask(raw, info, int(self._action_spaces[agent].n))
        except MadqnError as e:
            raise MadqnError(f"agent {agent}: {e}") from None
        if mask is not None:
            info["action_mask"] = mask
        return (spec.convert(raw) if self.convert else raw), info

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class ParallelAdapter(Adapter):
    """A PettingZoo ``ParallelEnv``: every live agent acts each step; agents may finish early or join late."""

    turn_based = False

    def reset(self, seed: int | None = None):
        obs, infos = self.env.reset(seed=self._first_seed(seed))
        return self._observe_all(obs, infos)

    def step(self, actions: dict[str, int]):
        obs, rewards, terms, truncs, infos = self.env.step(
            {a: self._env_action(a, act) for a, act in actions.items()})
        obs, infos = self._observe_all(obs, infos)
        known = self.specs  # PettingZoo allows extra keys (e.g. "common"); agents only from here on
        return (obs, {a: r for a, r in rewards.items() if a in known}, {a: t for a, t in terms.items() if a in known},
                {a: t for a, t in truncs.items() if a in known}, infos)

    def _observe_all(self, obs: dict, infos: dict) -> tuple[dict, dict]:
        out_obs, out_infos = {}, {}
        infos = infos or {}
        for a in self.possible_agents:
            if a in obs:
                out_obs[a], out_infos[a] = self._observe(a, obs[a], infos.get(a))
            elif a in infos:
                out_infos[a] = dict(infos[a])
        return out_obs, out_infos


class AECAdapter(Adapter):
    """A PettingZoo ``AECEnv`` played turn by turn (``env.agent_selection`` is the one agent to act).

    After each move the env is advanced to the next agent that must act: every agent it selects on
    the way that has terminated or truncated is reported (final observation, reward, flags) and
    removed with PettingZoo's ``step(None)``. An agent's reward is ``last()``'s, read when the env
    selects it: everything it received since its previous move (PettingZoo's cumulative reward).
    """

    turn_based = True  # one agent moves per step: the trainer's counter counts rounds of turns

    def reset(self, seed: int | None = None):
        self.env.reset(seed=self._first_seed(seed))
        obs, _, _, _, infos = self._advance()
        return obs, infos

    def step(self, actions: dict[str, int]):
        agent = self.env.agent_selection
        if set(actions) != {agent}:
            raise ValueError(f"turn-based env: it is {agent}'s turn, got actions for {sorted(actions)}")
        self.env.step(self._env_action(agent, actions[agent]))
        return self._advance()

    def _advance(self):
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        while self.env.agents:
            agent = self.env.agent_selection
            raw, reward, term, trunc, info = self.env.last()
            if agent in obs:  # selected again without moving: PettingZoo envs never do this
                raise RuntimeError(f"AEC env selected {agent} twice without a move")
            obs[agent], infos[agent] = self._observe(agent, raw, info)
            rewards[agent], terms[agent], truncs[agent] = float(reward), bool(term), bool(trunc)
            if not (term or trunc):
                break
            self.env.step(None)
        return obs, rewards, terms, truncs, infos
