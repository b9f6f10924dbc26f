"""A new user's first hour: printed commands that run as printed, torch threads chosen from the machine,
bounded final evaluations with progress, one-episode evaluations, videos of envs without render(),
a live rate that follows the current phase, one colour per variant, short typo hints."""

import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import madqn
from madqn.api import final_eval_budget
from madqn.commands import madqn_program, tensorboard_command
from madqn.config import Config
from madqn.training.progress import EvalProgress, WindowRate, eval_eta
from madqn.training.trainer import resolve_threads
from helpers import read_csv, run_madqn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"
CATCH = f"{ROOT / 'envs' / 'catch.py'}:make_small_env"
CATCH_CONFIG = ROOT / "configs" / "catch_small.toml"
NO_RENDER = f"{ROOT / 'tests' / 'norender_env.py'}:make_env"


# ---- printed commands ----------------------------------------------------------------------------

def test_printed_resume_command_runs_verbatim_with_a_clean_path(tmp_path):
    """Ctrl-C prints a resume command; run exactly that line in a shell whose PATH has no madqn."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "madqn", "train", "--env", CATCH, "--config", CATCH_CONFIG,
                             "--run-dir", "run", "--steps", "600", "--set", "prog_freq=100",
                             "--set", "final_eval_episodes=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and "step 200/" not in proc.stdout.readline():
        pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    printed = out.strip().splitlines()[-1].split("resume with: ", 1)[1]
    assert subprocess.run(["bash", "-c", "command -v madqn"], env=env).returncode != 0  # not on this PATH
    done = subprocess.run(["bash", "-c", printed], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (printed, done.stderr)
    assert "resuming run at step" in done.stdout and "done: 600 agent steps" in done.stdout


def test_madqn_program_is_what_runs_here(tmp_path):
    bin_dir = tmp_path / "venv bin"
    bin_dir.mkdir()
    script = bin_dir / "madqn"
    script.write_text("#!/bin/sh\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert madqn_program(str(script), path=str(bin_dir)) == "madqn"  # on PATH: the short form
    assert madqn_program(str(script), path="/usr/bin:/bin") == f"'{script}'"  # not on PATH: the full path, quoted
    module = madqn_program(str(ROOT / "madqn" / "__main__.py"), path="/usr/bin:/bin")
    assert module == f"{sys.executable} -m madqn"
    assert tensorboard_command("runs/a b", path=str(tmp_path)).endswith(" --logdir 'runs/a b'")


# ---- threads -------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_threads, workers, cores, default, expected", [
    (0, 0, 2, 2, 1),     # 2 cores, envs inline: one core emulates, one thread for torch
    (0, 1, 2, 2, 1),     # one env worker process
    (0, 0, 1, 1, 1),     # never below 1
    (0, 8, 4, 4, 1),     # more workers than cores
    (0, 4, 16, 16, 12),  # the cores left after the workers
    (0, 0, 16, 8, 8),    # at most torch's default (physical cores)
    (3, 0, 2, 2, 3),     # asked for: as asked
])
def test_resolve_threads(num_threads, workers, cores, default, expected):
    threads, why = resolve_threads(num_threads, workers, cores=cores, default=default)
    assert threads == expected
    assert why == ("num_threads" if num_threads else f"auto: {cores} cores, {max(workers, 1)} for the envs")


# ---- progress ------------------------------------------------------------------------------------

def test_window_rate_follows_the_current_phase():
    """60 s at 100 steps/s (acting only), then 30 s at 4 steps/s (learning): the rate reads 4, where the
    mean since the start would read 68."""
    w = WindowRate(window_s=15.0)
    for k in range(0, 61):
        w.add(float(k), 100.0 * k)
    for k in range(1, 31):
        w.add(60.0 + k, 6000.0 + 4.0 * k)
    assert w.rate() == pytest.approx(4.0)
    assert math.isnan(WindowRate().rate())


def test_live_bar_shows_the_windowed_rate(monkeypatch):
    """The tqdm bar's rate (and so its ETA) is the last 15 s's: 4 steps/s after a fast phase, not tqdm's average."""
    import io

    from madqn.training import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = progress.Progress(100_000, every=1000, out=io.StringIO(), tty=True, refresh_s=0.0)
    for k in range(1, 61):
        now[0] = float(k)
        p.update(100 * k)
    for k in range(1, 31):
        now[0] = 60.0 + k
        p.update(6000 + 4 * k)
    assert p.bar.format_dict["rate"] == pytest.approx(4.0)
    p.close()


