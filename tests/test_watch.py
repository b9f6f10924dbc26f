"""Watching training: progress output, TensorBoard events, run summary, periodic videos, `madqn plot`, `madqn video`.

One real CLI training run on the pong_v3 emulator (300 agent steps, gradient updates from step 100,
episodes truncated at 100 steps, a report every 50 steps, a 20-step video every 150 steps) feeds
most tests; each output is checked against the CSV files, which are the source of truth.
"""

import csv
import math
import os
import pty
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
from PIL import Image
from helpers import read_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"
TRAIN_ARGS = ["--config", str(SMOKE), "--seed", "3", "--set", "max_cycles=100", "--set", "prog_freq=50",
              "--set", "video_freq=150", "--set", "video_length=20", "--set", "num_threads=1"]
AGENTS = ["first_0", "second_0"]


def video_frames(path):
    """Every frame of a video file, decoded (ffmpeg for .mp4, pillow for .gif)."""
    with imageio.get_reader(path) as reader:
        return [np.asarray(f) for f in reader]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run_dir, stdout) of `madqn train` run without a terminal."""
    tmp = tmp_path_factory.mktemp("watch")
    run_dir = tmp / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "madqn", "train", *TRAIN_ARGS, "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def run_cli(madqn_cli, *args, cwd):
    cmd, env = madqn_cli(*args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


# ---- 1. progress ------------------------------------------------------------------------------

PLAIN_LINE = re.compile(r"^train step (\d+)/300 \((\d+)%\) \| ([\d.]+) steps/s \| ETA (\d+:\d\d:\d\d) \| eps ([\d.]+) \| "
                        r"first_0: updates (\d+)(.*?) \| second_0: updates (\d+)(.*?)(?: \| score\(20 ep\) (.*))?$")


def test_progress_without_terminal_prints_plain_lines_with_every_field(trained):
    run_dir, stdout = trained
    assert "\r" not in stdout and "\x1b" not in stdout  # no bar, no terminal control codes
    lines = [line for line in stdout.splitlines() if line.startswith("train step")]
    matches = [PLAIN_LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m[1]) for m in matches] == [50, 100, 150, 200, 250, 300]  # every prog_freq agent steps
    assert [int(m[2]) for m in matches] == [17, 33, 50, 67, 83, 100]
    assert matches[-1][4] == "0:00:00"
    train_rows = {(int(r["step"]), r["learner"]): r for r in read_csv(run_dir / "train.csv")}
    episodes = read_csv(run_dir / "episodes.csv")
    for m in matches:
        step = int(m[1])
        assert float(m[5]) == pytest.approx(float(train_rows[(step, "first_0")]["epsilon"]), abs=5e-4)
        for learner, updates, stats in (("first_0", m[6], m[7]), ("second_0", m[8], m[9])):
            row = train_rows[(step, learner)]
            assert int(updates) == int(row["updates"])  # learner updates as train.csv counts them
            if int(row["updates"]) > 0:
                td = float(re.search(r"td_error (\S+)", stats)[1])
                assert td == pytest.approx(float(row["abs_delta"]), rel=1e-3)
        # recent mean score per agent = mean of the episodes finished so far (fewer than 20 here)
        done = [r for r in episodes if int(r["step"]) < step]
        if done:
            shown = dict(zip(m[10].split()[::2], map(float, m[10].split()[1::2])))
            for agent in AGENTS:
                scores = [float(r["score"]) for r in done if r["agent"] == agent]
                assert shown[agent] == pytest.approx(np.mean(scores), abs=0.005)
        else:
            assert m[10] is None
    # learning starts after step 100, one update per 4 steps: 50 per learner at the end
    assert int(matches[-1][6]) == int(matches[-1][8]) == 50


def test_progress_on_a_terminal_is_a_live_bar(tmp_path):
    """The CLI attached to a pseudo-terminal draws a tqdm bar with the fields instead of plain lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "madqn", "train", "--config", str(SMOKE), "--sharing", "shared", "--set", "steps=60",
           "--set", "learn_start=20", "--set", "max_cycles=25", "--set", "num_threads=1",
           "--run-dir", str(tmp_path / "run")]
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, cwd=tmp_path, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    out = b"".join(chunks).decode("utf-8", "replace")
    frames = out.split("\r")
    bars = [f for f in frames if f.startswith("train:")]
    assert len(bars) >= 2, out
    final = [f for f in bars if "60/60" in f][-1]
    assert "100%" in final and "step/s" in final
    assert re.search(r"eps=[\d.]+ updates=10 first_0=-?[\d.]+ second_0=-?[\d.]+", final), final
    assert "train step" not in out  # no plain lines on a terminal
    assert "done: 60 agent steps" in out


