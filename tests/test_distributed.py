"""Distributed acting (madqn.training.distributed): Ape-X epsilons, Ray actors feeding the DQN3.0 learner.

The Ray tests start a real local Ray instance (2 CPUs) and play tests/tiny_catch.py (uint8 vectors).
"""

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from madqn.config import Config
from madqn.training.distributed import DistributedTrainer, apex_epsilons
from madqn.training.trainer import Hook, Trainer

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
TINY = dict(env=CATCH, replay_memory=500, learn_start=100, prog_freq=100, save_freq=1000, eval_freq=0,
            valid_size=0, device="cpu", rollout_len=32, sync_every=5, target_q=100, hist_len=2, mlp_hidden=[32])

from helpers import CountingTrainer, KillActorOnce  # noqa: E402
import ray  # noqa: E402  (the test extra installs it: a missing Ray must fail, not skip)



@pytest.fixture(autouse=True)
def one_ray_instance_at_a_time(tmp_path_factory):
    """The tests check that no Ray process is left behind, so under pytest-xdist (`make test`) they take
    turns: a lock file in the session's temporary directory, shared by the workers."""
    import fcntl

    with open(tmp_path_factory.getbasetemp().parent / "ray-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ray_processes(wait_s: float = 15.0) -> list[str]:
    """Live Ray daemons and workers on this machine (raylet, gcs_server, ray:: workers), after giving a
    shutdown up to ``wait_s`` to finish. Zombies (exited, waiting to be reaped by init) are not processes left
    running and are ignored."""
    deadline = time.time() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
        live = [line for line in out.splitlines()[1:] if not line.split()[1].startswith("Z")
                and any(k in line for k in ("raylet", "gcs_server", "ray::", "default_worker.py"))]
        if not live or time.time() > deadline:
            return live
        time.sleep(0.5)


def test_apex_epsilons_hand_computed():
    # eps_i = 0.4 ** (1 + i * 7 / (N - 1)): N = 3 -> exponents 1, 4.5, 8
    assert apex_epsilons(3) == pytest.approx([0.4, 0.0256 * math.sqrt(0.4), 0.00065536])
    assert apex_epsilons(1) == [0.4]
    assert apex_epsilons(2, eps=0.5, alpha=1.0) == pytest.approx([0.5, 0.25])


def test_apex_run_logs_the_epsilon_each_actor_acted_with(tmp_path):
    """Issue 30 E2: with actor_epsilons = "apex" each episodes.csv row carries the epsilon of the actor that
    played it, as that actor reports it (Ray actor processes), and train.csv / train/epsilon the mean of the
    actors' epsilons; not DQN3.0's schedule (0.99... here), which no actor acted with."""
    from madqn.training.metrics import MetricsHook
    from helpers import read_csv

    class Scalars(Hook):
        def __init__(self):
            self.epsilons = []

        def on_scalars(self, trainer, step, scalars):
            self.epsilons += [scalars["train/epsilon"]] if "train/epsilon" in scalars else []

    class BothActorsPlay(Hook):
        """Until each actor has delivered a batch, wait for the other's outstanding ones after each step (on a
        loaded machine one actor could otherwise finish the run alone while the other starts up)."""

        def on_step(self, trainer):
            for actor in (0, 1):
                if actor not in trainer.acting.incarnations:
                    refs = [ref for ref, a in trainer.pool.pending.items() if a == actor]
                    trainer.pool.ray.wait(refs, num_returns=len(refs), timeout=120)

    scalars = Scalars()
    cfg = Config(**{**TINY, "learn_start": 1000, "prog_freq": 64, "rollout_len": 16}, steps=160, actors=2,
                 sharing="shared", actor_epsilons="apex", backend="ray")
    trainer = DistributedTrainer(cfg, hooks=[MetricsHook(tmp_path), scalars, BothActorsPlay()])
    try:
        trainer.run()
        acted = trainer.pool.ray.get([h.epsilon.remote() for h in trainer.pool.handles])  # asked of the actors
    finally:
        trainer.close()
    assert acted[0] > 0.3 > 0.001 > acted[1]
    rows = read_csv(tmp_path / "episodes.csv")
    assert {int(r["env"]) for r in rows} == {0, 1}  # both actors' episodes (one env copy each)
    for r in rows:
        assert float(r["epsilon"]) == pytest.approx(acted[int(r["env"])], abs=1e-6), r
    mean = sum(acted) / 2
    logged = [float(r["epsilon"]) for r in read_csv(tmp_path / "train.csv")]
    assert logged and logged == pytest.approx([mean] * len(logged), abs=1e-6)
    assert scalars.epsilons and scalars.epsilons == pytest.approx([mean] * len(scalars.epsilons))
    assert trainer.epsilon() == pytest.approx(mean)  # what the progress display shows
    assert not ray_processes()


def _stream_entries(replay, stream, n):
    return (replay.frames[stream, :n].copy(), replay.actions[stream, :n].copy(), replay.rewards[stream, :n].copy(),
            replay.terminal[stream, :n].copy(), replay.episode_end[stream, :n].copy())


def test_ray_first_transitions_equal_local_trainer():
    """Seed 1, one actor, all-random phase: the Ray actor's transitions are the in-process Trainer's."""
    cfg = Config(**{**TINY, "learn_start": 1000}, steps=200, actors=1, sharing="independent")
    local = Trainer(cfg)
    try:
        local.run()
    finally:
        local.close()
    remote = DistributedTrainer(cfg.replace(backend="ray"))
    try:
        remote.run()
    finally:
        remote.close()
    n = 150  # the learner holds back each stream's newest entry; both ran >= 200 steps
    for g_local, g_remote in zip(local.groups, remote.groups):
        assert len(g_remote.replay) >= n
        for a, b in zip(_stream_entries(g_local.replay, 0, n), _stream_entries(g_remote.replay, 0, n)):
            np.testing.assert_array_equal(a, b)
    assert not ray_processes()


class KillRayActorOnce(KillActorOnce):
    """KillActorOnce, then waiting for Ray's restart and for the rebuilt actor 0's first batch."""

    def killed(self, trainer) -> None:
        self.new_pid = trainer.pool.pids()[0]  # waits for Ray's restart (the learner pauses meanwhile)

    def on_step(self, trainer):
        if self.killed_pid is None:
            super().on_step(trainer)
        elif trainer.acting.actor_restarts == 0:
            # until a batch of the rebuilt actor 0 has come in, wait for actor 0's outstanding batches after each
            # step, so that on a loaded machine actor 1 cannot finish the run alone while actor 0 starts up
            refs = [ref for ref, actor in trainer.pool.pending.items() if actor == 0]
            trainer.pool.ray.wait(refs, num_returns=len(refs), timeout=120)


def test_killed_ray_actor_is_replaced_and_nothing_is_counted_twice(capfd):
    # replay large enough not to wrap: an agent's budget is split over the 2 actors' streams, and each stream
    # must hold all the run's entries of that agent, whichever actor makes them (1,200 steps plus one
    # episode-end entry per 4-step episode: 1,500 at most); 30-step batches end mid-episode
    cfg = Config(**{**TINY, "replay_memory": 2 * 1600, "rollout_len": 30}, steps=1200, actors=2, backend="ray",
                 sharing="shared")
    killer = KillRayActorOnce(at=400)
    trainer = CountingTrainer(cfg, hooks=[killer])
    try:
        trainer.run()
        assert killer.killed_pid is not None
        # the kill restarts actor 0 at least once; on a loaded machine Ray may also rebuild an actor after a
        # dropped connection (seen under load: 3 restarts), which must likewise count nothing twice
        assert trainer.acting.actor_restarts >= 1
        assert trainer.step >= cfg.steps
        assert killer.new_pid != killer.killed_pid  # Ray restarted actor 0 in a new process
        assert trainer.pool.pids()[0] == killer.new_pid
        assert trainer.step == trainer.received_steps  # steps come only from received batches
        g = trainer.groups[0]
        # every received entry stored exactly once (the newest entry of each stream is held back until its
        # successor arrives; the lost actor's held entries were stored as truncated final frames)
        assert len(g.replay) == trainer.received_entries - len(trainer.acting.held)
        assert g.updates > 0
    finally:
        trainer.close()
    assert "actor 0 was restarted before step" in capfd.readouterr().err
    assert not ray_processes()


# the independent run repeats the same CLI path with two learners: slow tier
@pytest.mark.parametrize("sharing", ["shared", pytest.param("independent", marks=pytest.mark.slow)])
def test_cli_ray_backend_trains_and_writes_the_local_run_directory(tmp_path, madqn_cli, sharing):
    common = ["--env", CATCH, "--sharing", sharing, "--steps", "600", "--set", "replay_memory=500",
              "--set", "learn_start=100", "--set", "prog_freq=100", "--set", "save_freq=300", "--set", "eval_freq=0",
              "--set", "valid_size=0", "--set", "hist_len=2", "--set", "mlp_hidden=[32]", "--device", "cpu"]
    runs = {}
    for backend in ("local", "ray"):
        run_dir = tmp_path / backend
        extra = ["--backend", "ray", "--actors", "2"] if backend == "ray" else []
        cmd, env = madqn_cli("train", *common, *extra, "--run-dir", run_dir)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[backend] = run_dir
    files = {b: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and "events" not in p.name)
             for b, d in runs.items()}
    assert files["ray"] == files["local"]
    import csv

    rows = list(csv.DictReader(open(runs["ray"] / "train.csv")))
    assert rows and int(rows[-1]["updates"]) >= (600 - 100) // 4 - 8  # DQN3.0's ratio on the steps received
    assert all(r["abs_delta"] != "nan" for r in rows if int(r["step"]) > 200)
    config = (runs["ray"] / "config.toml").read_text()
    assert 'backend = "ray"' in config and "actors = 2" in config
    assert not ray_processes()


