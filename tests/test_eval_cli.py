"""`madqn eval` on a trained envs/catch.py run: the trained agents beat random; self-play, cross-play, best
checkpoint, video; periodic evaluation files of the training run; one-line errors.

One training run (configs/catch_small.toml, 4000 agent steps, shared network, about half a CPU minute)
feeds the tests. Thresholds as in the custom-env learning test (tests/test_learning.py): random
catchers score about -2.5 per 5-ball episode, trained ones 4.5..4.9.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from madqn.cli import main
from madqn.training.checkpoint import safe_load
from helpers import read_csv, run_madqn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'envs' / 'catch.py'}:make_small_env"
CONFIG = ROOT / "configs" / "catch_small.toml"
AGENTS = ["catcher_0", "catcher_1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evalcli")
    run_dir = tmp / "catch"
    proc = run_madqn("train", "--env", CATCH, "--config", CONFIG, "--run-dir", run_dir, "--set", "eval_freq=1000",
               "--set", "eval_steps=450", "--set", "valid_size=100", "--set", "final_eval_episodes=0", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def test_periodic_evaluation_files(trained):
    run_dir, stdout = trained
    evals = read_csv(run_dir / "eval.csv")
    assert [int(r["step"]) for r in evals] == [1000, 1000, 2000, 2000, 3000, 3000, 4000, 4000]
    assert [r["seat"] for r in evals] == AGENTS * 4
    episodes = read_csv(run_dir / "eval_episodes.csv")
    for r in evals:  # eval.csv is the summary of eval_episodes.csv
        mine = [float(e["score"]) for e in episodes
                if e["step"] == r["step"] and e["seat"] == r["seat"] and e["player"] == "trained"]
        # 450 steps split between 2 seats: 225 each, 45-step episodes -> 5 complete episodes per seat
        assert int(r["episodes"]) == len(mine) == 5
        assert float(r["mean"]) == pytest.approx(np.mean(mine))
        assert float(r["std"]) == pytest.approx(np.std(mine, ddof=1))
        assert r["opponent"] == "random"
    scores = {}
    for r in evals:
        scores.setdefault(int(r["step"]), []).append(float(r["mean"]))
    best_step = max(scores, key=lambda s: (np.mean(scores[s]), -s))
    best = safe_load(run_dir / "checkpoints" / "best.pt")
    assert best["best"]["step"] == best_step and best["best"]["score"] == pytest.approx(np.mean(scores[best_step]))
    assert best["step"] == best_step
    valid = read_csv(run_dir / "valid.csv")
    assert [(int(r["step"]), r["learner"], int(r["size"])) for r in valid] == [(s, "shared", 100)
                                                                              for s in (1000, 2000, 3000, 4000)]
    assert all(np.isfinite(float(r["V"])) and 0 <= float(r["td_error"]) <= 1 for r in valid)
    assert "eval step 1000 (random): catcher_0" in stdout
    assert "eval step 1000 (random): episode 10 | " in stdout  # progress: 5 episodes per seat, then the summary
    # the end-of-run summary shows the last and the best periodic evaluation per seat
    assert "eval final" in stdout and "eval best" in stdout
    for seat in AGENTS:
        means = [float(r["mean"]) for r in evals if r["seat"] == seat]
        line = next(x for x in stdout.splitlines() if x.strip().startswith(seat))
        assert line.split()[-2:] == [f"{means[-1]:.2f}", f"{max(means):.2f}"]


def test_trained_agents_beat_random(trained, tmp_path):
    run_dir, _ = trained
    proc = run_madqn("eval", run_dir, "--episodes", 20, "--seed", 5, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = run_dir / "evals" / "random-s5-n20.csv"
    rows = read_csv(out)
    assert len(rows) == 3 * 20 * 2  # 2 vs-random settings + the baseline, 20 episodes, 2 seats
    summary = json.loads(out.with_suffix(".json").read_text())
    for seat in AGENTS:
        trained_scores = [float(r["score"]) for r in rows if r["match"] == "vs_random" and r["seat"] == seat
                          and r["player"] == "catch"]
        random_scores = [float(r["score"]) for r in rows if r["match"] == "random_vs_random" and r["seat"] == seat]
        assert len(trained_scores) == len(random_scores) == 20
        assert np.mean(trained_scores) >= 1.0 and np.mean(trained_scores) - np.mean(random_scores) >= 3.0
        line = next(e for e in summary["lines"] if e["player"] == "catch" and e["seat"] == seat)
        assert line["mean"] == pytest.approx(np.mean(trained_scores))
        assert line["half_width"] == pytest.approx(2.093024 * np.std(trained_scores, ddof=1) / np.sqrt(20))
        wins = sum(1 for r in rows if r["match"] == "vs_random" and r["seat"] == seat and r["player"] == "catch"
                   and r["outcome"] == "win")
        assert line["record"]["wins"] == wins
    assert "catch (baseline)" not in proc.stdout and "random (baseline)" in proc.stdout
    assert "catcher_0  catch" in proc.stdout and "win / draw / loss" in proc.stdout


def test_self_cross_best_and_video(trained, tmp_path):
    run_dir, _ = trained
    proc = run_madqn("eval", run_dir, "--opponent", "self", "--episodes", 3, "--out", tmp_path / "self.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {r["setting"] for r in read_csv(tmp_path / "self.csv")} == {"catcher_0=catch catcher_1=catch"}

    proc = run_madqn("eval", run_dir, "--opponent", run_dir, "--checkpoint", "best", "--episodes", 3,
               "--out", tmp_path / "cross.csv", "--video", tmp_path / "cross.gif", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(tmp_path / "cross.csv")
    assert [s for s in dict.fromkeys(r["setting"] for r in rows)] == [
        "catcher_0=A_catch@best catcher_1=B_catch@best", "catcher_0=B_catch@best catcher_1=A_catch@best"]
    summary = json.loads((tmp_path / "cross.json").read_text())
    a, b = (next(e for e in summary["lines"] if e["player"] == p and e["seat"] == "all")
            for p in ("A_catch@best", "B_catch@best"))
    assert a["mean"] == b["mean"] and a["n"] == b["n"] == 6  # clones, seats swapped: identical
    assert (tmp_path / "cross.gif").stat().st_size > 0 and "video:" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["missing_dir"], "not found"),
    (["RUN", "--episodes", "0"], "--episodes must be >= 1"),
    (["RUN", "--opponent", "nowhere"], "not found: nowhere"),
    (["RUN", "--eps", "2"], "--eps must be in [0, 1]"),
    (["RUN", "--video", "x.avi"], "must end in .mp4 or .gif"),
])
def test_bad_input_is_one_line(trained, capsys, tmp_path, args, message):
    run_dir, _ = trained
    monkey_args = [str(run_dir) if a == "RUN" else a for a in args]
    os.chdir(tmp_path)
    code = main(["eval", *monkey_args, "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_best_checkpoint_missing_is_one_line(tmp_path, capsys):
    import madqn

    run = tmp_path / "run"
    madqn.train(CATCH, CONFIG, run_dir=run, steps=50, eval_freq=0, final_eval_episodes=0)
    code = main(["eval", str(run), "--checkpoint", "best"])
    err = capsys.readouterr().err
    assert code == 2 and "best.pt is written by periodic evaluation" in err
    assert torch.is_tensor(safe_load(run / "checkpoints" / "latest.pt")["rng"]["torch"])
