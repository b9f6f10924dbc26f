"""Runs that survive: checkpoints, kill -9, signals, full disk, NaN guard and resume on the real pong_v3 emulator.

Subprocess tests run this checkout's CLI (``madqn_cli`` fixture) and kill it for real (SIGKILL,
SIGINT, SIGTERM); faults inside a checkpoint write come from the documented MADQN_FAULT test hook.
"""

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import madqn
from madqn.training.checkpoint import REPLAY_KIND, safe_load
from madqn.errors import ConfigError, MadqnError
from helpers import read_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"
# smoke.toml: learn_start 100, update_freq 4, prog_freq 100, max_cycles 150; here rows every 50 steps
# and a checkpoint every 100
FAST = ["--config", str(SMOKE), "--set", "prog_freq=50", "--set", "save_freq=100", "--set", "num_threads=1",
        "--set", "minibatch_size=8"]


def latest(run_dir):
    return safe_load(Path(run_dir) / "checkpoints" / "latest.pt")


def run_cli(madqn_cli, *args, extra_env=None, timeout=300):
    cmd, env = madqn_cli(*args)
    env.update(extra_env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def start_cli(madqn_cli, tmp_path, *args, extra_env=None):
    cmd, env = madqn_cli(*args)
    env.update(extra_env or {})
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def wait_for_line(stream, needle, timeout=120):
    """Read lines until one contains ``needle``; returns the lines read."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} never appeared; got {lines}")


def assert_metrics_continuous(run_dir, steps, learners, prog_freq=50, extra_steps=()):
    """train.csv: exactly one row per learner at every prog_freq multiple up to steps (plus stop rows);
    episodes.csv: episode numbers 1..n, one row per agent each, steps strictly increasing."""
    rows = read_csv(run_dir / "train.csv")
    counts = Counter((int(r["step"]), r["learner"]) for r in rows)
    assert max(counts.values()) == 1, f"duplicated train.csv rows: {counts}"
    expected = sorted({*range(prog_freq, steps + 1, prog_freq), steps, *extra_steps})
    for learner in learners:
        assert sorted(s for s, name in counts if name == learner) == expected
    episodes = read_csv(run_dir / "episodes.csv")
    per_episode = Counter(int(r["episode"]) for r in episodes)
    assert sorted(per_episode) == list(range(1, len(per_episode) + 1))
    assert set(per_episode.values()) == {2}
    ends = [int(r["step"]) for r in episodes][::2]
    assert ends == sorted(set(ends))
    return rows, episodes


# ---- resume equivalence -----------------------------------------------------------------------

def test_resume_with_replay_equals_uninterrupted_run(tmp_path):
    """Train 230 steps, stop, resume to 300 == 300 steps in one go: same weights, optimizer, actions."""
    common = dict(sharing="shared", save_replay=True, seed=5, num_threads=1, minibatch_size=8,
                  handle_signals=False)
    first = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "split", steps=230, **common)
    assert first.steps == 230 and first.stopped_by is None
    resumed = madqn.train(resume=tmp_path / "split", steps=300, handle_signals=False)
    whole = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "whole", steps=300, **common)
    assert resumed.resumed_from == 230 and resumed.steps == whole.steps == 300
    assert resumed.updates == whole.updates == {"shared": 50}
    assert resumed.episodes == whole.episodes == 2

    a, b = latest(tmp_path / "split"), latest(tmp_path / "whole")
    assert a["step"] == b["step"] == 300 and a["episodes"] == b["episodes"]
    la, lb = a["groups"]["shared"]["learner"], b["groups"]["shared"]["learner"]
    for net in ("online", "target"):
        assert la[net].keys() == lb[net].keys()
        for k in la[net]:
            assert torch.equal(la[net][k], lb[net][k]), f"{net}.{k}"
    for pa, pb in zip(la["optimizer"]["state"].values(), lb["optimizer"]["state"].values()):
        assert torch.equal(pa["g"], pb["g"]) and torch.equal(pa["g2"], pb["g2"])
    # the replay memory (capacity 1000 > 300) holds every action and frame of the run
    ra = safe_load(tmp_path / "split" / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"]["shared"]
    rb = safe_load(tmp_path / "whole" / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"]["shared"]
    assert int(ra["written"].sum()) > 500
    for k in ("actions", "frames", "rewards", "terminal", "episode_end", "written"):
        assert torch.equal(ra[k], rb[k]), k
    assert len(set(ra["actions"][0, :300].tolist())) > 1

    ea, eb = read_csv(tmp_path / "split" / "episodes.csv"), read_csv(tmp_path / "whole" / "episodes.csv")
    drop = lambda rows, keys: [{k: v for k, v in r.items() if k not in keys} for r in rows]  # noqa: E731
    assert drop(ea, {"wall_time"}) == drop(eb, {"wall_time"})
    # train.csv: the uninterrupted rows, plus the stop row at 230 (its statistics carry on into 300)
    ta = drop(read_csv(tmp_path / "split" / "train.csv"), {"wall_time", "steps_per_s"})
    tb = drop(read_csv(tmp_path / "whole" / "train.csv"), {"wall_time", "steps_per_s"})
    assert [r for r in ta if r["step"] != "230"] == tb
    assert [r["updates"] for r in ta if r["step"] == "230"] == ["32"]


def test_resume_with_replay_frames_on_the_learners_device_equals_the_uninterrupted_host_run(tmp_path):
    """replay_device = "learner" (the frames copied to the learner's device, batches gathered there), stopped
    and resumed (the device copy rebuilt from replay.pt), ends with the weights of an uninterrupted run that
    gathers its batches on the host."""
    common = dict(sharing="shared", save_replay=True, seed=5, num_threads=1, minibatch_size=8, handle_signals=False)
    madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "split", steps=230, replay_device="learner", **common)
    resumed = madqn.train(resume=tmp_path / "split", steps=300, handle_signals=False)
    whole = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "whole", steps=300, **common)
    assert resumed.updates == whole.updates == {"shared": 50}
    a, b = latest(tmp_path / "split"), latest(tmp_path / "whole")
    la, lb = a["groups"]["shared"]["learner"], b["groups"]["shared"]["learner"]
    for net in ("online", "target"):
        for k in la[net]:
            assert torch.equal(la[net][k], lb[net][k]), f"{net}.{k}"


# ---- kill -9 ------------------------------------------------------------------------------------

def test_kill_9_between_checkpoints_then_resume(madqn_cli, tmp_path):
    run = tmp_path / "run"
    proc = start_cli(madqn_cli, tmp_path, "train", "--run-dir", run, "--steps", "100000", *FAST)
    wait_for_line(proc.stdout, "step 250/")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(int(r["step"]) for r in read_csv(run / "train.csv"))
    saved = latest(run)["step"]
    assert saved % 100 == 0 and 200 <= saved <= killed_at

    done = run_cli(madqn_cli, "train", "--resume", run, "--steps", "400")
    assert done.returncode == 0, done.stderr
    assert f"resuming {run} at step {saved}: replay memory not saved" in done.stdout
    assert "done: 400 agent steps" in done.stdout
    state = latest(run)
    assert state["step"] == 400 and state["episodes"] == 2
    rows, episodes = assert_metrics_continuous(run, 400, ["first_0", "second_0"])
    # learning: steps 100..saved, then the empty memory refills for learn_start = 100 steps:
    # (saved - 100) / 4 + (400 - saved - 100) / 4 = 50 updates per learner whatever `saved` is
    assert {r["learner"]: int(r["updates"]) for r in rows if r["step"] == "400"} == {"first_0": 50, "second_0": 50}
    assert {g["updates"] for g in state["groups"].values()} == {50}
    # the episode running at the checkpoint went on: two full 150-step episodes, ending at 149 and 299
    assert [(int(r["step"]), int(r["length"])) for r in episodes] == [(149, 150)] * 2 + [(299, 150)] * 2


def test_kill_9_while_writing_a_checkpoint_keeps_the_previous_one(madqn_cli, tmp_path):
    run = tmp_path / "run"
    proc = run_cli(madqn_cli, "train", "--run-dir", run, "--steps", "300", *FAST,
                   extra_env={"MADQN_FAULT": "checkpoint_write:2"})
    assert proc.returncode == -signal.SIGKILL
    leftovers = list((run / "checkpoints").glob(".latest.pt.tmp-*"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # the half-written file
    assert latest(run)["step"] == 100  # the previous checkpoint loads

    done = run_cli(madqn_cli, "train", "--resume", run)
    assert done.returncode == 0, done.stderr
    assert "at step 100" in done.stdout and "done: 300 agent steps" in done.stdout
    assert not list((run / "checkpoints").glob(".*tmp*"))
    assert latest(run)["step"] == 300
    assert_metrics_continuous(run, 300, ["first_0", "second_0"])


def test_episode_ending_right_after_the_checkpoint_is_reported_once(tmp_path, monkeypatch):
    """An episode row carries the step its last step began at: with a checkpoint at step 149 the
    episode ending in step 149 -> 150 has step 149 but is not in the checkpoint (trimmed by episode)."""
    import madqn.training.checkpoint

    run = tmp_path / "run"
    monkeypatch.setenv("MADQN_FAULT", "checkpoint_write:2:enospc")  # the final checkpoint (step 160) fails
    monkeypatch.setattr(madqn.training.checkpoint, "_checkpoint_writes", 0)
    with pytest.raises(MadqnError, match="cannot write the checkpoint of step 160"):
        madqn.train("pong_v3", SMOKE, run_dir=run, steps=160, save_freq=149, num_threads=1, handle_signals=False)
    assert latest(run)["step"] == 149 and latest(run)["episodes"] == 0
    assert [(r["step"], r["episode"]) for r in read_csv(run / "episodes.csv")] == [("149", "1")] * 2
    monkeypatch.delenv("MADQN_FAULT")
    madqn.train(resume=run, handle_signals=False)
    assert [(r["step"], r["episode"]) for r in read_csv(run / "episodes.csv")] == [("149", "1")] * 2
    assert latest(run)["episodes"] == 1


# ---- signals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_with_checkpoint_and_resume_line(madqn_cli, tmp_path, sig):
    run = tmp_path / "run"
    proc = start_cli(madqn_cli, tmp_path, "train", "--run-dir", run, "--steps", "100000", *FAST,
                     "--sharing", "shared")
    wait_for_line(proc.stdout, "step 150/")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"{sig.name} received: finishing the current step, then writing a checkpoint" in err
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {sig.name} at step ")
    assert last.endswith(f" -m madqn train --resume {run}")  # this checkout's madqn, run as a module
    stopped = int(last.split(" at step ")[1].split(";")[0])
    assert latest(run)["step"] == stopped >= 150
    rows = read_csv(run / "train.csv")
    assert int(rows[-1]["step"]) == stopped  # metrics flushed up to the stop

    done = run_cli(madqn_cli, "train", "--resume", run, "--steps", str(stopped + 60))
    assert done.returncode == 0, done.stderr
    assert latest(run)["step"] == stopped + 60
    assert_metrics_continuous(run, stopped + 60, ["shared"], extra_steps=[stopped])


def test_second_ctrl_c_exits_at_once_and_keeps_the_last_checkpoint(madqn_cli, tmp_path):
    run = tmp_path / "run"
    proc = start_cli(madqn_cli, tmp_path, "train", "--run-dir", run, "--steps", "100000", *FAST,
                     extra_env={"MADQN_FAULT": "checkpoint_write:2:stall"})
    wait_for_line(proc.stderr, "stalled in the middle of a checkpoint write")
    proc.send_signal(signal.SIGINT)
    wait_for_line(proc.stderr, "SIGINT received")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    assert "second SIGINT: exiting now" in err
    assert "Traceback" not in err
    assert latest(run)["step"] == 100
    done = run_cli(madqn_cli, "train", "--resume", run, "--steps", "200")
    assert done.returncode == 0, done.stderr
    assert latest(run)["step"] == 200


# ---- full disk, NaN -----------------------------------------------------------------------------

def test_full_disk_at_checkpoint_time_stops_and_keeps_the_previous_checkpoint(madqn_cli, tmp_path):
    run = tmp_path / "run"
    proc = run_cli(madqn_cli, "train", "--run-dir", run, "--steps", "300", *FAST,
                   extra_env={"MADQN_FAULT": "checkpoint_write:2:enospc"})
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert err[0].startswith("madqn: error: cannot write the checkpoint of step 200")
    assert "No space left on device; the last good checkpoint (" in err[0] and "step 100) is intact" in err[0]
    assert err[0].endswith(f" -m madqn train --resume {run}")
    assert latest(run)["step"] == 100
    assert not list((run / "checkpoints").glob(".*tmp*"))
    done = run_cli(madqn_cli, "train", "--resume", run, "--steps", "200")
    assert done.returncode == 0 and latest(run)["step"] == 200


def test_nan_guard_names_step_and_learner_and_keeps_last_good_checkpoint(madqn_cli, tmp_path):
    """lr = 1e30 blows the weights up to Inf/NaN within the first updates (learning starts after step 100)."""
    run = tmp_path / "run"
    proc = run_cli(madqn_cli, "train", "--run-dir", run, "--steps", "400", *FAST, "--set", "lr=1e30")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert err[0].startswith("madqn: error: NaN/Inf at step 150: ")
    assert "of the learner of agent first_0 became NaN/Inf (all finite at step 100); training stopped" in err[0]
    assert err[0].endswith(f"the last good checkpoint ({run / 'checkpoints' / 'latest.pt'}, step 100) is intact")
    state = latest(run)
    assert state["step"] == 100
    assert all(torch.isfinite(t).all() for g in state["groups"].values() for t in g["learner"]["online"].values())


# ---- resume refusals ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    madqn.train("pong_v3", SMOKE, run_dir=run, steps=120, learn_start=40, num_threads=1, handle_signals=False)
    return run


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=0.001), "cannot change 'lr' when resuming (the run has lr = 0.00025, requested 0.001)"),
    (dict(sharing="shared"), "cannot change 'sharing' when resuming (the run has sharing = 'independent'"),
    (dict(full_action_space=True), "cannot change 'full_action_space' when resuming"),
    (dict(env="boxing_v2"), "cannot change 'env' when resuming"),
    (dict(steps=120), "already reached step 120 of steps = 120; pass --steps N with N > 120"),
    (dict(force=True, steps=200), "--resume continues a run and --force overwrites one"),
    (dict(stepz=200), "unknown config key 'stepz'"),
])
def test_resume_refuses_unsafe_changes(finished_run, kwargs, message):
    env = kwargs.pop("env", None)
    with pytest.raises(MadqnError) as e:
        madqn.train(env, resume=finished_run, handle_signals=False, **kwargs)
    assert message in str(e.value)


def test_resume_allows_safe_changes(finished_run, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    result = madqn.train(resume=run, steps=160, prog_freq=20, save_freq=40, device="cpu", handle_signals=False)
    assert result.steps == 160 and result.resumed_from == 120
    # learning paused for learn_start = 40 steps after the resume (no replay saved): 20 + 0 updates
    assert result.updates == {"first_0": 20, "second_0": 20}
    assert latest(run)["config"]["prog_freq"] == 20
    with pytest.raises(ConfigError, match="cannot change 'lr'"):
        madqn.train(resume=run, steps=200, lr=0.1, handle_signals=False)


def test_resume_with_prioritized_n_step_replay_equals_uninterrupted_run(tmp_path):
    """As above with every extension on (prioritized replay, 3-step returns, Double DQN, dueling, Adam):
    the priorities travel in replay.pt, and the resumed run equals the uninterrupted one. beta's schedule is
    fixed by priority_beta_endt (by default it ends at the last step, which the resume moves)."""
    common = dict(sharing="shared", save_replay=True, seed=6, num_threads=1, minibatch_size=8,
                  handle_signals=False, prioritized=True, n_step=3, double=True, dueling=True, optimizer="adam",
                  lr=6.25e-5, lr_end=6.25e-5, priority_beta_endt=400)
    madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "split", steps=230, **common)
    resumed = madqn.train(resume=tmp_path / "split", steps=300, handle_signals=False)
    whole = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "whole", steps=300, **common)
    assert resumed.resumed_from == 230 and resumed.updates == whole.updates == {"shared": 50}
    a, b = latest(tmp_path / "split"), latest(tmp_path / "whole")
    for name in ("shared",):
        la, lb = a["groups"][name]["learner"], b["groups"][name]["learner"]
        assert any("head.value" in k for k in la["online"])
        for net in ("online", "target"):
            for k in la[net]:
                assert torch.equal(la[net][k], lb[net][k]), f"{name} {net}.{k}"
        for pa, pb in zip(la["optimizer"]["state"].values(), lb["optimizer"]["state"].values()):
            assert torch.equal(pa["exp_avg"], pb["exp_avg"]) and torch.equal(pa["exp_avg_sq"], pb["exp_avg_sq"])
        ra = safe_load(tmp_path / "split" / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"][name]
        rb = safe_load(tmp_path / "whole" / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"][name]
        for k in ("actions", "frames", "rewards", "terminal", "episode_end", "written", "priority_tree", "max_priority"):
            assert torch.equal(ra[k], rb[k]), k
        leaves = ra["priority_tree"][ra["priority_tree"].numel() // 2:]
        assert len(set(leaves[leaves > 0].tolist())) > 10  # updated priorities, not only the initial max
