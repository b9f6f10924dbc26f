"""End-to-end: the CLI and the library train on the real pong_v3 emulator with real gradient updates."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import madqn
from madqn.training.checkpoint import safe_load
from madqn.config import make_config
from madqn.training.trainer import Trainer
from helpers import read_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"


def madqn_cmd(*args):
    """Run the CLI from this checkout (not whichever madqn is installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return [sys.executable, "-m", "madqn", *args], env


# independent networks on Atari are also trained by tests/test_export.py; the CLI repeat is in the slow tier
@pytest.mark.parametrize("sharing", ["shared", pytest.param("independent", marks=pytest.mark.slow)])
def test_cli_train_pong_does_gradient_updates(tmp_path, sharing):
    run_dir = tmp_path / "run"
    cmd, env = madqn_cmd("train", "--env", "pong_v3", "--config", str(SMOKE),
                         "--sharing", sharing, "--run-dir", str(run_dir), "--seed", "3")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "done: 300 agent steps" in proc.stdout
    config = make_config(run_dir / "config.toml")
    assert config.sharing == sharing and config.seed == 3 and config.steps == 300
    rows = read_csv(run_dir / "train.csv")
    learners = {"shared"} if sharing == "shared" else {"first_0", "second_0"}
    assert {r["learner"] for r in rows} == learners
    # learning starts after step 100, one update every 4 steps: (300 - 100) / 4 = 50 updates per learner
    final = {r["learner"]: int(r["updates"]) for r in rows if int(r["step"]) == 300}
    assert final == {name: 50 for name in learners}
    assert all(np.isfinite(float(r["abs_delta"])) for r in rows if int(r["updates"]) > 0)
    episodes = read_csv(run_dir / "episodes.csv")
    assert {r["agent"] for r in episodes} == {"first_0", "second_0"}  # max_cycles 150: two episodes
    assert all(r["truncated"] == "1" for r in episodes)
    state = safe_load(run_dir / "checkpoints" / "latest.pt")
    assert state["step"] == 300
    assert set(state["groups"]) == learners
    n_in = state["groups"][next(iter(learners))]["learner"]["online"]["conv1.weight"].shape[1] \
        if "conv1.weight" in state["groups"][next(iter(learners))]["learner"]["online"] else None
    if n_in is not None:
        assert n_in == (4 + 2 if sharing == "shared" else 4)


def run_short(seed, **overrides):
    cfg = make_config(SMOKE, {"seed": seed, "steps": 200, "sharing": "shared", **overrides})
    trainer = Trainer(cfg)
    g = trainer.groups[0]
    stats, update = [], g.learner.update
    g.learner.update = lambda *a, **k: (lambda out: stats.append(float(out["abs_delta"])) or out)(update(*a, **k))
    trainer.run()
    trainer.close()
    replay = g.replay.state_dict()
    params = [p.detach().clone() for p in g.learner.online_network.parameters()]
    return stats, replay, params


def test_same_seed_same_actions_and_losses():
    s1, r1, p1 = run_short(7)
    s2, r2, p2 = run_short(7)
    assert len(s1) == 25 and s1 == s2
    assert np.array_equal(r1["actions"], r2["actions"])
    assert np.array_equal(r1["frames"], r2["frames"])
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    s3, r3, _ = run_short(8)
    assert not np.array_equal(r1["actions"], r3["actions"])


def test_library_train_returns_result(tmp_path):
    result = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "lib", steps=120, learn_start=40, sharing="independent")
    assert result.steps == 120 and result.updates == {"first_0": 20, "second_0": 20}
    assert result.checkpoint.is_file() and (result.run_dir / "config.toml").is_file()


