"""The opponent pool for self-play (madqn.training.pool): its schedule and capacity, the snapshot a seat plays
with, how snapshots are drawn (uniform and PFSP, chi-square tests), checkpoints and resume, and a real run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chi2

import madqn
from madqn.config import Config, make_config
from madqn.errors import ConfigError
from madqn.training.acting import ActingLoop, RecordingSink
from madqn.training.checkpoint import safe_load
from madqn.training.learners import group_members, q_network_for
from madqn.training.pool import OpponentPool
from madqn.training.trainer import Hook
from madqn.envs.vecenv import make_envs
from helpers import read_csv, run_madqn

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
TINY = dict(env=CATCH, replay_memory=500, prog_freq=100, save_freq=1000, eval_freq=0, valid_size=0, device="cpu",
            hist_len=2, mlp_hidden=[16], num_threads=1, final_eval_episodes=0, vector_env="inline")


def _nets(cfg, envs, seed):
    torch.manual_seed(seed)
    return [q_network_for(cfg, envs[0].observation_space(agents[0]).shape, 3, len(envs[0].possible_agents))
            for _, agents in group_members(cfg, envs[0].possible_agents)]


def _chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    return float(chi2.sf(((counts - expected) ** 2 / expected).sum(), len(counts) - 1))


def test_snapshots_every_k_agent_steps_at_most_m_oldest_dropped():
    pool = OpponentPool(every=100, size=3)
    net = torch.nn.Linear(2, 3)
    taken = []
    step = 0
    for advance in [30, 30, 30, 30, 7, 93, 250, 2, 98, 100, 1]:  # steps cross multiples of 100 unevenly
        prev, step = step, step + advance
        if pool.due(prev, step):
            with torch.no_grad():
                net.bias.fill_(step)
            pool.add(step, [net])
            taken.append(step)
    assert taken == [120, 220, 470, 570, 670]  # once per crossing, at the step it happened (250 crosses 2: once)
    assert [s.step for s in pool.snapshots] == [470, 570, 670]  # size 3: the oldest dropped
    assert [float(s.weights[0]["bias"][0]) for s in pool.snapshots] == [470.0, 570.0, 670.0]  # copies, not views
    assert not OpponentPool(every=0, size=3).due(0, 10_000)


def test_uniform_and_pfsp_draws_follow_their_probabilities():
    pool = OpponentPool(every=1, size=4, sampling="pfsp")
    for step in range(4):
        pool.add(step, [torch.nn.Linear(2, 2)])
    # the networks' record against each snapshot: 9 of 9 won, 0 of 9, none played, 1.5 points of 3
    for step, outcomes in enumerate([[1.0] * 9, [0.0] * 9, [], [1.0, 0.5, 0.0]]):
        for points in outcomes:
            pool.result(step, points)
    win = np.array([9.5 / 10, 0.5 / 10, 0.5, 2.0 / 4])  # (points + 1/2) / (games + 1)
    want = (1 - win) ** 2 / ((1 - win) ** 2).sum()
    np.testing.assert_allclose(pool.probabilities(), want)
    rng = np.random.default_rng(0)
    counts = np.bincount([pool.draw(rng) for _ in range(20_000)], minlength=4)
    assert _chi_square_p(counts, want) > 0.001
    assert _chi_square_p(counts, np.full(4, 0.25)) < 1e-12  # the test tells PFSP from uniform
    pool.sampling = "uniform"
    counts = np.bincount([pool.draw(rng) for _ in range(20_000)], minlength=4)
    assert _chi_square_p(counts, np.full(4, 0.25)) > 0.001
    assert _chi_square_p(counts, want) < 1e-12


def test_a_snapshot_seat_plays_with_the_snapshots_weights_not_the_current_ones():
    cfg = Config(**TINY, steps=100, learn_start=0, ep_start=0.0, ep_end=0.0, ep_endt=1, eval_ep=0.0,
                 sharing="shared", pool_every=8, pool_size=2, pool_prob=1.0, seed=5)
    envs = make_envs(cfg.env, cfg)
    (current,) = _nets(cfg, envs, seed=0)
    loop = ActingLoop(cfg, envs, [current], RecordingSink(), np.random.default_rng(0), torch.device("cpu"))
    while loop.step < 8:
        loop.step_envs()
    assert [s.step for s in loop.pool.snapshots] == [8]
    loop.pool.every = 10**9  # no further snapshot: every snapshot seat below plays the one of step 8
    saved = {k: v.clone() for k, v in current.state_dict().items()}
    with torch.no_grad():  # the current network moves on: its greedy actions now differ from the snapshot's
        for p in current.parameters():
            p.add_(torch.randn_like(p))
    while not any(s.snapshot is not None for s in loop.slots.values()):  # an episode start with a snapshot seat
        loop.step_envs()
    (slot,) = [s for s in loop.slots.values() if s.snapshot is not None]
    assert slot.snapshot == 8
    reference = q_network_for(cfg, envs[0].observation_space("left").shape, 3, 2)
    reference.load_state_dict(saved)
    state = torch.from_numpy(slot.history.state()[None])
    ids = torch.tensor([slot.agent_id])
    (snapshot_net,) = slot.snapshot_networks
    with torch.no_grad():
        torch.testing.assert_close(snapshot_net(state, ids), reference(state, ids), rtol=0, atol=0)
        assert not torch.equal(current(state, ids), reference(state, ids))
    # the seat's actions are the snapshot's greedy ones (eval_ep 0), over many states
    for _ in range(60):
        for s in [s for s in loop.slots.values() if s.snapshot is not None]:
            with torch.no_grad():
                q = reference(torch.from_numpy(s.history.state()[None]), torch.tensor([s.agent_id]))
            assert loop.act([s], 0.0)[0] == int(q.argmax())
        loop.step_envs()
    loop.close()


def test_episode_records_and_pfsp_statistics_name_the_snapshot_and_the_networks_points():
    cfg = Config(**TINY, steps=600, learn_start=0, ep_start=0.0, ep_end=0.0, ep_endt=1, sharing="independent",
                 pool_every=40, pool_size=3, pool_prob=0.5, pool_sampling="pfsp", seed=6)
    envs = make_envs(cfg.env, cfg)
    sink = RecordingSink()
    loop = ActingLoop(cfg, envs, _nets(cfg, envs, seed=1), sink, np.random.default_rng(3), torch.device("cpu"))
    while loop.step < cfg.steps:
        loop.step_envs()
    with_snapshot = [r for r in sink.episodes if r.snapshot_seats]
    assert 0.3 < len(with_snapshot) / len(sink.episodes) < 0.6  # pool_prob 0.5 once the pool has a snapshot
    assert all(len(r.snapshot_seats) == 1 for r in with_snapshot)
    games = {s.step: 0 for s in loop.pool.snapshots}
    points = dict.fromkeys(games, 0.0)
    for r in with_snapshot:
        ((seat, step),) = r.snapshot_seats.items()
        assert step % 40 == 0 and step <= r.step
        if step in games:
            (other,) = [a for a in r.scores if a != seat]
            games[step] += 1
            points[step] += 1.0 if r.scores[other] > r.scores[seat] else 0.5 if r.scores[other] == r.scores[seat] else 0
    assert {s.step: (s.games, s.points) for s in loop.pool.snapshots} == {k: (games[k], points[k]) for k in games}
    loop.close()


def test_a_run_with_the_pool_marks_snapshot_seats_and_resume_keeps_the_pool(tmp_path):
    settings = {k: v for k, v in TINY.items() if k != "env"}
    run = tmp_path / "run"
    madqn.train(CATCH, run_dir=run, **{**settings, "save_freq": 200}, steps=400, learn_start=100, sharing="shared",
                pool_every=50, pool_size=3, pool_prob=0.5, pool_sampling="pfsp", seed=2)
    state = safe_load(run / "checkpoints" / "latest.pt")
    pool = state["pool"]["snapshots"]
    assert [s["step"] for s in pool] == [300, 350, 400]
    rows = read_csv(run / "episodes.csv")
    marked = [r for r in rows if r["snapshot_step"]]
    assert marked and all(int(r["snapshot_step"]) % 50 == 0 for r in marked)
    assert {r["epsilon"] for r in marked} == {"0.05"}  # a snapshot plays at the evaluation epsilon
    assert {r["snapshot_step"] for r in rows if int(r["step"]) <= 50} == {""}  # no snapshot before the first
    # resume: the pool comes back with its weights and statistics, and goes on taking snapshots
    cfg = make_config(run / "config.toml")
    from madqn.training.trainer import Trainer
    from madqn.training.checkpoint import restore_trainer

    with Trainer(cfg) as trainer:
        restore_trainer(trainer, state, run / "checkpoints" / "latest.pt")
        restored = trainer.acting.pool.snapshots
        assert [(s.step, s.games, s.points) for s in restored] == [(s["step"], s["games"], s["points"]) for s in pool]
        for s, saved in zip(restored, pool):
            for got, want in zip(s.weights, saved["weights"]):
                assert all(torch.equal(got[k], want[k]) for k in want)
    madqn.train(resume=run, steps=500)
    after = safe_load(run / "checkpoints" / "latest.pt")["pool"]["snapshots"]
    assert [s["step"] for s in after] == [400, 450, 500]
    assert all(torch.equal(after[0]["weights"][0][k], pool[2]["weights"][0][k]) for k in pool[2]["weights"][0])


@pytest.mark.parametrize("changes, message", [
    (dict(pool_every=10, random_opponent=0.6, pool_prob=0.5), "must add up to at most 1"),
    (dict(pool_every=10, pool_sampling="elo"), "pool_sampling"),
])
def test_bad_pool_settings_are_one_clear_line(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**TINY, **changes)


class _Episodes(Hook):
    """A hook keeping the episode records the learner receives (what episodes.csv writes)."""

    def __init__(self):
        self.records = []
        self.weights = {}  # agent step -> the learner's online weights after that step's learning round

    def on_step(self, trainer):
        self.weights[trainer.step] = [{k: v.clone() for k, v in n.state_dict().items()}
                                      for n in trainer.learners.online_networks]

    def on_episode(self, trainer, record):
        self.records.append(record)


def _same_weights(a, b):
    return all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_actor_processes_play_the_learners_snapshots_and_its_pool_keeps_their_record(sharing):
    """Distributed acting (actors driven in this process, as the process and Ray backends drive them): the
    learner's pool takes the snapshots from the learner's networks on the pool schedule; every actor's pool
    holds the same snapshots with the same weights; the actors play them; the learner's PFSP statistics are
    the networks' points in the episodes the actors reported."""
    from madqn.training.distributed import DistributedTrainer

    episodes = _Episodes()
    cfg = Config(**{**TINY, "rollout_len": 16}, steps=800, learn_start=100, actors=2, sharing=sharing, sync_every=2,
                 target_q=100, pool_every=160, pool_size=3, pool_prob=0.5, pool_sampling="pfsp", seed=3)
    trainer = DistributedTrainer(cfg, hooks=[episodes], pool="inline")
    try:
        trainer.run()
        pool = trainer.acting.pool
        assert pool.steps() == (480, 640, 800)  # batches of 16 agent steps cross the multiples of 160 on them
        # each snapshot is the learner's networks when the batch that crossed its step arrived (before that
        # batch's learning round): those after the previous batch's round
        for snap in pool.snapshots:
            assert len(snap.weights) == len(trainer.learners.online_networks)
            assert _same_weights(snap.weights, episodes.weights[snap.step - 16])
            assert not _same_weights(snap.weights, episodes.weights[snap.step])  # the learner moves on
        for actor in trainer.pool.actors:  # the actors hold the learner's snapshots (those sent before their last call)
            theirs = actor.acting.pool
            assert theirs.steps() and set(theirs.steps()) <= set(pool.steps()) | {160, 320}
            for snap in theirs.snapshots:
                if pool.get(snap.step) is not None:
                    assert _same_weights(snap.weights, pool.get(snap.step).weights)
        marked = [r for r in episodes.records if r.snapshot_seats]
        assert 0.25 < len(marked) / len([r for r in episodes.records if r.step > 200]) < 0.75
        assert {seat for r in marked for seat in r.snapshot_seats} == {"left", "right"}
        assert {step for r in marked for step in r.snapshot_seats.values()} <= {160, 320, 480, 640}
        games = dict.fromkeys(pool.steps(), 0)
        points = dict.fromkeys(pool.steps(), 0.0)
        for r in marked:
            ((seat, step),) = r.snapshot_seats.items()
            if step in games:
                (other,) = [a for a in r.scores if a != seat]
                games[step] += 1
                points[step] += 1.0 if r.scores[other] > r.scores[seat] else 0.5 if r.scores[other] == r.scores[seat] \
                    else 0.0
        assert sum(games.values()) > 0
        assert {s.step: (s.games, s.points) for s in pool.snapshots} == {k: (games[k], points[k]) for k in games}
        # the pool is in the learner's checkpoint state and comes back into a new learner
        state = trainer.acting.state_dict()
        again = DistributedTrainer(cfg, pool="inline")
        try:
            again.acting.load_state_dict(state)
            got = again.acting.pool
            assert [(s.step, s.games, s.points) for s in got.snapshots] == \
                [(s.step, s.games, s.points) for s in pool.snapshots]
            assert all(_same_weights(a.weights, b.weights) for a, b in zip(got.snapshots, pool.snapshots))
        finally:
            again.close()
    finally:
        trainer.close()