def test_progress_plain_mode_prints_every_n_and_a_final_line():
    import io

    from madqn.training.progress import Progress

    out = io.StringIO()
    calls = []

    def fields():
        calls.append(1)
        return {"eps": "0.5", "score(20 ep)": "a 1.00 b -1.00"}

    p = Progress(35, every=10, desc="eval", out=out)
    assert not p.tty  # StringIO is not a terminal
    for done in range(1, 36):
        p.update(done, fields)
    p.close(fields)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["eval step 10/35 (29%)", "eval step 20/35 (57%)",
                                                       "eval step 30/35 (86%)", "eval step 35/35 (100%)"]
    assert all(line.endswith("| eps 0.5 | score(20 ep) a 1.00 b -1.00") for line in lines)
    assert len(calls) == 4  # fields are computed only for the lines shown


def test_progress_bar_mode_writes_tqdm_bar_with_fields():
    import io

    from madqn.training.progress import Progress

    out = io.StringIO()
    p = Progress(40, every=10, out=out, tty=True, refresh_s=0.0)
    for done in range(1, 41):
        p.update(done, {"eps": f"{1 - done / 40:.2f}"})
    p.close({"eps": "0.00"})
    final = out.getvalue().split("\r")[-1]
    assert "40/40" in final and "100%" in final and "eps=0.00" in final


# ---- 2. TensorBoard ---------------------------------------------------------------------------

def load_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_events_mirror_the_csv_files(trained):
    run_dir, _ = trained
    acc = load_events(run_dir)
    tags = set(acc.Tags()["scalars"])
    for agent in AGENTS:
        for name in ("score", "episode_length"):
            assert f"{name}/{agent}" in tags
        for name in ("td_error", "q_mean", "q2_max", "updates", "perf/updates_per_s", "replay_fill", "train/lr"):
            assert f"{name}/{agent}" in tags  # independent: one learner per agent
    assert {"train/epsilon", "perf/env_steps_per_s"} <= tags

    def series(tag):
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    episodes = read_csv(run_dir / "episodes.csv")
    assert len(episodes) == 6  # 300 steps / 100-step episodes x 2 agents
    for agent in AGENTS:
        rows = [r for r in episodes if r["agent"] == agent]
        assert series(f"score/{agent}") == [(int(r["step"]), float(r["score"])) for r in rows]
        assert series(f"episode_length/{agent}") == [(int(r["step"]), float(r["length"])) for r in rows]
    train = read_csv(run_dir / "train.csv")
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    for learner in AGENTS:
        rows = [r for r in train if r["learner"] == learner]
        assert [s for s, _ in series(f"updates/{learner}")] == [50, 100, 150, 200, 250, 300]
        assert [v for _, v in series(f"updates/{learner}")] == [float(r["updates"]) for r in rows]
        # TD error |delta| and mean Q only once there were updates (no NaN points before learn_start)
        learned = [r for r in rows if int(r["updates"]) > 0]
        assert [s for s, _ in series(f"td_error/{learner}")] == [int(r["step"]) for r in learned]
        np.testing.assert_allclose([v for _, v in series(f"td_error/{learner}")],
                                   [float(r["abs_delta"]) for r in learned], rtol=1e-6)
        np.testing.assert_allclose([v for _, v in series(f"q_mean/{learner}")],
                                   [float(r["q_mean"]) for r in learned], rtol=1e-6)
        # replay fill: the learner's replay entries over its capacity (replay_memory per stream, one stream)
        np.testing.assert_allclose([v for _, v in series(f"replay_fill/{learner}")],
                                   [int(r["replay_size"]) / cfg["replay_memory"] for r in rows], rtol=1e-6)
        # updates/s between reports: 12 or 13 updates per 50 steps once learning runs, none before
        ups = [v for _, v in series(f"perf/updates_per_s/{learner}")]
        assert ups[:2] == [0.0, 0.0] and all(v > 0 for v in ups[2:])
    np.testing.assert_allclose([v for _, v in series("train/epsilon")],
                               [float(r["epsilon"]) for r in train if r["learner"] == "first_0"], atol=1e-6)
    assert all(v > 0 for _, v in series("perf/env_steps_per_s"))
    # the resolved config, as text
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "\n".join(line[4:] for line in text.splitlines()) + "\n" == (run_dir / "config.toml").read_text()


