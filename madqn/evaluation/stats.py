"""Statistics for evaluation reports: mean, standard deviation, Student-t confidence intervals, outcomes.

Every number a report shows is one of these pure functions applied to per-episode raw scores, so a
reader can recompute it from the raw CSV. scipy is not a dependency: the t quantile comes from the
regularized incomplete beta function (continued fraction, accurate to ~1e-12) inverted by bisection.

Outcome rule (win/draw/loss of one *side* of an episode, a side being the seats one player holds):
the side's score is the mean raw episode score of its seats, the opponents' score the mean of the
other seats. Win: strictly higher; draw: equal; loss: lower. With two seats this is "my score
against the opponent's"; with more seats and one seat per side it reads "strictly higher than the
others' mean". ``placement`` gives the per-seat rule for free-for-all games with more than two
players: win = strictly highest score, draw = tied for the highest, loss otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

WIN, DRAW, LOSS = "win", "draw", "loss"


# ---- Student t -----------------------------------------------------------------------------------

def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (Student's t, ``df`` degrees of freedom), by bisection on ``t_cdf``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---- summaries -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    """n values: mean, sample standard deviation (n - 1), and the two-sided Student-t confidence
    interval of the mean, mean +- t_{(1+c)/2, n-1} * std / sqrt(n). With n < 2 std and the
    interval are NaN (one episode says nothing about its spread)."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2.0

    def covers(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "half_width": self.half_width}

    def format(self, digits: int = 2) -> str:
        """``mean +- half_width`` (``mean`` alone when the interval is undefined; ``-`` with no data)."""
        if self.n == 0:
            return "-"
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def mean_confidence_interval(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """Mean, std (ddof 1) and Student-t confidence interval of ``values``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    xs = [float(v) for v in values]
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return Summary(0, nan, nan, nan, nan, confidence)
    mean = math.fsum(xs) / n
    if n == 1:
        return Summary(1, mean, nan, nan, nan, confidence)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half, confidence)


# ---- outcomes ------------------------------------------------------------------------------------

def side_outcome(scores: dict[str, float], side: Sequence[str]) -> str:
    """Win, draw or loss of the seats ``side`` in one episode (``scores``: raw score per seat).

    The side's mean seat score against the other seats' mean (see the module docstring). A side
    holding every seat has no opponent: a draw.
    """
    mine = [scores[a] for a in side]
    theirs = [s for a, s in scores.items() if a not in side]
    if not mine:
        raise ValueError("a side needs at least one seat")
    if not theirs:
        return DRAW
    a, b = math.fsum(mine) / len(mine), math.fsum(theirs) / len(theirs)
    return WIN if a > b else LOSS if a < b else DRAW


def placement(scores: dict[str, float], seat: str) -> str:
    """Free-for-all rule for one seat: win = strictly highest score, draw = tied for the highest, loss otherwise."""
    best = max(scores.values())
    if scores[seat] < best:
        return LOSS
    return WIN if sum(1 for s in scores.values() if s == best) == 1 else DRAW


@dataclass(frozen=True)
class Record:
    """Win/draw/loss counts; ``score`` = (wins + draws / 2) / games, the usual rating score."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        return (self.wins + 0.5 * self.draws) / self.games if self.games else float("nan")

    def rates(self) -> dict[str, float]:
        g = self.games or float("nan")
        return {"win": self.wins / g, "draw": self.draws / g, "loss": self.losses / g}

    def __add__(self, other: "Record") -> "Record":
        return Record(self.wins + other.wins, self.draws + other.draws, self.losses + other.losses)


def tally(outcomes: Iterable[str]) -> Record:
    counts = {WIN: 0, DRAW: 0, LOSS: 0}
    for o in outcomes:
        if o not in counts:
            raise ValueError(f"unknown outcome {o!r}")
        counts[o] += 1
    return Record(counts[WIN], counts[DRAW], counts[LOSS])