def test_resumed_ray_run_with_saved_replay_ends_the_interrupted_episodes(tmp_path):
    """B3: the actors of a resumed Ray run start fresh episodes, so every replay stream must end its
    interrupted episode (at the newest frame the learner received) before new frames arrive; the streams
    were left open and the next episode's frames were stacked onto the old ones."""
    from madqn.api import _restore
    from madqn.training.checkpoint import atomic_save, replay_state, safe_load, trainer_state

    # 30-step batches end mid-episode (episodes last 5 steps); the replay (1000 per stream) never wraps
    cfg = Config(**{**TINY, "replay_memory": 2000, "rollout_len": 30}, steps=90, actors=2, sharing="independent",
                 save_replay=True)
    first = DistributedTrainer(cfg, pool="inline")
    try:
        first.run()
        ckpt = tmp_path / "checkpoints"
        ckpt.mkdir()
        atomic_save(replay_state(first), ckpt / "replay.pt")
        atomic_save(trainer_state(first), ckpt / "latest.pt")
        open_streams = {(g.name, s) for g in first.groups for s in range(g.replay.n_streams)
                        if g.replay.written[s] and not g.replay.episode_end[s, g.replay.written[s] - 1]}
    finally:
        first.close()
    assert open_streams  # the interruption falls inside episodes
    resumed = DistributedTrainer(cfg.replace(steps=200), pool="inline")
    try:
        _restore(resumed, safe_load(ckpt / "latest.pt"), ckpt / "latest.pt", tmp_path)
        for g in resumed.groups:
            for s in range(g.replay.n_streams):
                n = int(g.replay.written[s])
                assert n > 0 and g.replay.episode_end[s, n - 1], (g.name, s)
                assert not g.replay.terminal[s, n - 1] or (g.name, s) not in open_streams  # a truncation
    finally:
        resumed.close()