def test_plain_progress_never_stays_silent_for_a_minute(monkeypatch):
    """Without a terminal, lines come every `every` steps, and also after 60 s without one (learning at
    4 steps/s with prog_freq 10000 would otherwise print once in 40 minutes)."""
    import io

    from madqn.training import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    p = progress.Progress(100_000, every=10_000, out=out, tty=False)
    for k in range(1, 101):  # 100 s at 100 steps/s: the 10000-step line at 100 s, a quiet line at 60 s
        now[0] = float(k)
        p.update(100 * k)
    for k in range(1, 151):  # then 150 s at 4 steps/s: quiet lines at 160 and 220 s
        now[0] = 100.0 + k
        p.update(10_000 + 4 * k)
    steps = [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()]
    assert steps == [6000, 10_000, 10_240, 10_480]
    assert "| 4 steps/s |" in out.getvalue().splitlines()[-1]


@pytest.mark.parametrize("elapsed, episodes, steps, bounds, expected", [
    (10.0, 2, 500, dict(total_episodes=10), 40.0),                            # 5 s per episode, 8 to go
    (10.0, 2, 500, dict(total_episodes=10, max_seconds=60.0), 40.0),         # the episodes end first
    (10.0, 2, 500, dict(total_episodes=10, max_seconds=30.0), 20.0),         # the time bound ends first
    (10.0, 2, 500, dict(total_episodes=10, max_steps=1000), 10.0),           # the step budget ends first
    (10.0, 0, 0, dict(total_episodes=10), math.inf),                         # no rate yet
    (70.0, 2, 500, dict(max_seconds=60.0), 0.0),                             # past the bound: 0
])
def test_eval_eta(elapsed, episodes, steps, bounds, expected):
    assert eval_eta(elapsed, episodes, steps, **bounds) == pytest.approx(expected)


def test_eval_progress_prints_episodes_per_second_and_eta(capsys):
    now = [0.0]
    progress = EvalProgress("final evaluation", episodes=4, max_seconds=100.0, interval_s=5.0, clock=lambda: now[0])
    for t, steps in ((2.0, 100), (4.0, 100), (6.0, 100), (8.0, 100)):
        now[0] = t
        progress(steps)
    progress.close()
    lines = capsys.readouterr().out.strip().splitlines()
    # a line at 6 s (5 s after the start) and one for the last episode, not one per episode
    assert lines == ["final evaluation: episode 3/4 | 0.5 episodes/s | 300 agent steps | ETA 0:00:02",
                     "final evaluation: episode 4/4 | 0.5 episodes/s | 400 agent steps | ETA 0:00:00"]


# ---- final evaluation ----------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, wall, expected", [(0.0, 5.0, 60.0), (0.0, 3000.0, 300.0), (7.5, 3000.0, 7.5)])
def test_final_eval_budget(seconds, wall, expected):
    assert final_eval_budget(Config(final_eval_seconds=seconds), wall) == expected


def test_final_evaluation_on_pong_stops_at_its_time_bound(tmp_path, capsys):
    """A short pong_v3 run, then a final evaluation of full-length games (max_cycles 100000) that could run
    for minutes: it stops at final_eval_seconds, drops the cut episode and says so."""
    result = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "run", steps=100, max_cycles=100_000,
                         final_eval_episodes=10, final_eval_seconds=3.0, num_threads=1)
    evaluation = result.evaluation
    assert evaluation.stopped_by == "time" and evaluation.incomplete == 1
    assert evaluation.seconds >= 3.0  # never before the bound (how soon after: the next test, on its own clock)
    out = capsys.readouterr().out
    assert f"final evaluation: {evaluation.episodes} of 10 episodes completed within 3 s (final_eval_seconds)" in out
    rows = read_csv(tmp_path / "run" / "final_eval.csv")
    assert len(rows) == 2 * evaluation.episodes


def test_evaluation_time_bound_stops_at_the_first_step_past_it():
    """On a clock that advances 10 ms per reading (one reading per agent step): the evaluation stops at the first
    step that finds the bound passed, drops the episode it cuts and reports the seconds on that clock."""
    from madqn.evaluation import evaluate

    readings = []

    def clock():
        readings.append(0.01 * len(readings))
        return readings[-1]

    result = evaluate("pong_v3", "random", episodes=10, seed=3, max_seconds=3.0, clock=clock,
                      config=Config(max_cycles=100_000))
    assert result.stopped_by == "time" and result.incomplete == 1 and result.episodes == 0
    assert result.seconds == pytest.approx(3.01)  # the reading at 3.00 s stopped it; one more for the report
    # the start, 299 steps (at 0.01 .. 2.99 s), the reading at 3.00 s that stops it, the report: nothing more
    assert len(readings) == 302


@pytest.mark.slow
def test_final_evaluation_after_a_300_step_pong_run_keeps_the_default_bound(tmp_path):
    """DQN3.0's defaults for the evaluation (10 episodes, eval_steps 125000, full games): at most max(60 s, 10%
    of the training time) = 60 s."""
    result = madqn.train("pong_v3", SMOKE, run_dir=tmp_path / "run", max_cycles=100_000, final_eval_episodes=10)
    assert result.wall_time < 600
    assert result.evaluation.seconds < 60.0 + 1.0


