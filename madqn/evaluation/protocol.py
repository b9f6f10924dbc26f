"""The evaluation protocol: who plays which seat, one raw row per seat per episode, and summaries of those rows.

Matches (each a set of *settings*, a setting being one assignment of players to seats):

- ``vs_random`` (the multiplayer-ALE paper's protocol): for each seat s in turn, the trained agents
  play s and every other seat acts uniformly at random;
- ``random_vs_random``: every seat random, on the same episode seeds: the baseline vs_random is read against;
- ``self``: the trained agents play every seat (self-play, DQN3.0's evaluation for one agent);
- ``cross``: player A against player B. For each seat s, A plays s and B every other seat, and the
  other way round (two settings in a two-player game): every seat is played as often by A as by B,
  so a seat advantage cancels in the per-player means.

Every setting plays the same ``episodes`` episode seeds (``seed + k`` for episode k), so settings
differ only in who plays (common random numbers). Episodes are played by
:func:`madqn.evaluation.evaluate` at epsilon ``epsilon`` (DQN3.0: 0.05) on raw scores; an episode a
step budget cuts short is dropped. Rows (``ROW_FIELDS``) are what the CSV files hold; every number
in a report is a function below applied to them, so it can be recomputed from the CSV.

A *side* is the seats one player holds in a setting (in ``random_vs_random`` each seat is its own
side). Outcomes follow ``madqn.evaluation.stats.side_outcome``: the side's mean seat score against the other
seats' mean; strictly higher wins.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from madqn.evaluation import evaluate
from madqn.evaluation.stats import Record, Summary, mean_confidence_interval, side_outcome, tally

RANDOM = "random"
VS_RANDOM, RANDOM_VS_RANDOM, SELF, CROSS = "vs_random", "random_vs_random", "self", "cross"
ROW_FIELDS = ["match", "setting", "episode", "seed", "seat", "player", "side", "score", "length", "steps",
              "outcome", "epsilon"]


@dataclass
class Player:
    """A named policy: ``madqn.evaluation.agents.Agents`` (trained networks) or ``"random"``.

    ``rng`` of a policy that has one is reseeded at every setting, so a setting's actions do not
    depend on what was played before it.
    """

    name: str
    policy: Any = RANDOM


RANDOM_PLAYER = Player(RANDOM, RANDOM)


def play(env: Any, seats: Mapping[str, Player], *, match: str, episodes: int, epsilon: float, seed: int,
         sides: Sequence[Sequence[str]] | None = None, max_steps: int | None = None,
         config: Any = None, on_episode: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Play one setting (``seats``: seat -> player) and return one row per seat per completed episode.

    ``sides``: the seat groups whose outcomes are scored together (default: the seats of each player).
    ``on_episode``: called after every completed episode (``madqn.training.progress.EvalProgress``).
    """
    agents = list(env.possible_agents)
    if set(seats) != set(agents):
        raise ValueError(f"seats {sorted(seats)} must be exactly the env's agents {agents}")
    for p in seats.values():
        if not p.name or any(ch in p.name for ch in " =+"):
            raise ValueError(f"player name {p.name!r} must be non-empty without spaces, '=' or '+'")
    if sides is None:
        by_player: dict[str, list[str]] = defaultdict(list)
        for a in agents:
            by_player[seats[a].name].append(a)
        sides = list(by_player.values())
    side_of = {a: list(side) for side in sides for a in side}
    for p in {id(p.policy): p.policy for p in seats.values()}.values():
        if p != RANDOM and hasattr(p, "rng"):
            p.rng = np.random.default_rng(seed)
    result = evaluate(env, {a: seats[a].policy for a in agents}, episodes=episodes, epsilon=epsilon, seed=seed,
                      max_steps=max_steps, config=config, on_episode=on_episode)
    setting = " ".join(f"{a}={seats[a].name}" for a in agents)
    rows = []
    for k in range(result.episodes):
        scores = {a: float(result.scores[a][k]) for a in agents}
        for a in agents:
            rows.append({"match": match, "setting": setting, "episode": k, "seed": seed + k, "seat": a,
                         "player": seats[a].name, "side": "+".join(side_of[a]), "score": scores[a],
                         "length": int(result.lengths[a][k]), "steps": int(result.steps[k]),
                         "outcome": side_outcome(scores, side_of[a]), "epsilon": epsilon})
    return rows


