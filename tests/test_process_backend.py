"""``backend = "process"``: actor processes on this machine feed the learner in this process, at DQN3.0's
replay ratio. Real worker processes, real envs (tests/tiny_catch.py, envs/catch.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import madqn
from madqn.config import Config
from madqn.errors import MadqnError
from madqn.training.distributed import ACTOR_MEMORY, DistributedTrainer, check_actor_processes
from madqn.training.learners import learning_rounds

from helpers import CountingTrainer, KillActorOnce, read_csv
from test_learning import check_learned

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
SMALL_CATCH = f"{ROOT / 'envs' / 'catch.py'}:make_small_env"
TINY = dict(env=CATCH, replay_memory=4000, learn_start=100, prog_freq=100, save_freq=1000, eval_freq=0,
            valid_size=0, device="cpu", rollout_len=30, sync_every=5, target_q=100, hist_len=2, mlp_hidden=[32],
            backend="process", num_threads=1)


def expected_updates(config: Config, step: int) -> int:
    return learning_rounds(0, step, config.learn_start, config.update_freq) * config.n_replay


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_the_learner_keeps_dqn3_replay_ratio(sharing):
    """Updates are DQN3.0's count for the agent steps received, exactly, however the two processes' speeds
    compare (the actors wait for the learner), and the steps are the actor's batches, none lost."""
    cfg = Config(**TINY, steps=900, sharing=sharing, update_freq=2, n_replay=1)
    trainer = CountingTrainer(cfg, pool="process")
    try:
        trainer.run()
        assert trainer.step >= cfg.steps and trainer.step == trainer.received_steps
        for g in trainer.groups:
            assert g.updates == expected_updates(cfg, trainer.step) > 300
        assert trainer.episodes > 0
    finally:
        trainer.close()
    assert all(not p.is_alive() for p in _processes(trainer))


def _processes(trainer):
    import multiprocessing

    return [c for c in multiprocessing.active_children() if c.name.startswith("madqn-actor")]


def test_killed_actor_process_is_restarted_and_nothing_is_counted_twice(capfd):
    cfg = Config(**TINY, steps=1200, actors=2, sharing="shared")
    killer = KillActorOnce(at=400)
    trainer = CountingTrainer(cfg, hooks=[killer], pool="process")
    try:
        trainer.run()
        assert killer.killed_pid is not None
        assert trainer.pool.pids()[0] != killer.killed_pid
        assert trainer.acting.actor_restarts >= 1  # the new actor's first batch closed the old episodes
        assert trainer.step >= cfg.steps and trainer.step == trainer.received_steps
        g = trainer.groups[0]
        assert len(g.replay) == trainer.received_entries - len(trainer.acting.held)
        assert g.updates == expected_updates(cfg, trainer.step)
    finally:
        trainer.close()
    err = capfd.readouterr().err
    assert "actor 0 died" in err and "starting it again" in err
    assert "actor 0 was restarted before step" in err  # its episodes were ended in replay


def test_the_process_backend_needs_an_env_spec_string():
    factory = madqn.envs.adapters.load_env_factory(CATCH)
    with pytest.raises(MadqnError, match="backend = 'process' needs the env as a spec string"):
        DistributedTrainer(Config(**TINY, steps=100), env=factory, pool="process")


def test_actor_processes_that_would_not_fit_in_memory_are_refused_before_any_starts(tmp_path, madqn_cli):
    assert check_actor_processes(2, cores=2, available=2 * ACTOR_MEMORY) is None
    assert "3 actor processes and the learner on 2 cores" in check_actor_processes(3, cores=2, available=None)
    with pytest.raises(MadqnError, match="actors = 3 actor processes need about 0.8 GB"):
        check_actor_processes(3, cores=8, available=3 * ACTOR_MEMORY - 1)
    # from the command line: one line, exit 2, no run directory written, no actor started
    cmd, env = madqn_cli("train", "--env", CATCH, "--backend", "process", "--actors", "100000",
                         "--run-dir", tmp_path / "run")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "actors = 100000 actor processes need about 25600.0 GB" in done.stderr
    assert not (tmp_path / "run").exists()


def test_cli_process_backend_trains_resumes_and_keeps_the_ratio(tmp_path, madqn_cli):
    run = tmp_path / "run"
    common = ["--env", CATCH, "--backend", "process", "--set", "replay_memory=2000", "--set", "learn_start=100",
              "--set", "prog_freq=100", "--set", "save_freq=300", "--set", "eval_freq=0", "--set", "valid_size=0",
              "--set", "rollout_len=30", "--set", "hist_len=2", "--set", "mlp_hidden=[32]",
              "--set", "final_eval_episodes=2", "--set", "save_replay=true"]
    for args in (["train", *common, "--steps", "600", "--run-dir", run], ["train", "--resume", run, "--steps", "900"]):
        cmd, env = madqn_cli(*args)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "acting in 1 process actor, learning in this process" in done.stdout
    rows = read_csv(run / "train.csv")
    last = rows[-1]
    assert int(last["step"]) >= 900
    cfg = madqn.make_config(run / "config.toml")
    assert cfg.backend == "process"
    assert int(last["updates"]) == expected_updates(cfg, int(last["step"]))


@pytest.mark.parametrize("sharing", ["shared", pytest.param("independent", marks=pytest.mark.slow)])
def test_process_backend_with_the_compiled_learner_learns_small_catch(tmp_path, sharing):
    """The two-core fast path together (actor process + compiled learner) still learns catch, by the same
    rule as the in-process learner (tests/test_learning.py)."""
    result = madqn.train(SMALL_CATCH, ROOT / "configs" / "catch_small.toml", run_dir=tmp_path / "run",
                         backend="process", compile=True, sharing=sharing)
    check_learned(result, madqn.envs.adapters.load_env_factory(SMALL_CATCH))
    rows = read_csv(tmp_path / "run" / "train.csv")
    cfg = madqn.make_config(tmp_path / "run" / "config.toml")
    assert int(rows[-1]["updates"]) == expected_updates(cfg, int(rows[-1]["step"]))