def test_final_eval_rows_name_seat_and_opponent_and_progress_is_shown(tmp_path, capsys):
    result = madqn.train(CATCH, CATCH_CONFIG, run_dir=tmp_path / "run", steps=50, final_eval_episodes=3)
    rows = read_csv(tmp_path / "run" / "final_eval.csv")
    assert [(r["episode"], r["agent"], r["seat"], r["opponent"]) for r in rows] == [
        (str(k), a, a, "self") for k in (1, 2, 3) for a in ("catcher_0", "catcher_1")]
    assert [float(r["score"]) for r in rows if r["seat"] == "catcher_0"] == result.evaluation.scores["catcher_0"]
    out = capsys.readouterr().out
    assert "final evaluation: episode 3/3 | " in out and " episodes/s | " in out and "| ETA " in out


# ---- one episode, videos of envs without render() ------------------------------------------------

@pytest.fixture(scope="module")
def catch_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("newcomer") / "catch"
    madqn.train(CATCH, CATCH_CONFIG, run_dir=run, steps=50, eval_freq=0, final_eval_episodes=0)
    return run


def test_one_episode_eval_with_a_video_of_an_env_without_render(catch_run, tmp_path):
    from PIL import Image

    video = tmp_path / "v.gif"
    proc = run_madqn("eval", catch_run, "--episodes", "1", "--env", NO_RENDER, "--video", video,
                     "--out", tmp_path / "e.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "n/a" in proc.stdout and "nan" not in proc.stdout
    assert "eval vs random: episode 3/3 | " in proc.stdout  # 2 seats + the random baseline, 1 episode each
    with Image.open(video) as gif:
        n_frames = gif.n_frames
        frame = np.asarray(gif.convert("RGB"))
    assert n_frames == 5 * 8 + 1  # 5 balls falling 8 rows each, plus the frame after reset
    # the observation (36x36, gray levels of catch) scaled up 9x to 324 px, somewhere below the caption bar
    blocks = None
    for top in range(frame.shape[0] - 36 * 9 + 1):
        image = frame[top:top + 36 * 9, :324, 0]
        small = image[::9, ::9]
        if np.array_equal(np.kron(small, np.ones((9, 9), np.uint8)), image) and 255 in small \
                and set(np.unique(small).tolist()) <= {0, 80, 110, 255}:
            blocks = small
            break
    assert blocks is not None, "no 9x upscaled catch observation in the video frame"


def test_env_without_render_nor_images_is_one_line():
    from madqn.errors import MadqnError
    from madqn.evaluation.video import FrameSource

    class Vectors:
        possible_agents = ["a"]

        def render(self):
            raise NotImplementedError

    with pytest.raises(MadqnError, match="no render\\(\\) and its observations are not images"):
        FrameSource(Vectors()).frame({"a": np.zeros(5, np.float32)})


# ---- colours, typos ------------------------------------------------------------------------------

def _fake_run(path, sharing, seed):
    path.mkdir(parents=True)
    (path / "config.toml").write_text(Config(env="pong_v3", sharing=sharing, seed=seed).to_toml())
    lines = ["episode,agent,step,score,length,epsilon"] + [f"{k},first_0,{100 * k},{k % 3},10,1.0" for k in range(1, 6)]
    (path / "episodes.csv").write_text("\n".join(lines) + "\n")
    return path


def test_one_colour_per_variant_in_plot_and_compare(tmp_path, monkeypatch):
    from madqn.evaluation import plot, report

    shared = [_fake_run(tmp_path / f"shared-s{s}", "shared", s) for s in (1, 2)]
    independent = [_fake_run(tmp_path / f"independent-s{s}", "independent", s) for s in (1, 2)]

    def colours(runs):
        fig = plot.learning_curves_figure(runs)
        return {line.get_label(): line.get_color() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}

    a = colours(shared + independent)
    b = colours(independent + shared)  # madqn plot runs/ sorts: independent first
    assert a == b and len(set(a.values())) == 2
    assert {label.split()[1]: c for label, c in a.items()} == {"shared": "C0", "independent": "C1"}
    seen, real = [], plot.variant_colours

    def spy(variants):
        seen.append([members[0].config.sharing for _, members in variants])
        return real(variants)

    monkeypatch.setattr(plot, "variant_colours", spy)
    results = {"runs": [{"run_dir": str(p)} for p in independent + shared], "env": "pong_v3", "seeds": [1, 2],
               "config": {"eval_ep": 0.05, "eval_opponent": "random"}}
    files = report._plots(tmp_path, results, have_eval=False)
    assert files["training_curves"].is_file() and seen == [["independent", "shared"]]  # compare draws through it


def test_env_typo_suggests_only_close_games_in_one_short_line(tmp_path):
    proc = run_madqn("train", "--env", "pong_v33", cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and len(err[0]) < 200, err
    assert "did you mean 'pong_v3'?" in err[0] and "boxing_v2" not in err[0]
    from madqn.envs.atari import close_games

    assert close_games("boxng_v2") == ["boxing_v2"] and close_games("breakout_v5") == []
