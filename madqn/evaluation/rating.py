"""Ratings from pairwise results: a Bradley-Terry fit on the Elo scale, with standard errors.

Each game between players i and j gives i a score of 1 (win), 1/2 (draw) or 0 (loss). The model is
Elo's: P(i beats j) = 1 / (1 + 10^((R_j - R_i) / 400)). Unlike Elo's sequential updates, whose
result depends on the order the games were played in, the ratings here are the maximum-likelihood
fit to all games at once (as BayesElo and Elo's "performance rating" do), found with Hunter's MM
iteration. ``prior_draws`` virtual draws are added to every pair that played (BayesElo's prior), so
a perfect record gives a large finite rating instead of infinity. One player (``anchor``, e.g. the
random policy) is fixed at 0; without an anchor the ratings have mean 0. Standard errors come from
the inverse Fisher information with the anchor fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from madqn.errors import MadqnError

ELO_PER_NAT = 400.0 / math.log(10.0)


def expected_score(rating_a: float, rating_b: float) -> float:
    """Elo's expected score of A against B."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


@dataclass(frozen=True)
class Rating:
    player: str
    rating: float  # Elo points relative to the anchor (or to the mean)
    se: float  # standard error, Elo points (0 for the anchor)
    games: int  # real games played (virtual draws not counted)
    score: float  # points per real game (win 1, draw 1/2)


def fit_ratings(games: Iterable[tuple[str, str, float]], *, anchor: str | None = None, prior_draws: float = 1.0,
                tol: float = 1e-10, max_iter: int = 100_000) -> dict[str, Rating]:
    """Fit Elo-scale ratings to ``games`` = (player_a, player_b, score of a in [0, 1]) triples.

    Returns player -> :class:`Rating`, best first. Raises ``MadqnError`` when the players do not
    form one connected comparison graph (their relative ratings would be undefined), or when a
    player's record cannot be fitted (``prior_draws = 0`` with a perfect or winless record).
    """
    games = list(games)
    players: list[str] = []
    for a, b, s in games:
        if a == b:
            raise MadqnError(f"a game of {a} against itself cannot be rated")
        if not 0.0 <= float(s) <= 1.0:
            raise MadqnError(f"a game score must be in [0, 1], got {s} for {a} vs {b}")
        players += [p for p in (a, b) if p not in players]
    if anchor is not None and anchor not in players:
        raise MadqnError(f"anchor {anchor!r} played no game")
    n = len(players)
    if n == 0:
        return {}
    index = {p: i for i, p in enumerate(players)}
    real_games = np.zeros((n, n))
    points = np.zeros((n, n))  # points[i, j]: what i scored against j
    for a, b, s in games:
        i, j = index[a], index[b]
        real_games[i, j] += 1
        real_games[j, i] += 1
        points[i, j] += float(s)
        points[j, i] += 1.0 - float(s)
    _check_connected(players, real_games)
    played = real_games > 0
    n_games = real_games + prior_draws * played
    wins = (points + 0.5 * prior_draws * played).sum(axis=1)
    if np.any(wins <= 0) or np.any(wins >= n_games.sum(axis=1)):
        bad = players[int(np.flatnonzero((wins <= 0) | (wins >= n_games.sum(axis=1)))[0])]
        raise MadqnError(f"{bad} won or lost every game: its rating is infinite; use prior_draws > 0")
    strength = np.ones(n)
    for _ in range(max_iter):
        denom = (n_games / (strength[:, None] + strength[None, :])).sum(axis=1)
        new = wins / denom
        new /= math.exp(np.log(new).mean())
        done = np.max(np.abs(np.log(new) - np.log(strength))) < tol
        strength = new
        if done:
            break
    theta = np.log(strength)
    theta -= theta[index[anchor]] if anchor is not None else theta.mean()
    se = _standard_errors(theta, n_games, None if anchor is None else index[anchor])
    n_real = real_games.sum(axis=1)
    out = {p: Rating(p, float(theta[i] * ELO_PER_NAT), float(se[i] * ELO_PER_NAT), int(n_real[i]),
                     float(points[i].sum() / n_real[i])) for p, i in index.items()}
    return dict(sorted(out.items(), key=lambda kv: -kv[1].rating))


def _check_connected(players: list[str], games: np.ndarray) -> None:
    seen, todo = {0}, [0]
    while todo:
        i = todo.pop()
        for j in np.flatnonzero(games[i] > 0):
            if int(j) not in seen:
                seen.add(int(j))
                todo.append(int(j))
    if len(seen) < len(players):
        apart = [players[i] for i in range(len(players)) if i not in seen]
        raise MadqnError(f"players {apart} never met {players[0]} directly or through others: "
                         "their ratings cannot be compared")


def _standard_errors(theta: np.ndarray, n_games: np.ndarray, anchor: int | None) -> np.ndarray:
    """sqrt of the diagonal of the inverse Fisher information (natural-log strength units)."""
    p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))  # p[i, j] = P(i beats j)
    w = n_games * p * p.T
    info = np.diag(w.sum(axis=1)) - w
    if anchor is None:
        cov = np.linalg.pinv(info)
    else:
        keep = [i for i in range(len(theta)) if i != anchor]
        cov = np.zeros_like(info)
        cov[np.ix_(keep, keep)] = np.linalg.inv(info[np.ix_(keep, keep)])
    return np.sqrt(np.clip(np.diag(cov), 0.0, None))


def pool_games(rows: Iterable[dict], every: int) -> list[tuple[str, str, float]]:
    """The training games of a run with an opponent pool (``episodes.csv`` rows, ``pool_every`` = ``every``)
    as rated games between versions of the networks: in an episode where a snapshot played some seats, the
    current networks (the version that becomes the snapshot of the next multiple of ``every``) against that
    snapshot, scored as the pool scores it (their mean score against the snapshot seats' mean: win 1, draw
    1/2, loss 0; random seats count for neither). Players are named ``"step N"``: the snapshot taken at agent
    step N, or the networks that played between step N - every and N."""
    episodes: dict[str, list[dict]] = {}
    for row in rows:
        episodes.setdefault(row["episode"], []).append(row)
    games = []
    for seats in episodes.values():
        snapshot = {r["snapshot_step"] for r in seats if r.get("snapshot_step")}
        if len(snapshot) != 1:
            continue
        theirs = [float(r["score"]) for r in seats if r.get("snapshot_step")]
        ours = [float(r["score"]) for r in seats if not r.get("snapshot_step") and r.get("random_seat") != "1"]
        if not ours:
            continue
        step = int(seats[0]["step"])
        current = f"step {-(-step // every) * every}"
        opponent = f"step {int(next(iter(snapshot)))}"
        if current == opponent:
            continue
        mine, other = sum(ours) / len(ours), sum(theirs) / len(theirs)
        games.append((current, opponent, 1.0 if mine > other else 0.5 if mine == other else 0.0))
    return games
