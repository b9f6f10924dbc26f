"""Aggregate scores over games and runs: the interquartile mean with stratified-bootstrap confidence intervals.

The statistic is rliable's (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"): the
interquartile mean (IQM) of all scores pooled, i.e. the mean of the middle 50% after cutting the lowest
and highest 25% (``scipy.stats.trim_mean(scores, 0.25, axis=None)``: ``int(0.25 * n)`` scores cut at each
end), and a percentile confidence interval from a *stratified* bootstrap: each replicate resamples, with
replacement, the runs of every game (task) separately, so that every game keeps its weight. Written here
with numpy (rliable itself pulls in arch, pandas and seaborn) and tested against hand-computed values.

Scores are normalised per game so that 0 is the random-vs-random score and 1 the score of the
multiplayer-ALE paper's Ape-X DQN after 50M agent steps (Terry et al. 2020, the last logged evaluation
against random players in its code's ``new_csvs/``): :data:`REFERENCES`. The paper's figures are first_0's
(its evaluation played the trained policy in the first seat only), so a seat's zero is best the random
player's score in that seat measured on the same episodes (``madqn compare`` passes it); the paper's
random figure is used where no such baseline is given, and the scale is always the paper's
``paper - random``. A task here is one game, or
one seat of a game when a single game is aggregated (``madqn compare``); a run is one seed (and seat).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

IQM_CUT = 0.25  # fraction of the pooled scores cut at each end


@dataclass(frozen=True)
class Reference:
    paper: float  # Terry et al. 2020, Ape-X DQN with parameter sharing, 50M agent steps, against random players
    random: float  # random vs random in the same paper's logs


# the published figures, by madqn/PettingZoo env name
REFERENCES: dict[str, Reference] = {
    "pong_v3": Reference(paper=18.9, random=2.4),
    "boxing_v2": Reference(paper=69.5, random=-1.0),
    "tennis_v3": Reference(paper=21.0, random=2.3),
    "surround_v2": Reference(paper=9.2, random=0.1),
    "space_invaders_v2": Reference(paper=729.0, random=398.0),
}


def normalized(env: str, score: float, baseline: float | None = None) -> float | None:
    """``score`` on the scale 0 = random vs random (``baseline``, the random player's score in the same seat,
    else the paper's figure), 1 = that plus the paper's 50M-step gain over random; None for a game without
    published figures."""
    ref = REFERENCES.get(env)
    if ref is None:
        return None
    zero = ref.random if baseline is None else float(baseline)
    return (float(score) - zero) / (ref.paper - ref.random)


def iqm(scores: np.ndarray | Sequence[float]) -> float:
    """Interquartile mean of all scores pooled: the mean after cutting ``int(0.25 * n)`` scores at each end."""
    x = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("the IQM of no scores is undefined")
    cut = int(IQM_CUT * x.size)
    return float(x[cut:x.size - cut].mean())


def stratified_bootstrap_ci(tasks: Sequence[Sequence[float]], statistic: Callable[[np.ndarray], float] = iqm, *,
                            reps: int = 10_000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of ``statistic`` over bootstrap replicates that resample each task's runs with
    replacement, separately per task (rliable's ``StratifiedBootstrap``). ``tasks``: one sequence of run scores
    per task (tasks may have different numbers of runs)."""
    arrays = [np.asarray(t, dtype=np.float64).ravel() for t in tasks]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("every task needs at least one run")
    rng = np.random.default_rng(seed)
    # (reps, total runs): replicate r takes, for each task, a.size draws from that task's own runs
    resampled = np.concatenate([a[rng.integers(0, a.size, size=(reps, a.size))] for a in arrays], axis=1)
    values = np.array([statistic(row) for row in resampled])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class Aggregate:
    iqm: float
    low: float  # stratified bootstrap percentile interval
    high: float
    tasks: int
    runs: int  # scores pooled
    normalized: bool  # on the 0 = random-vs-random, 1 = paper scale (else raw scores)

    def to_dict(self) -> dict:
        return asdict(self)


def aggregate(tasks: Mapping[str, Sequence[float]], *, confidence: float = 0.95, reps: int = 10_000,
              seed: int = 0) -> Aggregate:
    """IQM and its stratified-bootstrap interval of ``tasks`` (task name -> run scores, already on one scale)."""
    values = [list(v) for v in tasks.values()]
    low, high = stratified_bootstrap_ci(values, iqm, reps=reps, confidence=confidence, seed=seed)
    return Aggregate(iqm=iqm(np.concatenate([np.asarray(v, dtype=np.float64) for v in values])), low=low, high=high,
                     tasks=len(values), runs=sum(len(v) for v in values), normalized=False)


def game_aggregate(env: str, seat_scores: Mapping[str, Sequence[float]],
                   baselines: Mapping[str, float] | None = None, **kw) -> Aggregate:
    """One game: tasks are its seats, runs the seeds; scores normalised when the game has published figures
    (``baselines``: the random player's score per seat on the same episodes, each seat's zero)."""
    norm = env in REFERENCES
    base = baselines or {}
    tasks = {seat: [normalized(env, s, base.get(seat)) for s in scores] if norm else list(scores)
             for seat, scores in seat_scores.items()}
    result = aggregate(tasks, **kw)
    result.normalized = norm
    return result
