"""Trained agents playing: epsilon-greedy policies from a live ``Trainer`` or from a checkpoint.

DQN3.0 evaluates with epsilon ``eval_ep`` (0.05), greedy ties broken at random, each agent acting
on its own 4-frame recent history that starts as zeros. ``GreedyPolicy`` does exactly that for
every agent of an env, batching the agents that share a network into one forward pass; videos
(``madqn.video``) and evaluations drive it with ``reset()`` at each episode start and
``act(observations, infos)`` at every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from madqn.actor import RecentHistory, epsilon_greedy
from madqn.checkpoint import safe_load
from madqn.config import Config, make_config
from madqn.errors import CheckpointError, ConfigError
from madqn.networks import build_q_network

SHARED = "shared"


class GreedyPolicy:
    """Epsilon-greedy actions of Q-networks for the agents of one env.

    ``networks[agent]``: that agent's Q-network (the same module for every agent in shared mode);
    ``agent_ids[agent]``: its index in ``possible_agents`` (fed to networks built with an agent
    indicator). ``act`` pushes each given observation into the agent's history and returns one
    action per given agent; illegal actions (``infos[agent]["action_mask"]`` False) are never taken.
    """

    def __init__(self, networks: Mapping[str, nn.Module], agent_ids: Mapping[str, int], n_actions: Mapping[str, int],
                 frame_shapes: Mapping[str, tuple[int, ...]], frame_dtypes: Mapping[str, Any], hist_len: int,
                 epsilon: float, seed: int = 0, device: torch.device | str = "cpu"):
        self.networks = dict(networks)
        self.agent_ids = dict(agent_ids)
        self.n_actions = dict(n_actions)
        self.epsilon = float(epsilon)
        self.rng = np.random.default_rng(seed)
        self.device = torch.device(device)
        self.histories = {a: RecentHistory(hist_len, tuple(frame_shapes[a]), frame_dtypes[a]) for a in self.networks}

    def reset(self) -> None:
        """A new episode: every history restarts as zeros."""
        for h in self.histories.values():
            h.reset()

    def act(self, observations: Mapping[str, np.ndarray], infos: Mapping[str, Any] | None = None) -> dict[str, int]:
        infos = infos or {}
        for agent, obs in observations.items():
            self.histories[agent].push(obs)
        actions: dict[str, int] = {}
        by_network: dict[int, list[str]] = {}
        for agent in observations:
            by_network.setdefault(id(self.networks[agent]), []).append(agent)
        for members in by_network.values():
            network = self.networks[members[0]]
            n_actions = self.n_actions[members[0]]
            masks = [infos.get(a, {}).get("action_mask") for a in members]
            legal = None if all(m is None for m in masks) else np.stack(
                [np.ones(n_actions, bool) if m is None else np.asarray(m, bool) for m in masks])

            def q_fn(rows: np.ndarray, members=members, network=network) -> np.ndarray:
                states = torch.as_tensor(np.stack([self.histories[members[k]].state() for k in rows]),
                                         device=self.device)
                ids = None
                if getattr(network, "n_agents", 0) > 0:
                    ids = torch.as_tensor([self.agent_ids[members[k]] for k in rows], device=self.device)
                with torch.no_grad():
                    return network(states, ids).float().cpu().numpy()

            chosen = epsilon_greedy(q_fn, len(members), self.epsilon, self.rng, n_actions, legal)
            actions.update({a: int(x) for a, x in zip(members, chosen)})
        return actions

    __call__ = act


def policy_from_trainer(trainer: Any, epsilon: float, seed: int = 0) -> GreedyPolicy:
    """The trainer's current online networks, playing with ``epsilon`` (no effect on the trainer's RNGs)."""
    env = trainer.envs[0]
    agents = trainer.agents
    return GreedyPolicy(
        networks={a: trainer.group_of[a].learner.online_network for a in agents},
        agent_ids={a: i for i, a in enumerate(agents)},
        n_actions={a: trainer.group_of[a].n_actions for a in agents},
        frame_shapes={a: env.observation_space(a).shape for a in agents},
        frame_dtypes={a: env.observation_space(a).dtype for a in agents},
        hist_len=trainer.config.hist_len, epsilon=epsilon, seed=seed, device=trainer.device)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its ``checkpoints/latest.pt``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], Config]:
    """The checkpoint state (loaded with ``weights_only``) and its resolved config."""
    state = safe_load(resolve_checkpoint(path))
    try:
        config = make_config(None, dict(state["config"]))
    except ConfigError as e:
        raise CheckpointError(f"{path}: its saved config is not valid for this madqn ({e})") from None
    return state, config


def policy_from_checkpoint(state: dict[str, Any], config: Config, env: Any, epsilon: float, seed: int = 0,
                           device: torch.device | str = "cpu", where: str = "checkpoint") -> GreedyPolicy:
    """Rebuild the checkpoint's online networks for ``env`` (an env in madqn's internal interface)."""
    agents = list(env.possible_agents)
    if list(state["agents"]) != agents:
        raise CheckpointError(f"{where}: trained for agents {list(state['agents'])}, but the env has {agents}")
    n_indicator = len(agents) if (config.sharing == SHARED and config.agent_indicator) else 0
    networks: dict[str, nn.Module] = {}
    n_actions: dict[str, int] = {}
    for name, saved in state["groups"].items():
        members = list(saved["agents"])
        space = env.observation_space(members[0])
        env_actions = int(env.action_space(members[0]).n)
        if env_actions != int(saved["n_actions"]):
            raise CheckpointError(f"{where}: {name} has {saved['n_actions']} actions, the env has {env_actions}")
        try:
            network = build_q_network(tuple(space.shape), env_actions, config.hist_len, n_indicator,
                                      kind=config.network, hidden=tuple(config.mlp_hidden))
            network.load_state_dict(saved["learner"]["online"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{where}: network of {name} does not fit the env ({str(e).splitlines()[0]})") from None
        network.to(device).eval()
        for a in members:
            networks[a], n_actions[a] = network, env_actions
    missing = [a for a in agents if a not in networks]
    if missing:
        raise CheckpointError(f"{where}: no network for agents {missing}")
    return GreedyPolicy(networks, {a: i for i, a in enumerate(agents)}, n_actions,
                        {a: env.observation_space(a).shape for a in agents},
                        {a: env.observation_space(a).dtype for a in agents},
                        hist_len=config.hist_len, epsilon=epsilon, seed=seed, device=device)