def test_scalars_from_other_hooks_reach_tensorboard(shared_run):
    """Evaluation hooks publish DQN3.0's validation V with trainer.log_scalars; TensorBoard shows it."""
    _, _, tb_dir = shared_run
    acc = load_events(tb_dir)
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("valid/V/shared")] == [(40, 0.04), (80, 0.08)]
    assert "valid/td_error/shared" not in acc.Tags()["scalars"]  # NaN (nothing measured) is not plotted
    assert "td_error/shared" in acc.Tags()["scalars"]


# ---- 4. videos --------------------------------------------------------------------------------

def test_periodic_training_videos(trained):
    run_dir, _ = trained
    videos = sorted((run_dir / "videos").iterdir())
    assert [v.name for v in videos] == ["step_000000150.mp4", "step_000000300.mp4"]
    for v in videos:
        frames = video_frames(v)
        assert len(frames) == 21  # the reset frame + video_length (20) steps
        assert frames[0].shape == (480, 320, 3)  # 210x160 screen x2 under a 2-line caption bar, padded to 16


def test_video_cli_records_episodes_with_the_expected_frame_count(trained, madqn_cli, tmp_path):
    run_dir, _ = trained
    out = tmp_path / "eval.mp4"
    proc = run_cli(madqn_cli, "video", run_dir, "--out", out, "--episodes", "2", "--max-steps", "15", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    frames = video_frames(out)
    assert len(frames) == 2 * (15 + 1)
    assert f"wrote {out}: 32 frames" in proc.stdout
    # the caption bar changes from frame to frame (the step counter), the game screen below it too
    assert not np.array_equal(frames[1][:48], frames[2][:48])
    gif = tmp_path / "eval.gif"
    proc = run_cli(madqn_cli, "video", str(run_dir / "checkpoints" / "latest.pt"), "--out", gif, "--max-steps", "9",
                   "--eps", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(video_frames(gif)) == 10


class RenderLog:
    """An env whose rendered screens are kept, to compare with what the video holds."""

    def __init__(self, env):
        self.env, self.screens = env, []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def render(self):
        self.screens.append(self.env.render().copy())
        return self.screens[-1]


def test_record_episodes_writes_every_rendered_screen_and_stops_at_episode_ends(tmp_path):
    """Episodes truncated by the env (max_cycles 12) end the recording's episode: 13 frames each, and the
    GIF (exact palette) holds every rendered screen, scaled x2 under the caption bar, in order."""
    from madqn.config import make_config
    from madqn.envs.adapters import make_env
    from madqn.evaluation.video import record_episodes

    env = RenderLog(make_env("pong_v3", make_config(SMOKE, {"max_cycles": 12}), seed=0))
    rng = np.random.default_rng(0)
    resets = []
    try:
        rec = record_episodes(env, lambda obs, infos: {a: int(rng.integers(6)) for a in obs}, tmp_path / "r.gif",
                              episodes=3, reset_fn=lambda: resets.append(1))
    finally:
        env.close()
    assert rec.frames == 3 * 13 and rec.episode_steps == [12, 12, 12] and len(resets) == 3
    frames = video_frames(tmp_path / "r.gif")
    assert len(frames) == len(env.screens) == 39
    # the caption bar's height: where the first screen sits
    bar = next(h for h in range(frames[0].shape[0] - 420 + 1)
               if np.array_equal(frames[0][h:h + 420, :320, :3], np.repeat(np.repeat(env.screens[0], 2, 0), 2, 1)))
    assert bar > 20
    for frame, screen in zip(frames, env.screens):
        assert np.array_equal(frame[bar:bar + 420, :320, :3], np.repeat(np.repeat(screen, 2, 0), 2, 1))
    assert frames[0][:bar].max() == 255  # white caption text on the black bar


def test_video_and_plot_errors_are_one_line(trained, madqn_cli, tmp_path, capsys):
    from madqn.cli import main

    run_dir, _ = trained
    proc = run_cli(madqn_cli, "video", run_dir, "--out", tmp_path / "v.avi", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == f"madqn: error: video file {tmp_path / 'v.avi'} must end in .mp4 or .gif\n"
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    for args, message in (
            (["video", tmp_path / "nowhere"], "checkpoint not found"),
            (["video", bad], "not a complete madqn checkpoint"),
            (["video", run_dir, "--episodes", "0", "--out", tmp_path / "v.mp4"], "--episodes must be >= 1"),
            (["plot", tmp_path / "nowhere"], "run directory not found"),
            (["plot", tmp_path], "is not a run directory (no episodes.csv) and holds none"),
            (["plot", run_dir, "--out", tmp_path / "p.jpg"], "must end in .png, .svg or .pdf")):
        assert main([str(a) for a in args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("madqn: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "v.mp4").exists()


def test_video_hook_refuses_an_env_instance(tmp_path):
    import madqn
    from madqn.envs.atari import AtariEnv
    from madqn.errors import MadqnError
    from madqn.evaluation.video import as_rgb

    with pytest.raises(MadqnError, match="not an env instance"):
        madqn.train(AtariEnv("pong_v3", max_cycles=50), SMOKE, run_dir=tmp_path / "r", steps=10, video_freq=5)
    with pytest.raises(MadqnError, match="render_mode='rgb_array'"):
        as_rgb(None)


# ---- policy rebuilt from a checkpoint ------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """(trainer, checkpoint, TensorBoard dir) of an in-process shared-network run (80 steps, 15 updates) whose
    extra hook publishes a validation scalar every 40 steps."""
    from madqn.training.checkpoint import atomic_save, trainer_state
    from madqn.config import make_config
    from madqn.training.metrics import MetricsHook
    from madqn.training.trainer import Hook, Trainer
    from madqn.training.tensorboard import TensorBoardHook

    class FakeValidation(Hook):
        def on_step(self, trainer):
            if trainer.step % 40 == 0:
                trainer.log_scalars({"valid/V/shared": trainer.step / 1000, "valid/td_error/shared": float("nan")})

    tmp = tmp_path_factory.mktemp("shared")
    cfg = make_config(SMOKE, {"steps": 80, "learn_start": 20, "sharing": "shared", "max_cycles": 60,
                              "prog_freq": 40, "num_threads": 1})
    trainer = Trainer(cfg, hooks=[MetricsHook(tmp), TensorBoardHook(tmp), FakeValidation()])
    trainer.run()
    atomic_save(trainer_state(trainer), tmp / "latest.pt")
    yield trainer, tmp / "latest.pt", tmp
    trainer.close()


def test_checkpoint_policy_plays_exactly_like_the_trainers_networks(shared_run):
    """Shared network with agent indicator: the rebuilt policy gives the trainer's Q-values and greedy actions."""
    import torch

    from madqn.evaluation.agents import Agents, load_agents, load_checkpoint
    from madqn.envs.adapters import make_env

    trainer, checkpoint, _ = shared_run
    assert trainer.groups[0].updates == 15
    _, loaded_cfg = load_checkpoint(checkpoint)
    env = make_env("pong_v3", loaded_cfg, seed=5, convert=False)
    live = Agents.from_trainer(trainer)
    rebuilt = load_agents(checkpoint)
    rebuilt.check_env(env)
    obs, infos = env.reset()
    for policy in (live, rebuilt):
        policy.reset()
    for _ in range(30):
        a_live, a_rebuilt = live.act(obs, infos, epsilon=0.0), rebuilt.act(obs, infos, epsilon=0.0)
        assert a_live == a_rebuilt
        obs, _, _, _, infos = env.step(a_live)
    states = torch.as_tensor(np.stack([live.histories[a].state() for a in AGENTS]))
    ids = torch.tensor([0, 1])
    q_live = trainer.groups[0].learner.q_values(states, ids)
    q_rebuilt = rebuilt.networks["first_0"](states, ids)
    assert torch.equal(q_live, q_rebuilt.detach())
    assert not torch.equal(q_live[0], q_live[1])  # the agent indicator matters: both ids were fed
    env.close()


# ---- 3. plots ----------------------------------------------------------------------------------

def test_plot_cli_writes_a_png_of_the_requested_size(trained, madqn_cli, tmp_path):
    run_dir, _ = trained
    out = tmp_path / "curves.png"
    proc = run_cli(madqn_cli, "plot", run_dir, "--out", out, "--size", "800x300", "--smooth", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (800, 300)
        pixels = np.asarray(im.convert("RGB"))
    assert pixels.std() > 10  # not a blank canvas
    proc = run_cli(madqn_cli, "plot", run_dir, cwd=tmp_path)  # default: inside the run directory
    assert proc.returncode == 0, proc.stderr
    with Image.open(run_dir / "plots" / "learning_curves.png") as im:
        assert im.size == (1200, 450)


def write_run(run_dir, seed, sharing, episodes):
    """A run directory by hand: config.toml and episodes.csv rows (step, agent, score)."""
    from madqn.config import Config

    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(Config(seed=seed, sharing=sharing).to_toml())
    with open(run_dir / "episodes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "episode", "env", "agent", "score", "length", "truncated", "epsilon", "wall_time"])
        for k, (step, agent, score) in enumerate(episodes):
            w.writerow([step, k, 0, agent, score, 10, 0, 1.0, 0.0])


def test_seeds_of_a_variant_are_averaged_with_a_band(tmp_path):
    """Three seeds with score = k * step / 100 (k = 1, 2, 3): mean 2 * step / 100, band 1x..3x; a fourth
    run (shared) is its own variant."""
    from madqn.evaluation.plot import find_runs, learning_curves_figure

    for k in (1, 2, 3):
        write_run(tmp_path / "runs" / f"ind-s{k}", k, "independent",
                  [(s, a, k * s / 100 * (1 if a == "first_0" else -1)) for s in (0, 100, 200) for a in AGENTS])
    write_run(tmp_path / "runs" / "shared-s1", 1, "shared", [(50, "first_0", 7.0), (150, "first_0", 9.0)])
    runs = find_runs([tmp_path / "runs"])  # a folder of runs stands for its runs
    assert len(runs) == 4
    fig = learning_curves_figure(runs, window=1, size=(900, 400))
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == AGENTS
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["pong_v3 independent (3 seeds)", "pong_v3 shared (seed 1)"]
    mean_line = axes[0].get_lines()[0]
    x, y = mean_line.get_xdata(), mean_line.get_ydata()
    assert x[0] == 0 and x[-1] == 200 and len(x) == 200
    np.testing.assert_allclose(y, 2 * x / 100)
    band = axes[0].collections[0].get_paths()[0].vertices  # fill_between polygon: lower then upper edge
    lower = band[(band[:, 1] <= 2 * band[:, 0] / 100 + 1e-9)]
    np.testing.assert_allclose(lower[:, 1], lower[:, 0] / 100, atol=1e-9)
    assert band[:, 1].max() == pytest.approx(6.0)  # 3 * 200 / 100
    np.testing.assert_allclose(axes[1].get_lines()[0].get_ydata(), -2 * x / 100)
    shared = axes[0].get_lines()[1]  # the single shared run: its scores as given (window 1)
    assert list(shared.get_xdata()) == [50, 150] and list(shared.get_ydata()) == [7.0, 9.0]


def test_variants_ignore_keys_without_effect_and_name_the_ones_that_differ(tmp_path):
    """Two seeds that differ in adam_eps under RMSProp and in sync_every with the local backend learn alike: one
    variant. A third run with a learning-rate warm-up is another, labelled by the keys that tell them apart."""
    from madqn.config import Config
    from madqn.evaluation.plot import group_variants, load_run

    base = dict(sharing="shared", optimizer="rmsprop", backend="local", lr=0.00025, lr_end=0.00025)
    configs = {"a": Config(seed=1, adam_eps=0.1, sync_every=4, **base),
               "b": Config(seed=2, adam_eps=0.2, sync_every=8, **base),
               "c": Config(seed=3, **{**base, "lr_end": 0.001}, lr_endt=50_000)}
    for name, config in configs.items():
        run_dir = tmp_path / name
        write_run(run_dir, config.seed, "shared", [(10, a, 0.0) for a in AGENTS])
        (run_dir / "config.toml").write_text(config.to_toml())
    variants = group_variants([load_run(tmp_path / n) for n in "abc"])
    assert [(label, len(members)) for label, members in variants] == [
        ("pong_v3 shared lr_end=0.00025 (2 seeds)", 2), ("pong_v3 shared lr_end=0.001 lr_endt=50000 (seed 3)", 1)]


def test_smoothing_and_running_best_by_hand():
    from madqn.evaluation.plot import smooth
    from madqn.cli.summary import running_best

    np.testing.assert_allclose(smooth(np.array([1, 2, 3, 4, 5.0]), 2), [1, 1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(smooth(np.array([1, 2, 3, 4, 5.0]), 3), [1, 1.5, 2, 3, 4])
    np.testing.assert_allclose(smooth(np.array([4.0, -2.0]), 1), [4, -2])
    assert running_best(np.array([0, 10, 2, 8, 0.0]), 2) == 6.0  # (10 + 2) / 2
    assert running_best(np.array([3, 5.0]), 20) == 4.0  # fewer episodes than the window: their mean


# ---- 5. run summary ----------------------------------------------------------------------------

def test_train_ends_with_a_run_summary(trained):
    run_dir, stdout = trained
    summary = stdout[stdout.index(f"run {run_dir}: pong_v3, sharing independent, seed 3"):]
    assert "300/300 agent steps, 3 episodes" in summary and "updates: first_0 50, second_0 50" in summary
    episodes = read_csv(run_dir / "episodes.csv")
    for agent in AGENTS:
        scores = [float(r["score"]) for r in episodes if r["agent"] == agent]
        best = max(np.mean(scores[i:i + 20]) for i in range(max(1, len(scores) - 19)))
        row = re.search(rf"^  {agent} +(\d+) +(\S+) +(\S+)$", summary, re.M)
        assert row, summary
        assert int(row[1]) == 3 and float(row[2]) == pytest.approx(np.mean(scores[-20:]), abs=0.005)
        assert float(row[3]) == pytest.approx(best, abs=0.005)
    assert f"checkpoints  {run_dir / 'checkpoints' / 'latest.pt'}" in summary
    assert f"{run_dir / 'episodes.csv'}, {run_dir / 'train.csv'}" in summary
    # commands as they run from this shell: the program is on PATH or given by its full path
    tensorboard = re.search(r"^  tensorboard  (\S+)(?: -m tensorboard.main)? --logdir (\S+)$", summary, re.M)
    plot = re.search(r"^  plots        (\S+)(?: -m madqn)? plot (\S+)$", summary, re.M)
    assert tensorboard and plot, summary
    assert tensorboard[2] == plot[2] == str(run_dir)
    for program in (tensorboard[1], plot[1]):
        assert shutil.which(program) or Path(program).is_file(), program
    assert "step_000000300.mp4" in summary
    assert not math.isnan(float(re.search(r"([\d.]+) s wall", summary)[1]))


def test_plot_of_the_periodic_evaluations(tmp_path, madqn_cli):
    """`madqn plot --source eval` draws each seat's mean evaluation score (eval.csv) against the step;
    an evaluation with no finished episode is skipped."""
    from madqn.evaluation.plot import learning_curves_figure, load_run

    run_dir = tmp_path / "run"
    write_run(run_dir, 1, "shared", [(10, a, 0.0) for a in AGENTS])
    rows = [(100, "first_0", 3, -5.0), (100, "second_0", 3, -7.0), (200, "first_0", 0, 0.0),
            (200, "second_0", 2, 1.5), (300, "first_0", 3, 12.0), (300, "second_0", 3, 9.0)]
    with open(run_dir / "eval.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "seat", "opponent", "episodes", "mean", "std", "ci_low", "ci_high", "length_mean",
                    "epsilon", "wall_time"])
        for step, seat, n, mean in rows:
            w.writerow([step, seat, "random", n, mean, 1.0, mean - 1, mean + 1, 900, 0.05, 1.0])
    fig = learning_curves_figure([load_run(run_dir, source="eval")], window=1, size=(600, 300))
    first, second = (ax.get_lines()[0] for ax in fig.axes)
    assert list(first.get_xdata()) == [100, 300] and list(first.get_ydata()) == [-5.0, 12.0]
    assert list(second.get_xdata()) == [100, 200, 300] and list(second.get_ydata()) == [-7.0, 1.5, 9.0]
    out = tmp_path / "eval.png"
    proc = run_cli(madqn_cli, "plot", run_dir, "--source", "eval", "--smooth", "1", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with Image.open(out) as im:
        assert im.size == (1200, 450)