def test_an_actor_pool_takes_what_the_learners_pool_sends_and_reports_what_it_holds():
    """changes/apply: only missing snapshots' weights travel; dropped ones go; statistics follow the learner's;
    a kept snapshot the actor never received (a call sent before it restarted) stays out until one brings it."""
    learner, actor = OpponentPool(every=10, size=2, sampling="pfsp"), OpponentPool(every=10, size=2, sampling="pfsp")
    net = torch.nn.Linear(2, 2)
    learner.add(10, [net])
    first = learner.changes(actor.steps())
    assert [n["step"] for n in first["new"]] == [10]
    actor.apply(first)
    assert actor.steps() == (10,) and learner.changes(actor.steps())["new"] == []
    learner.result(10, 1.0)
    learner.add(20, [net])
    learner.add(30, [net])  # size 2: 10 is dropped
    actor.apply(learner.changes(actor.steps()))
    assert actor.steps() == (20, 30)
    assert [(s.games, s.points) for s in actor.snapshots] == [(0, 0.0), (0, 0.0)]
    learner.result(30, 0.5)
    stale = learner.changes((20, 30))  # computed for an actor that held both; a fresh actor gets it
    fresh = OpponentPool(every=10, size=2)
    fresh.apply(stale)
    assert fresh.steps() == ()
    fresh.apply(learner.changes(fresh.steps()))
    assert fresh.steps() == (20, 30) and [(s.games, s.points) for s in fresh.snapshots] == [(0, 0.0), (1, 0.5)]
    np.testing.assert_allclose(fresh.probabilities(), learner.probabilities())