def test_cli_train_single_agent_gymnasium_pong(tmp_path):
    """`--env ALE/Pong-v5`: ale-py's single-player Pong as a one-agent env, through the same runner."""
    run_dir = tmp_path / "run"
    cmd, env = madqn_cmd("train", "--env", "ALE/Pong-v5", "--config", str(SMOKE), "--run-dir", str(run_dir))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "done: 300 agent steps" in proc.stdout
    rows = read_csv(run_dir / "train.csv")
    final = {r["learner"]: int(r["updates"]) for r in rows if int(r["step"]) == 300}
    assert final == {"player_0": 50}  # (300 - 100) / 4
    episodes = read_csv(run_dir / "episodes.csv")
    assert [r["agent"] for r in episodes] == ["player_0", "player_0"]  # max_cycles 150
    assert make_config(run_dir / "config.toml").env == "ALE/Pong-v5"
    assert safe_load(run_dir / "checkpoints" / "latest.pt")["agents"] == ["player_0"]

    cmd, env = madqn_cmd("train", "--env", "ALE/Pongg-v5", "--config", str(SMOKE), "--run-dir", str(tmp_path / "bad"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "did you mean 'ALE/Pong-v5'" in proc.stderr


def test_learn_start_zero_waits_for_a_sampleable_replay():
    """learn_start = 0, update_freq = 1: the first steps have no complete transition yet; their learning
    rounds are skipped (DQN3.0 learns only once the table can give a minibatch) instead of raising
    'cannot sample from an empty replay memory'. The first update happens at the first round after a
    transition (s, a, r, s2) is stored: step 2 stores it (after step 2's learning round), so step 3."""
    cfg = make_config(None, {"env": str(ROOT / "tests" / "tiny_catch.py") + ":make", "steps": 3, "hist_len": 1,
                             "mlp_hidden": [8], "replay_memory": 100, "learn_start": 0, "update_freq": 1,
                             "minibatch_size": 4, "target_q": 0, "prog_freq": 100, "valid_size": 0,
                             "device": "cpu", "sharing": "shared"})
    with Trainer(cfg) as trainer:
        updates = []
        for _ in range(3):
            trainer.env_step()
            updates.append(trainer.groups[0].updates)
        assert updates == [0, 0, 1]


def test_replay_memory_is_an_agents_budget_over_its_env_copies():
    """replay_memory = 600 with num_envs = 3: each of an agent's 3 streams holds 200 entries, 600 in all
    (DQN3.0's replay window, not 3x it); with a shared network the learner's memory holds 2 agents' budgets."""
    for sharing, n_agents_per_group in (("independent", 1), ("shared", 2)):
        cfg = make_config(None, {"env": str(ROOT / "tests" / "tiny_catch.py") + ":make", "num_envs": 3,
                                 "vector_env": "inline", "replay_memory": 600, "hist_len": 2, "mlp_hidden": [8],
                                 "device": "cpu", "sharing": sharing})
        with Trainer(cfg) as trainer:
            for g in trainer.groups:
                assert g.replay.n_streams == 3 * n_agents_per_group
                assert g.replay.capacity * g.replay.n_streams == 600 * n_agents_per_group


def test_cli_refuses_a_replay_that_does_not_fit_in_memory(madqn_cli, tmp_path):
    """10**13 transitions of 25 float32 values do not fit: one line with both figures and the key, exit 2."""
    cmd, env = madqn_cli("train", "--env", str(ROOT / "tests" / "tiny_catch.py") + ":make", "--set",
                         "replay_memory=10000000000000", "--run-dir", tmp_path / "run")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("madqn: error: the replay memory needs ")
    assert "GB when full, but only " in lines[0] and "lower replay_memory (now 10000000000000" in lines[0]


def test_replay_split_too_small_to_sample_is_refused():
    cfg = make_config(None, {"env": str(ROOT / "tests" / "tiny_catch.py") + ":make", "num_envs": 4,
                             "vector_env": "inline", "replay_memory": 100, "device": "cpu"})
    with pytest.raises(madqn.MadqnError, match=r"replay_memory = 100 split over 4 env copies leaves 25 entries per "
                                               r"copy; each needs at least hist_len \+ minibatch_size \(36\)"):
        Trainer(cfg)


def test_learn_updates_only_the_groups_it_is_given():
    """``LearnerSet.learn(step, groups=...)``: one learner's update alone (madqn bench times one learner)."""
    cfg = make_config(None, {"env": str(ROOT / "tests" / "tiny_catch.py") + ":make", "vector_env": "inline",
                             "replay_memory": 600, "hist_len": 2, "mlp_hidden": [8], "device": "cpu",
                             "sharing": "independent", "learn_start": 10**6})
    with Trainer(cfg) as trainer:
        while not all(g.replay.can_sample() for g in trainer.groups):
            trainer.env_step()
        first, second = trainer.groups
        before = [p.detach().clone() for p in second.learner.online_network.parameters()]
        trainer.learners.learn(trainer.step, groups=[first])
        assert (first.updates, second.updates) == (1, 0)
        assert all(torch.equal(p, b) for p, b in zip(second.learner.online_network.parameters(), before))
        trainer.learners.learn(trainer.step)
        assert (first.updates, second.updates) == (2, 1)
