"""The evaluation protocol on real envs: random baseline of a symmetric zero-sum game, seat swapping, summaries."""

import math
from pathlib import Path

import numpy as np
import pytest

import madqn
from madqn.evaluation.agents import load_agents
from madqn.config import make_config
from madqn.envs.adapters import make_env
from madqn.evaluation.protocol import (CROSS, RANDOM, RANDOM_VS_RANDOM, VS_RANDOM, Player, cross_play, cross_settings,
                                       games, random_baseline, record, score_summary, self_play, vs_random)
from madqn.evaluation.stats import side_outcome

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"
T975 = {2: 4.302653, 39: 2.022691}


def pong(max_cycles):
    cfg = make_config(SMOKE, {"max_cycles": max_cycles, "terminal_on_life_loss": False})
    return make_env("pong_v3", cfg, convert=False), cfg


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory):
    """A pong_v3 run of 120 agent steps with 20 updates per network: networks that are not uniform."""
    run_dir = tmp_path_factory.mktemp("protocol") / "run"
    madqn.train("pong_v3", SMOKE, run_dir=run_dir, steps=120, learn_start=40, sharing="independent", num_threads=1)
    return run_dir


def test_random_baseline_of_a_symmetric_zero_sum_game_is_near_zero():
    """Repeated rock-paper-scissors (tests/rps.py: zero-sum and seat-symmetric by construction), random
    players in both seats, 40 episodes of 10 rounds on seeds 0..39."""
    cfg = make_config(None, {"device": "cpu"})
    env = make_env(f"{ROOT / 'tests' / 'rps.py'}:make_env", cfg, convert=False)
    try:
        rows = random_baseline(env, episodes=40, seed=0, config=cfg)
    finally:
        env.close()
    assert len(rows) == 80 and {r["match"] for r in rows} == {RANDOM_VS_RANDOM}
    first = np.array([r["score"] for r in rows if r["seat"] == "player_0"])
    second = np.array([r["score"] for r in rows if r["seat"] == "player_1"])
    assert np.array_equal(first, -second) and np.abs(first).sum() > 0  # zero-sum, and points were scored
    for seat, scores in (("player_0", first), ("player_1", second)):
        s = score_summary(rows, RANDOM, match=RANDOM_VS_RANDOM, seat=seat)
        half = T975[39] * scores.std(ddof=1) / math.sqrt(40)  # independent recomputation
        assert (s.n, s.mean, s.half_width) == (40, pytest.approx(scores.mean()), pytest.approx(half))
        assert s.covers(0.0) and abs(s.mean) < 1.0, s
    assert [r["outcome"] for r in rows] == [side_outcome({"player_0": a, "player_1": -a}, [seat])
                                           for a in first for seat in ("player_0", "player_1")]


def test_pong_random_baseline_is_zero_sum_episode_by_episode():
    """pong_v3 is zero-sum (a point is +1 for one player, -1 for the other), though not seat-symmetric:
    the baseline measures its seat advantage rather than assuming none."""
    env, cfg = pong(150)
    try:
        rows = random_baseline(env, episodes=4, seed=0, config=cfg)
    finally:
        env.close()
    first = np.array([r["score"] for r in rows if r["seat"] == "first_0"])
    second = np.array([r["score"] for r in rows if r["seat"] == "second_0"])
    assert np.array_equal(first, -second) and np.abs(first).sum() > 0


def test_cross_play_swaps_seats_and_clones_mirror_exactly(pong_run):
    """The same network under two names: the swapped setting replays each episode with the roles swapped
    (same episode seeds, policies reseeded per setting), so the two names' results mirror exactly."""
    env, cfg = pong(150)
    try:
        a = Player("A", load_agents(pong_run, seed=0))
        b = Player("B", load_agents(pong_run, seed=0))
        rows = cross_play(env, a, b, episodes=3, epsilon=0.05, seed=7, config=cfg)
    finally:
        env.close()
    assert cross_settings(["first_0", "second_0"], "A", "B") == [{"first_0": "A", "second_0": "B"},
                                                                 {"first_0": "B", "second_0": "A"}]
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    assert settings == ["first_0=A second_0=B", "first_0=B second_0=A"]
    for player in "AB":
        for seat in ("first_0", "second_0"):
            assert sum(1 for r in rows if r["player"] == player and r["seat"] == seat) == 3
    by = {(r["setting"], r["episode"], r["seat"]): r for r in rows}
    for k in range(3):
        for seat in ("first_0", "second_0"):
            one, two = by[(settings[0], k, seat)], by[(settings[1], k, seat)]
            assert one["player"] != two["player"] and one["score"] == two["score"] and one["seed"] == two["seed"] == 7 + k
    sa, sb = score_summary(rows, "A", match=CROSS), score_summary(rows, "B", match=CROSS)
    assert sa.n == sb.n == 6 and sa.mean == sb.mean
    ra, rb = record(rows, "A", match=CROSS), record(rows, "B", match=CROSS)
    assert (ra.wins, ra.draws, ra.losses) == (rb.losses, rb.draws, rb.wins) and ra.games == 6
    assert sorted(games(rows)) == sorted(games(rows))  and len(games(rows)) == 6


def test_vs_random_plays_each_seat_and_the_baseline_on_the_same_seeds(pong_run):
    env, cfg = pong(100)
    try:
        trained = Player("run", load_agents(pong_run, seed=0))
        rows = vs_random(env, trained, episodes=3, epsilon=0.05, seed=11, config=cfg)
    finally:
        env.close()
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    assert settings == ["first_0=run second_0=random", "first_0=random second_0=run", "first_0=random second_0=random"]
    for r in rows:
        assert r["seed"] == 11 + r["episode"] and r["steps"] == 100  # truncated at max_cycles
    s = score_summary(rows, "run", match=VS_RANDOM, seat="second_0")
    scores = [r["score"] for r in rows if r["player"] == "run" and r["seat"] == "second_0"]
    assert s.n == 3 and s.mean == pytest.approx(np.mean(scores))
    assert s.half_width == pytest.approx(T975[2] * np.std(scores, ddof=1) / math.sqrt(3))
    # every vs-random episode is a game of the run against random
    assert sorted(p for g in games(rows) for p in g[:2]) == ["random"] * 6 + ["run"] * 6


def test_self_play_rows(pong_run):
    env, cfg = pong(60)
    try:
        rows = self_play(env, Player("run", load_agents(pong_run, seed=0)), episodes=2, epsilon=0.05, seed=0,
                         config=cfg)
    finally:
        env.close()
    assert len(rows) == 4 and all(r["side"] == r["seat"] for r in rows)
    assert games(rows) == []  # one player on both sides: nothing to rate


def test_step_budget_drops_the_incomplete_episode():
    env, cfg = pong(100)
    try:
        rows = random_baseline(env, episodes=5, seed=0, max_steps=250, config=cfg)
    finally:
        env.close()
    assert sorted({r["episode"] for r in rows}) == [0, 1]  # the third episode would end at step 300