def test_process_backend_with_the_pool_trains_marks_snapshot_seats_and_resumes(tmp_path):
    """A real run with an actor process: episodes.csv marks the seats the learner's snapshots played; the
    checkpoint keeps the pool and --resume goes on with it."""
    run = tmp_path / "run"
    args = ["train", "--env", CATCH, "--backend", "process", "--steps", "640", "--run-dir", run,
            "--set", "replay_memory=500", "--set", "learn_start=100", "--set", "hist_len=2", "--set", "mlp_hidden=[16]",
            "--set", "eval_freq=0", "--set", "valid_size=0", "--set", "final_eval_episodes=0", "--set", "save_freq=320",
            "--set", "rollout_len=16", "--set", "pool_every=160", "--set", "pool_size=2", "--set", "device='cpu'"]
    done = run_madqn(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    state = safe_load(run / "checkpoints" / "latest.pt")
    assert [s["step"] for s in state["pool"]["snapshots"]] == [480, 640]
    marked = [r for r in read_csv(run / "episodes.csv") if r["snapshot_step"]]
    assert marked and {int(r["snapshot_step"]) for r in marked} <= {160, 320, 480}
    resumed = run_madqn("train", "--resume", run, "--steps", "960", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = safe_load(run / "checkpoints" / "latest.pt")["pool"]["snapshots"]
    assert [s["step"] for s in after] == [800, 960]
    marked = [r for r in read_csv(run / "episodes.csv") if r["snapshot_step"] and int(r["step"]) > 640]
    assert marked and {int(r["snapshot_step"]) for r in marked} <= {480, 640, 800}


def test_pool_games_pair_the_networks_of_each_period_with_the_snapshot_they_played():
    from madqn.evaluation.rating import pool_games

    def episode(n, step, left, right, snapshot_seat=None, snapshot=None, random_seat=None):
        return [{"episode": str(n), "step": str(step), "agent": a, "score": str(score),
                 "snapshot_step": str(snapshot) if a == snapshot_seat else "",
                 "random_seat": "1" if a == random_seat else "0"} for a, score in (("left", left), ("right", right))]

    rows = (episode(1, 120, 1, -1, "right", 100)  # networks of (100, 200] beat snapshot 100
            + episode(2, 150, -1, 1)  # plain self-play: not a pool game
            + episode(3, 200, 0, 0, "left", 100)  # step 200 still belongs to (100, 200]: a draw
            + episode(4, 250, -1, 1, "right", 200)  # networks of (200, 300] lose to snapshot 200
            + episode(5, 260, 1, -1, "left", 100, random_seat="right")  # only a random player beside: skipped
            + episode(6, 300, 1, -1, "right", 300))  # the snapshot taken at this very step: itself, skipped
    assert pool_games(rows, every=100) == [("step 200", "step 100", 1.0), ("step 200", "step 100", 0.5),
                                           ("step 300", "step 200", 0.0)]


def test_madqn_pool_rates_a_real_runs_snapshots_and_refuses_a_run_without_a_pool(tmp_path):
    settings = {k: v for k, v in TINY.items() if k != "env"}
    run = tmp_path / "run"
    madqn.train(CATCH, run_dir=run, **settings, steps=600, learn_start=100, sharing="independent",
                pool_every=100, pool_size=3, pool_prob=0.5, seed=4)
    done = run_madqn("pool", run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = read_csv(run / "pool_ratings.csv")
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and steps[0] == 100 and float(rows[0]["rating"]) == 0.0
    assert all(int(r["games"]) > 0 for r in rows) and "Elo relative to step 100" in done.stdout
    plain = tmp_path / "plain"
    madqn.train(CATCH, run_dir=plain, **settings, steps=100, learn_start=50, seed=4)
    refused = run_madqn("pool", plain, cwd=tmp_path)
    assert refused.returncode != 0 and "without an opponent pool" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