def vs_random(env: Any, player: Player, *, episodes: int, epsilon: float, seed: int, baseline: bool = True,
              max_steps: int | None = None, config: Any = None, on_setting: Callable[[], None] | None = None,
              on_episode: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """``player`` in each seat against random others; with ``baseline`` also all-random on the same seeds.

    ``max_steps`` is the env-step budget of each setting; ``on_setting()`` is called after each setting.
    """
    agents = list(env.possible_agents)
    rows: list[dict[str, Any]] = []
    for seat in agents:
        seats = {a: player if a == seat else RANDOM_PLAYER for a in agents}
        rows += play(env, seats, match=VS_RANDOM, episodes=episodes, epsilon=epsilon, seed=seed,
                     sides=[[seat], [a for a in agents if a != seat]] if len(agents) > 1 else [[seat]],
                     max_steps=max_steps, config=config, on_episode=on_episode)
        _done(on_setting)
    if baseline:
        rows += random_baseline(env, episodes=episodes, seed=seed, max_steps=max_steps, config=config,
                                on_episode=on_episode)
        _done(on_setting)
    return rows


def _done(on_setting: Callable[[], None] | None) -> None:
    if on_setting is not None:
        on_setting()


def random_baseline(env: Any, *, episodes: int, seed: int, max_steps: int | None = None,
                    config: Any = None, on_episode: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Every seat random (each seat its own side): the random-vs-random reference."""
    agents = list(env.possible_agents)
    return play(env, {a: RANDOM_PLAYER for a in agents}, match=RANDOM_VS_RANDOM, episodes=episodes, epsilon=1.0,
                seed=seed, sides=[[a] for a in agents], max_steps=max_steps, config=config, on_episode=on_episode)


def self_play(env: Any, player: Player, *, episodes: int, epsilon: float, seed: int, max_steps: int | None = None,
              config: Any = None, on_setting: Callable[[], None] | None = None,
              on_episode: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """``player`` in every seat (each seat its own side)."""
    agents = list(env.possible_agents)
    rows = play(env, {a: player for a in agents}, match=SELF, episodes=episodes, epsilon=epsilon, seed=seed,
                sides=[[a] for a in agents], max_steps=max_steps, config=config, on_episode=on_episode)
    _done(on_setting)
    return rows


def cross_settings(agents: Sequence[str], a: str, b: str) -> list[dict[str, str]]:
    """The seat assignments of a cross-play match: for each seat, A there and B elsewhere, and the
    reverse; duplicates removed (two seats give exactly the two orientations)."""
    out: list[dict[str, str]] = []
    for seat in agents:
        for alone, rest in ((a, b), (b, a)):
            setting = {s: alone if s == seat else rest for s in agents}
            if setting not in out:
                out.append(setting)
    return out


def cross_play(env: Any, a: Player, b: Player, *, episodes: int, epsilon: float, seed: int,
               max_steps: int | None = None, config: Any = None, on_setting: Callable[[], None] | None = None,
               on_episode: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """A against B over every setting of ``cross_settings`` (seats swapped), ``episodes`` each."""
    if a.name == b.name:
        raise ValueError(f"cross-play needs two differently named players, got {a.name!r} twice")
    players = {a.name: a, b.name: b}
    rows: list[dict[str, Any]] = []
    for setting in cross_settings(list(env.possible_agents), a.name, b.name):
        rows += play(env, {s: players[name] for s, name in setting.items()}, match=CROSS, episodes=episodes,
                     epsilon=epsilon, seed=seed, max_steps=max_steps, config=config, on_episode=on_episode)
        _done(on_setting)
    return rows


# ---- summaries (pure functions of the rows) ---------------------------------------------------------

def select(rows: Iterable[Mapping[str, Any]], **where: Any) -> list[Mapping[str, Any]]:
    """Rows whose fields equal ``where`` (values compared as strings, so CSV rows work too)."""
    return [r for r in rows if all(str(r[k]) == str(v) for k, v in where.items())]


def episode_scores(rows: Iterable[Mapping[str, Any]], player: str, **where: Any) -> list[float]:
    """``player``'s score per episode: the mean of its seats' raw scores in that episode, over the
    matching settings (in row order)."""
    per_episode: dict[tuple[str, str], list[float]] = {}
    for r in select(rows, player=player, **where):
        per_episode.setdefault((str(r["setting"]), str(r["episode"])), []).append(float(r["score"]))
    return [float(np.mean(v)) for v in per_episode.values()]


def score_summary(rows: Iterable[Mapping[str, Any]], player: str, confidence: float = 0.95, **where: Any) -> Summary:
    return mean_confidence_interval(episode_scores(rows, player, **where), confidence)


def record(rows: Iterable[Mapping[str, Any]], player: str, **where: Any) -> Record:
    """``player``'s win/draw/loss count: one outcome per (setting, episode), that of its side."""
    outcomes: dict[tuple[str, str, str], str] = {}
    for r in select(rows, player=player, **where):
        outcomes.setdefault((str(r["setting"]), str(r["episode"]), str(r["side"])), str(r["outcome"]))
    return tally(outcomes.values())


def length_summary(rows: Iterable[Mapping[str, Any]], **where: Any) -> Summary:
    """Episode lengths (env steps), one per (setting, episode)."""
    steps: dict[tuple[str, str], float] = {}
    for r in select(rows, **where):
        steps.setdefault((str(r["setting"]), str(r["episode"])), float(r["steps"]))
    return mean_confidence_interval(steps.values())


def games(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, float]]:
    """Pairwise games for ``madqn.evaluation.rating.fit_ratings``: one per (setting, episode) of every setting with
    exactly two sides held by two different players; the score is the first side's (1, 1/2, 0)."""
    episodes: dict[tuple[str, str, str], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if str(r["match"]) == RANDOM_VS_RANDOM:
            continue
        key = (str(r["match"]), str(r["setting"]), str(r["episode"]))
        episodes.setdefault(key, {}).setdefault(str(r["side"]), r)
    out = []
    points = {"win": 1.0, "draw": 0.5, "loss": 0.0}
    for sides in episodes.values():
        if len(sides) != 2:
            continue
        first, second = sides.values()
        if first["player"] == second["player"]:
            continue
        out.append((str(first["player"]), str(second["player"]), points[str(first["outcome"])]))
    return out
