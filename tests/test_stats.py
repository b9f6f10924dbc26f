"""Statistics and ratings against hand-computed values and closed forms."""

import math

import numpy as np
import pytest

from madqn.errors import MadqnError
from madqn.evaluation.rating import expected_score, fit_ratings
from madqn.evaluation.stats import (DRAW, LOSS, WIN, Record, mean_confidence_interval, placement, regularized_beta,
                                    side_outcome, t_cdf, t_quantile, tally)


# ---- Student t ----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_closed_forms(p):
    # df = 1 is the Cauchy distribution; df = 2 has t = (2p - 1) / sqrt(2 p (1 - p))
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)


@pytest.mark.parametrize("df, t975", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (5, 2.5706), (9, 2.2622),
                                      (10, 2.2281), (19, 2.0930), (29, 2.0452), (30, 2.0423), (100, 1.9840)])
def test_t_quantile_matches_printed_tables(df, t975):
    assert t_quantile(0.975, df) == pytest.approx(t975, abs=1e-4)


def test_t_quantile_tends_to_normal_and_is_symmetric():
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert t_quantile(0.025, 7) == pytest.approx(-t_quantile(0.975, 7), abs=1e-12)
    assert t_cdf(t_quantile(0.9, 3), 3) == pytest.approx(0.9, abs=1e-12)
    assert t_cdf(0.0, 5) == 0.5


def test_regularized_beta_closed_forms():
    # I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b
    for x in (0.1, 0.5, 0.93):
        assert regularized_beta(1, 1, x) == pytest.approx(x, abs=1e-13)
        assert regularized_beta(3.5, 1, x) == pytest.approx(x ** 3.5, abs=1e-13)
        assert regularized_beta(1, 2.5, x) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-13)


# ---- summaries ----------------------------------------------------------------------------------

def test_summary_hand_computed():
    # 1..5: mean 3, sample variance 2.5, se sqrt(2.5 / 5) = 0.70711, t_{0.975, 4} = 2.77645
    s = mean_confidence_interval([1, 2, 3, 4, 5])
    assert (s.n, s.mean) == (5, 3.0)
    assert s.std == pytest.approx(math.sqrt(2.5))
    assert s.half_width == pytest.approx(2.776445 * math.sqrt(0.5), abs=1e-5)
    assert (s.ci_low, s.ci_high) == pytest.approx((3 - 1.963243, 3 + 1.963243), abs=1e-5)
    assert s.format() == "3.00 ± 1.96"
    # a 90% interval is narrower: t_{0.95, 4} = 2.13185
    narrower = mean_confidence_interval([1, 2, 3, 4, 5], 0.90)
    assert narrower.half_width == pytest.approx(2.131847 * math.sqrt(0.5), abs=1e-5)


def test_summary_small_samples():
    empty = mean_confidence_interval([])
    assert empty.n == 0 and math.isnan(empty.mean) and empty.format() == "-"
    one = mean_confidence_interval([4.0])
    assert one.mean == 4.0 and math.isnan(one.std) and math.isnan(one.half_width) and one.format() == "4.00"
    same = mean_confidence_interval([2.0, 2.0, 2.0])
    assert same.std == 0.0 and same.ci_low == same.ci_high == 2.0


def test_summary_coverage_of_normal_samples():
    """About 95% of 95% intervals of 10 normal draws cover the true mean (2000 trials: 93.5%..96.5%)."""
    rng = np.random.default_rng(0)
    covered = sum(mean_confidence_interval(rng.normal(1.0, 3.0, 10)).covers(1.0) for _ in range(2000))
    assert 0.935 <= covered / 2000 <= 0.965


# ---- outcomes -----------------------------------------------------------------------------------

def test_outcomes():
    assert side_outcome({"a": 3, "b": 1}, ["a"]) == WIN
    assert side_outcome({"a": 3, "b": 1}, ["b"]) == LOSS
    assert side_outcome({"a": -2, "b": -2}, ["a"]) == DRAW
    # one seat against the mean of three others: 2 > (5 + 0 + 0) / 3
    assert side_outcome({"a": 2, "b": 5, "c": 0, "d": 0}, ["a"]) == WIN
    # two seats each: (1 + 4) / 2 = 2.5 vs (3 + 2) / 2 = 2.5
    assert side_outcome({"a": 1, "b": 3, "c": 4, "d": 2}, ["a", "c"]) == DRAW
    assert side_outcome({"a": 1, "b": 3}, ["a", "b"]) == DRAW
    assert placement({"a": 2, "b": 5, "c": 0}, "b") == WIN
    assert placement({"a": 5, "b": 5, "c": 0}, "a") == DRAW
    assert placement({"a": 2, "b": 5, "c": 0}, "a") == LOSS
    r = tally([WIN, WIN, DRAW, LOSS])
    assert (r.wins, r.draws, r.losses, r.games) == (2, 1, 1, 4)
    assert r.score == pytest.approx(2.5 / 4) and r.rates() == {"win": 0.5, "draw": 0.25, "loss": 0.25}
    assert r + Record(1, 0, 0) == Record(3, 1, 1)


