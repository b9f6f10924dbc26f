import numpy as np
import pytest

from madqn.core.actor import RecentHistory, epsilon_greedy, linear_epsilon

SCHEDULE = dict(ep_start=1.0, ep_end=0.1, ep_endt=1_000_000, learn_start=50_000)


@pytest.mark.parametrize("step, expected", [
    (0, 1.0), (50_000, 1.0), (550_000, 0.55), (1_050_000, 0.1), (5_000_000, 0.1), (300_000, 0.775)])
def test_dqn3_epsilon_schedule(step, expected):
    # by hand: 0.1 + 0.9 * (1e6 - (step - 5e4)) / 1e6
    assert linear_epsilon(step, **SCHEDULE) == pytest.approx(expected)


def test_recent_history_starts_with_zeros_and_keeps_order():
    h = RecentHistory(4, (2, 2))
    assert not h.state().any()
    for v in (1, 2, 3):
        h.push(np.full((2, 2), v, np.uint8))
    assert h.state()[:, 0, 0].tolist() == [0, 1, 2, 3]
    h.push(np.full((2, 2), 4, np.uint8))
    h.push(np.full((2, 2), 5, np.uint8))
    assert h.state()[:, 0, 0].tolist() == [2, 3, 4, 5]
    h.reset()
    assert h.state()[:, 0, 0].tolist() == [0, 0, 0, 0]


def test_greedy_picks_max_and_breaks_ties_uniformly():
    rng = np.random.default_rng(0)
    q = np.array([[1.0, 3.0, 3.0, 0.0]])
    picks = [int(epsilon_greedy(lambda rows: q[[0] * len(rows)], 1, 0.0, rng, 4)[0]) for _ in range(2000)]
    counts = np.bincount(picks, minlength=4)
    assert counts[0] == 0 and counts[3] == 0
    assert 850 < counts[1] < 1150 and 850 < counts[2] < 1150


def test_random_actions_are_uniform_over_legal_ones_only():
    rng = np.random.default_rng(1)
    mask = np.array([[True, False, True, True, False]] * 5000)
    calls = []
    a = epsilon_greedy(lambda rows: calls.append(rows), 5000, 1.0, rng, 5, mask)
    assert not calls  # epsilon 1: no forward pass at all
    counts = np.bincount(a, minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    assert all(1500 < counts[k] < 1830 for k in (0, 2, 3))


def test_greedy_respects_mask():
    rng = np.random.default_rng(2)
    q = np.array([[9.0, 1.0, 2.0]])
    mask = np.array([[False, True, True]])
    assert epsilon_greedy(lambda rows: q, 1, 0.0, rng, 3, mask)[0] == 2


def test_epsilon_fraction_and_q_called_only_for_greedy_rows():
    rng = np.random.default_rng(3)
    seen = []

    def q_fn(rows):
        seen.append(len(rows))
        return np.tile([0.0, 1.0], (len(rows), 1))

    a = epsilon_greedy(q_fn, 10_000, 0.2, rng, 2)
    # greedy picks 1; random picks 0 or 1 with 1/2 each: P(0) = 0.2 * 0.5 = 0.1
    assert 0.085 < (a == 0).mean() < 0.115
    assert 7_800 < seen[0] < 8_200


@pytest.mark.parametrize("prev, step, learn_from, update_freq, expected", [
    (99, 100, 100, 4, 0),    # step 100 is not > learn_start: no learning yet
    (100, 101, 100, 4, 0),   # 101 is not a multiple of 4
    (103, 104, 100, 4, 1),   # 104: the first round
    (100, 108, 100, 4, 2),   # a vector step of 8 crosses 104 and 108
    (0, 300, 100, 4, 50),    # the smoke run: (300 - 100) / 4
    (96, 104, 100, 4, 1),    # 100 itself is not > learn_start, 104 is
])
def test_learning_rounds_follow_dqn3_perceive(prev, step, learn_from, update_freq, expected):
    from madqn.training.learners import learning_rounds

    assert learning_rounds(prev, step, learn_from, update_freq) == expected