def test_replay_memory_is_split_over_all_actors_copies():
    """2 actors x 2 env copies: replay_memory = 500 gives each of an agent's 4 streams 125 entries."""
    cfg = Config(**{**TINY, "num_envs": 2, "vector_env": "inline"}, steps=64, actors=2, sharing="independent")
    trainer = DistributedTrainer(cfg, pool="inline")
    try:
        for g in trainer.groups:
            assert (g.replay.n_streams, g.replay.capacity) == (4, 125)
    finally:
        trainer.close()


class EpisodeRecorder(Hook):
    def __init__(self):
        self.records = []

    def on_episode(self, trainer, record):
        self.records.append(record)


@pytest.mark.slow  # a Ray instance of its own; the acting loop it runs is tested without Ray in test_acting.py
def test_ray_actors_draw_random_seats_and_the_learner_records_them():
    """random_opponent on the Ray backend: the actor draws the random seats, its episode records carry them to
    the learner's hooks (what episodes.csv writes), about one episode in two."""
    recorder = EpisodeRecorder()
    cfg = Config(**TINY, steps=400, actors=1, sharing="shared", random_opponent=0.5, backend="ray")
    remote = DistributedTrainer(cfg, hooks=[recorder])
    try:
        remote.run()
    finally:
        remote.close()
    drawn = [r.random_seats for r in recorder.records]
    assert len(drawn) >= 90 and all(len(seats) <= 1 for seats in drawn)  # a tiny_catch episode is 4 steps
    assert 0.3 < sum(map(bool, drawn)) / len(drawn) < 0.7
    assert {seats[0] for seats in drawn if seats} == {"left", "right"}
    assert not ray_processes()