# ---- ratings ------------------------------------------------------------------------------------

def games(a, b, wins, draws=0, losses=0):
    return [(a, b, 1.0)] * wins + [(a, b, 0.5)] * draws + [(a, b, 0.0)] * losses


def test_elo_expected_score():
    assert expected_score(1600, 1400) == pytest.approx(1 / (1 + 10 ** -0.5))
    assert expected_score(1500, 1500) == 0.5


def test_two_players_hand_computed():
    # A scores 3 of 4: the fitted P(A beats B) is 3/4, so R_A - R_B = 400 log10(3) = 190.85
    r = fit_ratings(games("A", "B", 3, losses=1), anchor="B", prior_draws=0)
    assert r["A"].rating == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert r["B"].rating == 0.0 and r["B"].se == 0.0
    # Fisher information 4 * 3/4 * 1/4 = 0.75 per nat^2: se = 1 / sqrt(0.75) nats = 200.55 Elo
    assert r["A"].se == pytest.approx(400 / math.log(10) / math.sqrt(0.75), abs=1e-6)
    assert (r["A"].games, r["A"].score) == (4, 0.75)
    # one virtual draw: 3.5 of 5 points, R_A - R_B = 400 log10(3.5 / 1.5)
    r1 = fit_ratings(games("A", "B", 3, losses=1), anchor="B", prior_draws=1)
    assert r1["A"].rating == pytest.approx(400 * math.log10(3.5 / 1.5), abs=1e-6)
    assert r1["A"].score == 0.75  # real games only
    # a draw counts half: 2 wins, 2 draws of 4 games = 3 points, like 3 wins 1 loss
    r2 = fit_ratings(games("A", "B", 2, draws=2), anchor="B", prior_draws=0)
    assert r2["A"].rating == pytest.approx(400 * math.log10(3), abs=1e-6)


def test_chain_adds_up_and_cycle_is_flat():
    # A beats B 3:1, B beats C 3:1, A never meets C: differences add, R_A - R_C = 2 * 190.85
    r = fit_ratings(games("A", "B", 3, losses=1) + games("B", "C", 3, losses=1), anchor="C", prior_draws=0)
    assert r["B"].rating == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert r["A"].rating == pytest.approx(800 * math.log10(3), abs=1e-6)
    assert list(r) == ["A", "B", "C"]
    # rock-paper-scissors 2:1 each way: everyone equal; no anchor means mean 0
    cyc = fit_ratings(games("A", "B", 2, losses=1) + games("B", "C", 2, losses=1) + games("C", "A", 2, losses=1),
                      prior_draws=0)
    assert all(abs(x.rating) < 1e-6 for x in cyc.values())


def test_fit_satisfies_the_likelihood_equations():
    """At the maximum each player's expected points over its games equal its actual points."""
    g = games("A", "B", 5, 1, 2) + games("B", "C", 3, 0, 4) + games("A", "C", 2, 2, 1) + games("C", "D", 6, 0, 1)
    r = fit_ratings(g, anchor="D", prior_draws=0)
    for p in "ABCD":
        actual = sum(s if a == p else 1 - s for a, b, s in g if p in (a, b))
        expected = sum(expected_score(r[p].rating, r[b if a == p else a].rating) for a, b, _ in g if p in (a, b))
        assert expected == pytest.approx(actual, abs=1e-6)


def test_rating_errors():
    with pytest.raises(MadqnError, match="never met"):
        fit_ratings(games("A", "B", 1, losses=1) + games("C", "D", 1, losses=1))
    with pytest.raises(MadqnError, match="infinite"):
        fit_ratings(games("A", "B", 3), prior_draws=0)
    with pytest.raises(MadqnError, match="anchor"):
        fit_ratings(games("A", "B", 1, losses=1), anchor="Z")
    # with the prior a perfect record is finite: 3.5 of 4 points
    assert fit_ratings(games("A", "B", 3), anchor="B")["A"].rating == pytest.approx(400 * math.log10(7), abs=1e-6)
