"""The aggregate over games and runs (madqn.evaluation.aggregate): rliable's interquartile mean and its
stratified-bootstrap interval, against values computed by hand."""

import numpy as np
import pytest
from scipy.stats import trim_mean

from madqn.evaluation.aggregate import REFERENCES, aggregate, game_aggregate, iqm, normalized, stratified_bootstrap_ci


def test_iqm_cuts_a_quarter_at_each_end_as_rliable_does():
    # 8 scores sorted 0 1 2 3 4 5 10 100: int(0.25 * 8) = 2 cut at each end, mean of 2 3 4 5 = 3.5
    assert iqm([[0.0, 10.0, 2.0, 4.0], [1.0, 3.0, 100.0, 5.0]]) == 3.5
    # 6 scores: int(1.5) = 1 cut at each end: 1 2 3 4 5 60 -> mean of 2 3 4 5 = 3.5
    assert iqm([60, 1, 2, 3, 4, 5]) == 3.5
    # 3 scores: nothing cut (int(0.75) = 0): the plain mean
    assert iqm([1, 2, 9]) == 4.0
    rng = np.random.default_rng(0)
    for n in (4, 5, 7, 13, 30):  # scipy's trim_mean is the function rliable calls
        x = rng.normal(size=n)
        assert iqm(x) == pytest.approx(trim_mean(x, 0.25, axis=None), abs=1e-12)


def test_stratified_bootstrap_resamples_within_each_task():
    # every task has identical runs: any within-task resample is the same matrix, so the interval has zero width,
    # at the IQM of 0 0 10 10 (cut 1 each end: mean of 0 and 10 = 5); a bootstrap pooling the tasks would vary
    assert stratified_bootstrap_ci([[0.0, 0.0], [10.0, 10.0]], reps=2_000) == (5.0, 5.0)
    # a task with one run contributes exactly that run to every replicate: 1 1 1 5 -> IQM of 1 1 = 1
    assert stratified_bootstrap_ci([[5.0], [1.0, 1.0, 1.0]], reps=2_000) == (1.0, 1.0)
    # one task, runs 0 and 1, the mean: replicates are 0, 0.5, 1 with probability 1/4, 1/2, 1/4, so the 2.5th
    # and 97.5th percentiles are 0 and 1, and about half the replicates are 0.5
    low, high = stratified_bootstrap_ci([[0.0, 1.0]], np.mean, reps=4_000, seed=3)
    assert (low, high) == (0.0, 1.0)


def test_interval_is_reproducible_and_contains_the_estimate():
    rng = np.random.default_rng(1)
    tasks = {f"game{i}": rng.normal(i, 1.0, size=5) for i in range(4)}
    a, b = aggregate(tasks, seed=7), aggregate(tasks, seed=7)
    assert a == b and a.low < a.iqm < a.high and a.tasks == 4 and a.runs == 20
    assert aggregate(tasks, seed=8) != a  # another seed draws other replicates
    assert a.iqm == iqm(np.concatenate(list(tasks.values())))
    narrow = aggregate(tasks, confidence=0.5, seed=7)
    assert a.low < narrow.low <= narrow.high < a.high


def test_normalised_scale_uses_the_papers_figures():
    # pong: random vs random 2.4, the paper's 50M-step score 18.9
    assert normalized("pong_v3", 2.4) == 0.0 and normalized("pong_v3", 18.9) == pytest.approx(1.0)
    assert normalized("pong_v3", 17.1) == pytest.approx((17.1 - 2.4) / 16.5)
    assert normalized("boxing_v2", -1.0) == 0.0 and normalized("space_invaders_v2", 729) == pytest.approx(1.0)
    # a seat's own random baseline as its zero (the paper's figures are first_0's), the paper's scale
    assert normalized("pong_v3", -3.4, baseline=-3.4) == 0.0
    assert normalized("pong_v3", 13.1, baseline=-3.4) == pytest.approx(1.0)
    assert normalized("catch", 1.0) is None
    assert set(REFERENCES) == {"pong_v3", "boxing_v2", "tennis_v3", "surround_v2", "space_invaders_v2"}
    # one game: the seats are the tasks, the seeds the runs
    g = game_aggregate("pong_v3", {"first_0": [17.1, 16.0], "second_0": [16.0, 17.4]})
    assert g.normalized and g.tasks == 2 and g.runs == 4
    assert g.iqm == pytest.approx(np.mean([(16.0 - 2.4) / 16.5, (17.1 - 2.4) / 16.5]))
    seats = game_aggregate("pong_v3", {"first_0": [3.4], "second_0": [-3.4]}, {"first_0": 3.4, "second_0": -3.4})
    assert seats.iqm == 0.0  # random play is 0 in both seats against each seat's own baseline
    raw = game_aggregate("catch", {"a": [1.0, 2.0]})
    assert not raw.normalized and raw.iqm == 1.5
