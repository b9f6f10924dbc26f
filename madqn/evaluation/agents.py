"""Trained agents that act without a Trainer: ``madqn.load_agents(run_dir)`` -> :class:`Agents`.

``agents.act(observations)`` takes the env's raw observations (the same conversion as training:
:class:`madqn.envs.adapters.ObservationSpec`), keeps each agent's recent history of ``hist_len`` frames as
DQN3.0's actor does (zeros at an episode start), and returns epsilon-greedy actions over the
legal ones (greedy by default). Checkpoints and ``madqn export`` files are read with ``weights_only``
(``checkpoint.safe_load``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from madqn.config import Config, FIELD_NAMES, make_config
from madqn.core.actor import RecentHistory, epsilon_greedy
from madqn.envs.adapters import ObservationSpec, action_starts, make_env, observation_specs
from madqn.errors import CheckpointError, ConfigError, MadqnError
from madqn.training.checkpoint import PLAY_KINDS, online_weights, safe_load
from madqn.training.learners import q_network_for
from madqn.training.trainer import resolve_threads


class Agents:
    """Q-networks (one shared or one per agent) acting for a set of agents.

    ``act`` must be called once per decision with each acting agent's newest observation (it is
    pushed into that agent's history); call ``reset()`` at the start of every episode.
    """

    def __init__(self, networks: Mapping[str, nn.Module], specs: Mapping[str, ObservationSpec],
                 n_actions: Mapping[str, int], hist_len: int, *, agent_ids: Mapping[str, int] | None = None,
                 action_starts: Mapping[str, int] | None = None, device: torch.device | str = "cpu",
                 seed: int | None = None):
        self.possible_agents = list(specs)
        self.networks = dict(networks)  # agent -> online network (the same object for a shared network)
        self.specs = dict(specs)
        self.n_actions = {a: int(n) for a, n in n_actions.items()}
        self.agent_ids = dict(agent_ids) if agent_ids is not None else {a: i for i, a in enumerate(self.possible_agents)}
        self.action_starts = {a: int((action_starts or {}).get(a, 0)) for a in self.possible_agents}
        self.hist_len = int(hist_len)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.histories = {a: RecentHistory(self.hist_len, s.shape, s.space.dtype) for a, s in self.specs.items()}

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_trainer(cls, trainer: Any, seed: int | None = None) -> "Agents":
        """The trainer's current online networks (shared, not copied) acting on raw observations.

        Waits for any learning round in flight (``trainer.settle()``), so the weights hold still until
        the trainer's next step: a video or an evaluation run from a hook plays one set of weights."""
        trainer.settle()
        networks = {a: g.learner.online_network for g in trainer.groups for a in g.agents}
        n_actions = {a: g.n_actions for g in trainer.groups for a in g.agents}
        return cls(networks, dict(trainer.observation_specs), n_actions, trainer.config.hist_len,
                   agent_ids={a: i for i, a in enumerate(trainer.agents)}, action_starts=dict(trainer.action_starts),
                   device=trainer.device, seed=seed)

    @classmethod
    def from_state(cls, state: dict[str, Any], *, env: Any = None, device: torch.device | str = "cpu",
                   seed: int | None = None, source: str = "checkpoint") -> "Agents":
        """From a loaded checkpoint dict (``checkpoint.trainer_state``) or export (``export.agents_state``)."""
        config = Config(**{k: v for k, v in state["config"].items() if k in FIELD_NAMES})
        agents = list(state["agents"])
        if env is not None:
            built = make_env(env, config, convert=False)
            specs, starts = observation_specs(built, config), action_starts(built)
            built.close()
        elif "observation_specs" in state:
            specs = {a: ObservationSpec.from_dict(d) for a, d in state["observation_specs"].items()}
            starts = dict(state.get("action_starts", {}))
        else:
            raise CheckpointError(f"{source} does not say how observations are read; pass env= to load_agents")
        missing = [a for a in agents if a not in specs]
        if missing:
            raise CheckpointError(f"{source}: no observation spec for agents {missing}")
        networks, n_actions = {}, {}
        for name, group in state["groups"].items():
            members = list(group["agents"])
            network = q_network_for(config, specs[members[0]].shape, int(group["n_actions"]), len(agents))
            try:
                network.load_state_dict(online_weights(group))
            except (RuntimeError, KeyError) as e:
                raise CheckpointError(f"{source}: network of {name} does not match its config "
                                      f"({str(e).splitlines()[0]})") from None
            network.to(device).eval()
            for a in members:
                networks[a], n_actions[a] = network, int(group["n_actions"])
        return cls(networks, {a: specs[a] for a in agents}, n_actions, config.hist_len,
                   agent_ids={a: i for i, a in enumerate(agents)}, action_starts=starts, device=device, seed=seed)

    def check_env(self, env: Any, source: str = "checkpoint") -> None:
        """Refuse an env (internal interface) whose agents or action counts are not the ones these networks play."""
        agents = list(env.possible_agents)
        if agents != self.possible_agents:
            raise CheckpointError(f"{source}: trained for agents {self.possible_agents}, but the env has {agents}")
        for a in agents:
            n = int(env.action_space(a).n)
            if n != self.n_actions[a]:
                raise CheckpointError(f"{source}: {a} has {self.n_actions[a]} actions, the env has {n}")

    # ---- acting ---------------------------------------------------------------------------
    def reset(self, agents: list[str] | None = None) -> None:
        """Clear the recent histories (all, or the given agents'): call at every episode start."""
        for a in self.possible_agents if agents is None else agents:
            self.histories[a].reset()

    def act(self, observations: Mapping[str, Any], infos: Mapping[str, Any] | None = None,
            epsilon: float = 0.0) -> dict[str, int]:
        """Env actions for the agents in ``observations`` (raw env observations), one batched forward per network.

        Legal actions come from ``{"observation", "action_mask"}`` observations or
        ``infos[agent]["action_mask"]``; illegal ones are never chosen, randomly or greedily.
        """
        infos = infos or {}
        unknown = [a for a in observations if a not in self.specs]
        if unknown:
            raise MadqnError(f"no trained network for agents {unknown}; known agents: {self.possible_agents}")
        masks = {}
        for a, raw in observations.items():
            spec = self.specs[a]
            self.histories[a].push(spec.convert(raw))
            masks[a] = spec.action_mask(raw, infos.get(a), self.n_actions[a])
        actions: dict[str, int] = {}
        by_network: dict[int, list[str]] = {}
        for a in observations:
            by_network.setdefault(id(self.networks[a]), []).append(a)
        for members in by_network.values():
            network, n = self.networks[members[0]], self.n_actions[members[0]]
            legal = None
            if any(masks[a] is not None for a in members):
                legal = np.stack([np.ones(n, bool) if masks[a] is None else masks[a] for a in members])

            def q_fn(rows: np.ndarray, members=members, network=network) -> np.ndarray:
                return self._q_values(network, [members[k] for k in rows])

            chosen = epsilon_greedy(q_fn, len(members), epsilon, self.rng, n, legal)
            actions.update({a: int(x) + self.action_starts[a] for a, x in zip(members, chosen)})
        return {a: actions[a] for a in observations}

    def q_values(self, agent: str) -> np.ndarray:
        """The Q-values of ``agent``'s current recent history (as of its last ``act``), one per action."""
        return self._q_values(self.networks[agent], [agent])[0]

    def _q_values(self, network: nn.Module, agents: list[str]) -> np.ndarray:
        states = torch.as_tensor(np.stack([self.histories[a].state() for a in agents]), device=self.device)
        ids = None
        if getattr(network, "n_agents", 0) > 0:
            ids = torch.as_tensor([self.agent_ids[a] for a in agents], device=self.device)
        with torch.no_grad():
            return network(states, ids).float().cpu().numpy()


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint file, or a run directory / checkpoints directory holding ``latest.pt``."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "latest.pt", path / "latest.pt"):
            if candidate.is_file():
                return candidate
        raise CheckpointError(f"no checkpoint in {path} (looked for checkpoints/latest.pt and latest.pt)")
    return path


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], Config]:
    """A checkpoint or export (run directory or file) loaded with ``weights_only``, and its resolved config."""
    file = checkpoint_path(path)
    state = safe_load(file, kind=PLAY_KINDS)
    try:
        config = make_config(None, {k: v for k, v in state["config"].items() if k in FIELD_NAMES})
    except ConfigError as e:
        raise CheckpointError(f"{file}: its saved config is not valid for this madqn ({e})") from None
    return state, config


def load_for_play(path: str | Path, eps: float | None = None) -> tuple[dict[str, Any], Config, float]:
    """``load_checkpoint`` plus what playing needs: torch threads as the run chose them, and the epsilon
    to act with (the run's ``eval_ep`` unless ``eps`` is given), checked to lie in [0, 1]."""
    state, config = load_checkpoint(path)
    torch.set_num_threads(resolve_threads(config.num_threads)[0])
    epsilon = config.eval_ep if eps is None else eps
    if not 0.0 <= epsilon <= 1.0:
        raise MadqnError(f"--eps must be in [0, 1], got {epsilon}")
    return state, config, epsilon


def load_agents(path: str | Path, *, env: Any = None, device: str = "cpu", seed: int | None = None) -> Agents:
    """Load trained agents from a run directory, a checkpoint file or a ``madqn export`` file, ready to ``act``.

    ``env`` (a spec, factory or PettingZoo env) is only needed for checkpoints that predate the
    stored observation specs; ``seed`` seeds the epsilon-greedy draws.
    """
    file = checkpoint_path(path)
    return Agents.from_state(safe_load(file, kind=PLAY_KINDS), env=env, device=device, seed=seed, source=str(file))
