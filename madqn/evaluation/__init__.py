"""Evaluation: play episodes with a policy per agent seat and report every agent's raw scores.

DQN3.0 evaluates with epsilon 0.05 on raw (unclipped) scores within a step budget (eval_steps)
and drops the episode the budget cuts short; ``evaluate`` does the same with an episode count on
top. Policies see the env's raw observations (``make_env(..., convert=False)``), legal-action
masks in ``infos[agent]["action_mask"]``, and return the env's own actions. A policy is anything
with ``reset()`` and ``act(observations, infos, epsilon) -> {agent: action}``: trained
:class:`madqn.evaluation.agents.Agents`, :class:`RandomPolicy`, or your own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from madqn.config import Config
from madqn.envs.adapters import Adapter, is_pettingzoo_env, make_env
from madqn.errors import MadqnError


class Policy(Protocol):
    def reset(self) -> None: ...

    def act(self, observations: Mapping[str, Any], infos: Mapping[str, Any] | None = None,
            epsilon: float = 0.0) -> dict[str, int]: ...


class RandomPolicy:
    """Uniformly random over each agent's legal actions (``infos[agent]["action_mask"]``, or the
    observation's ``"action_mask"`` for ``{"observation", "action_mask"}`` dicts, else all).

    ``action_spaces``: agent -> ``Discrete`` space (its ``start`` offset is honoured) or action count.
    """

    def __init__(self, action_spaces: Mapping[str, Any], seed: int | None = None):
        self.n_actions = {a: int(getattr(s, "n", s)) for a, s in action_spaces.items()}
        self.starts = {a: int(getattr(s, "start", 0)) for a, s in action_spaces.items()}
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def act(self, observations: Mapping[str, Any], infos: Mapping[str, Any] | None = None,
            epsilon: float = 1.0) -> dict[str, int]:
        infos = infos or {}
        actions = {}
        for a, obs in observations.items():
            mask = (infos.get(a) or {}).get("action_mask")
            if mask is None and isinstance(obs, Mapping):
                mask = obs.get("action_mask")
            legal = np.arange(self.n_actions[a]) if mask is None else np.flatnonzero(np.asarray(mask, bool))
            if legal.size == 0:
                raise ValueError(f"agent {a} has no legal action")
            actions[a] = int(self.rng.choice(legal)) + self.starts[a]
        return actions


@dataclass
class EvalResult:
    """Per-agent raw scores and decision counts of every completed episode, in order."""

    agents: list[str]
    epsilon: float
    scores: dict[str, list[float]] = field(default_factory=dict)  # agent -> raw score per episode
    lengths: dict[str, list[int]] = field(default_factory=dict)  # agent -> its decisions per episode
    steps: list[int] = field(default_factory=list)  # env steps (agent steps) per episode
    incomplete: int = 0  # episodes cut short by the step or time budget (not counted, as in DQN3.0)
    stopped_by: str | None = None  # "steps" or "time" when a budget ended the evaluation before `episodes`
    seconds: float = 0.0  # wall time of the evaluation

    @property
    def episodes(self) -> int:
        return len(self.steps)

    def mean_scores(self) -> dict[str, float]:
        """Mean raw score per agent over the completed episodes (empty if none completed)."""
        return {a: float(np.mean(s)) for a, s in self.scores.items() if s}


def evaluate(env: Any, policies: Policy | str | Mapping[str, Policy | str], *, episodes: int,
             epsilon: float = 0.05, seed: int | None = None, max_steps: int | None = None,
             max_seconds: float | None = None, config: Config | None = None,
             on_episode: Callable[[EvalResult], None] | None = None,
             clock: Callable[[], float] = time.monotonic) -> EvalResult:
    """Play ``episodes`` episodes of ``env`` and return every agent's raw scores.

    ``env``: anything ``make_env`` takes (spec, factory, PettingZoo env) or an adapter built with
    ``convert=False``. ``policies``: one policy for every seat, or a dict agent -> policy; the
    string "random" stands for a :class:`RandomPolicy`. ``epsilon`` is passed to every policy.
    ``seed``: episode k resets the env with ``seed + k`` (the same episodes for every policy you
    compare) and seeds the random policies. ``max_steps``: total env-step budget, ``max_seconds``:
    wall-time budget; the episode a budget cuts short is dropped. ``config``: env settings for Atari
    names (defaults otherwise). ``on_episode(result)`` runs after every completed episode (progress).
    ``clock``: seconds for the time budget and ``seconds`` (a monotonic clock; tests pass their own).
    """
    if episodes < 0:
        raise MadqnError(f"episodes must be >= 0, got {episodes}")
    if isinstance(env, Adapter) and env.convert:
        raise MadqnError("evaluate needs raw observations: build the env with make_env(..., convert=False)")
    owned = not isinstance(env, Adapter) and not is_pettingzoo_env(env)  # we built it, we close it
    game = env if isinstance(env, Adapter) else make_env(env, config or Config(), convert=False)
    try:
        seats = _seat_policies(game, policies, seed)
        unique = list({id(p): p for p in seats.values()}.values())
        result = EvalResult(list(game.possible_agents), epsilon, {a: [] for a in game.possible_agents},
                            {a: [] for a in game.possible_agents})
        total = 0
        start = clock()
        deadline = None if max_seconds is None else start + max_seconds
        for k in range(episodes):
            obs, infos = game.reset(seed=None if seed is None else seed + k)
            for p in unique:
                p.reset()
            scores = dict.fromkeys(game.possible_agents, 0.0)
            lengths = dict.fromkeys(game.possible_agents, 0)
            steps = 0
            while game.agents:
                if max_steps is not None and total >= max_steps:
                    result.stopped_by = "steps"
                elif deadline is not None and clock() >= deadline:
                    result.stopped_by = "time"
                if result.stopped_by is not None:
                    result.incomplete += 1
                    result.seconds = clock() - start
                    return result
                acting = [a for a in obs if a in game.agents]
                actions: dict[str, int] = {}
                for p in unique:
                    mine = [a for a in acting if seats[a] is p]
                    if mine:
                        actions.update(p.act({a: obs[a] for a in mine}, {a: infos.get(a, {}) for a in mine},
                                             epsilon=epsilon))
                obs, rewards, _, _, infos = game.step(actions)
                for a, r in rewards.items():
                    scores[a] += float(r)
                for a in actions:
                    lengths[a] += 1
                steps += 1
                total += 1
            for a in game.possible_agents:
                result.scores[a].append(scores[a])
                result.lengths[a].append(lengths[a])
            result.steps.append(steps)
            result.seconds = clock() - start
            if on_episode is not None:
                on_episode(result)
        return result
    finally:
        if owned:
            game.close()


def _seat_policies(game: Any, policies: Any, seed: int | None) -> dict[str, Any]:
    action_spaces = {a: game.action_space(a) for a in game.possible_agents}
    random_policy = None

    def resolve(p: Any) -> Any:
        nonlocal random_policy
        if isinstance(p, str):
            if p != "random":
                raise MadqnError(f"unknown policy '{p}' (use 'random' or a policy object)")
            if random_policy is None:
                random_policy = RandomPolicy(action_spaces, seed=seed)
            return random_policy
        return p

    if isinstance(policies, Mapping):
        missing = [a for a in game.possible_agents if a not in policies]
        if missing:
            raise MadqnError(f"no policy for agents {missing}")
        return {a: resolve(policies[a]) for a in game.possible_agents}
    policy = resolve(policies)
    return dict.fromkeys(game.possible_agents, policy)