def test_lost_ray_actor_gets_max_in_flight_batches_again_and_a_dead_one_stops_the_run_in_one_line(
        capfd, monkeypatch):
    """Issue 30 E7, on a cluster without task retries (Ray's max_task_retries = 0): a killed actor's outstanding
    batches fail (ActorLost) while Ray restarts it; the learner must give it max_in_flight batches again, not one.
    An actor that stays dead (killed without restart) must stop the run with one clear error after a few
    tries, not loop printing a line per try."""
    from madqn.errors import MadqnError
    from madqn.training.distributed import RayPool

    monkeypatch.setattr(RayPool, "task_retries", 0)

    class KillThenKillForGood(Hook):
        def __init__(self):
            self.killed_pid = None
            self.in_flight_after_loss = []
            self.dead = False

        def on_step(self, trainer):
            pool = trainer.pool
            if self.killed_pid is None and trainer.step >= 100:
                self.killed_pid = pool.pids()[0]
                os.kill(self.killed_pid, signal.SIGKILL)
            elif self.killed_pid is not None and trainer.acting.actor_restarts and not self.dead:
                self.in_flight_after_loss.append(pool.in_flight(0))
                if self.in_flight_after_loss.count(trainer.config.max_in_flight) >= 3:
                    pool.ray.kill(pool.handles[0], no_restart=True)
                    self.dead = True

    hook = KillThenKillForGood()
    cfg = Config(**{**TINY, "rollout_len": 16}, steps=100_000, actors=2, sharing="shared", backend="ray")
    trainer = DistributedTrainer(cfg, hooks=[hook])
    try:
        with pytest.raises(MadqnError, match=r"actor 0 was lost 3 times in a row without delivering a batch"):
            trainer.run()
    finally:
        trainer.close()
    assert cfg.max_in_flight in hook.in_flight_after_loss and hook.dead
    err = capfd.readouterr().err
    assert err.count("actor 0 was lost") <= 3, err
    assert not ray_processes()


def test_ray_run_that_fails_to_start_after_its_actors_exist_shuts_ray_down():
    """Issue 30 E7: a replay too large for the machine is refused after the actor pool started: Ray must not
    be left running (this process started it)."""
    from madqn.errors import MadqnError

    cfg = Config(**{**TINY, "replay_memory": 10**12}, steps=100, actors=1, backend="ray")
    try:
        with pytest.raises(MadqnError, match="the replay memory needs"):
            DistributedTrainer(cfg)
        assert not ray.is_initialized()
        assert not ray_processes()
    finally:
        ray.shutdown()


def test_ray_actors_receive_the_learners_snapshots_and_play_them():
    """The opponent pool on the Ray backend: the learner's snapshots reach the Ray actors (each reports the
    snapshots it holds with its batches, all of them the learner's), snapshot seats come back in the episode
    records, and the learner's pool counts the results."""
    recorder = EpisodeRecorder()
    cfg = Config(**{**TINY, "rollout_len": 16}, steps=640, actors=2, sharing="shared", pool_every=160, pool_size=2,
                 pool_prob=0.5, backend="ray")
    remote = DistributedTrainer(cfg, hooks=[recorder])
    try:
        remote.run()
        learner = remote.acting.pool
        reported = remote.acting.actor_snapshots
    finally:
        remote.close()
    assert learner.steps() == (480, 640)
    # what each actor held after its last batch (Ray may have run one actor's batches mostly before step 160)
    assert set(reported) == {0, 1}
    assert set().union(*reported.values()) and set().union(*reported.values()) <= {160, 320, 480}
    marked = [r for r in recorder.records if r.snapshot_seats]
    assert marked and {s for r in marked for s in r.snapshot_seats.values()} <= {160, 320, 480}
    assert sum(s.games for s in learner.snapshots) == sum(
        1 for r in marked if next(iter(r.snapshot_seats.values())) in learner.steps())
    assert not ray_processes()
