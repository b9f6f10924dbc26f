"""`madqn compare` end to end on envs/catch.py with tiny budgets: every artefact, the report's numbers
recomputed directly from the raw CSV, reruns that keep finished runs and reuse evaluations, resuming.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from madqn.evaluation.aggregate import game_aggregate
from madqn.evaluation.rating import expected_score
from helpers import read_csv, run_madqn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'envs' / 'catch.py'}:make_small_env"
CONFIG = ROOT / "configs" / "catch_small.toml"
SEATS = ["catcher_0", "catcher_1"]
T975 = {1: 12.706205, 2: 4.302653, 3: 3.182446, 8: 2.306004}
SEEDS = (1, 2, 3)
ARGS = ["--env", CATCH, "--config", CONFIG, "--steps", "300", "--seeds", "3", "--episodes", "4", "--jobs", "2",
        "--h2h-episodes", "2", "--set", "learn_start=100", "--set", "eval_freq=100", "--set", "eval_steps=90",
        "--set", "valid_size=50", "--set", "prog_freq=100", "--set", "save_freq=150",
        "--set", "final_eval_episodes=0"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    out = tmp / "cmp"
    proc = run_madqn("compare", *ARGS, "--out", out, cwd=tmp)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-3000:]
    return tmp, out, proc.stdout


def half(values):
    n = len(values)
    return T975[n - 1] * np.std(values, ddof=1) / math.sqrt(n)


def test_every_artefact_is_written(compared):
    _, out, stdout = compared
    for name in ("report.md", "results.json", "episodes.csv", "runs.csv", "ratings.csv", "curves.csv",
                 "config.toml", "learning_curves.png", "training_curves.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for png in ("learning_curves.png", "training_curves.png"):
        assert Image.open(out / png).size == (1200, 450)
    for variant in ("shared", "independent"):
        for seed in SEEDS:
            run = out / "runs" / f"{variant}-s{seed}"
            for name in ("config.toml", "episodes.csv", "train.csv", "eval.csv", "valid.csv",
                         "checkpoints/latest.pt", "checkpoints/best.pt"):
                assert (run / name).is_file(), run / name
            assert [int(r["step"]) for r in read_csv(run / "eval.csv")] == [100, 100, 200, 200, 300, 300]
    report = (out / "report.md").read_text()
    for heading in ("## Summary", "## Head-to-head", "## Runs", "## Ratings", "## Random baseline",
                    "## Learning curves", "## Protocol", "## Config"):
        assert heading in report
    assert "![periodic evaluation](learning_curves.png)" in report
    assert "report: " in stdout and "head-to-head: shared" in stdout
    assert "compare: evaluation: episode " in stdout and " episodes/s | " in stdout


def test_report_numbers_equal_a_recomputation_from_the_raw_csv(compared):
    _, out, stdout = compared
    assert "aggregate, IQM over seeds x seats (raw scores; no published figures for this game; 95% stratified " \
           "bootstrap CI): shared " in stdout
    rows = read_csv(out / "episodes.csv")
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    summary_rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                    for line in report.split("## Head-to-head")[0].splitlines() if line.startswith("| ")}

    # score against random per variant and seat: each seed's mean over its episodes, then mean +- t CI over seeds
    for variant in ("shared", "independent"):
        seat_means = []
        for seat in SEATS:
            per_seed = []
            for seed in SEEDS:
                scores = [float(r["score"]) for r in rows if r["match"] == "vs_random" and r["seat"] == seat
                          and r["player"] == f"{variant}-s{seed}"]
                assert len(scores) == 4
                per_seed.append(np.mean(scores))
                run = next(x for x in results["runs"] if x["name"] == f"{variant}-s{seed}")
                assert run["final"]["vs_random"][seat]["mean"] == pytest.approx(np.mean(scores))
                assert run["final"]["vs_random"][seat]["half_width"] == pytest.approx(half(scores))
            got = results["variants"][variant]["vs_random"][seat]
            assert got["n"] == 3 and got["mean"] == pytest.approx(np.mean(per_seed))
            assert got["half_width"] == pytest.approx(half(per_seed))
            column = 1 + SEATS.index(seat)
            assert summary_rows[variant][column] == f"{np.mean(per_seed):.2f} ± {half(per_seed):.2f}"
            seat_means.append(per_seed)
        assert results["variants"][variant]["seeds"] == 3 and summary_rows[variant][0] == "3"
        # the aggregate: IQM over seeds x seats (catch has no published figures: raw scores), stratified by seat
        agg = results["variants"][variant]["aggregate"]
        assert agg == game_aggregate(CATCH, dict(zip(SEATS, seat_means)),
                                     {seat: results["baseline"][seat]["mean"] for seat in SEATS}).to_dict()
        pooled = np.sort(np.ravel(seat_means))  # 6 scores: int(1.5) = 1 cut at each end
        assert agg["iqm"] == pytest.approx(pooled[1:5].mean()) and agg["runs"] == 6 and not agg["normalized"]
        assert f"{variant} {agg['iqm']:.3g} [{agg['low']:.3g}, {agg['high']:.3g}]" in stdout
        assert f"{variant} {agg['iqm']:.3g} [{agg['low']:.3g}, {agg['high']:.3g}]" in report.split("Aggregate: ")[1]

    # the random baseline: all-random episodes on the same seeds
    for seat in SEATS:
        scores = [float(r["score"]) for r in rows if r["match"] == "random_vs_random" and r["seat"] == seat]
        assert len(scores) == 4
        assert results["baseline"][seat]["mean"] == pytest.approx(np.mean(scores))
        assert summary_rows["random (baseline)"][1 + SEATS.index(seat)] == f"{np.mean(scores):.2f} ± {half(scores):.2f}"
    assert sorted({int(r["seed"]) for r in rows}) == [100_000 + k for k in range(4)]

    # head-to-head: every shared final network against every independent one, seats swapped
    wins = draws = losses = 0
    pair_points = []
    for a in (f"shared-s{seed}" for seed in SEEDS):
        for b in [f"independent-s{seed}" for seed in SEEDS]:
            games = {}
            for r in rows:
                players = {p.split("=")[1] for p in r["setting"].split(" ")}
                if r["match"] == "cross" and players == {a, b} and r["player"] == a:
                    games[(r["setting"], r["episode"])] = r["outcome"]
            assert len(games) == 2 * 2  # 2 seat assignments x 2 episodes
            w, d, l = (sum(1 for o in games.values() if o == k) for k in ("win", "draw", "loss"))
            wins, draws, losses = wins + w, draws + d, losses + l
            pair_points.append((w + d / 2) / len(games))
    rec = results["head_to_head"]["record"]
    assert (rec["wins"], rec["draws"], rec["losses"]) == (wins, draws, losses)
    assert results["head_to_head"]["score"]["mean"] == pytest.approx(np.mean(pair_points))
    assert results["head_to_head"]["score"]["half_width"] == pytest.approx(half(pair_points))
    assert f"{wins}/{draws}/{losses} (" in report

    # ratings: at the fitted ratings each player's expected points equal its actual points, plus the
    # virtual draw per opponent met (the likelihood equations), computed here from the rows
    ratings = {r["player"]: float(r["rating"]) for r in read_csv(out / "ratings.csv")}
    assert ratings["random"] == 0.0
    episodes = {}
    for r in rows:
        if r["match"] != "random_vs_random":
            episodes.setdefault((r["match"], r["setting"], r["episode"]), {})[r["side"]] = r
    actual = {p: 0.0 for p in ratings}
    expected = {p: 0.0 for p in ratings}
    met = set()
    for sides in episodes.values():
        (x, y) = sides.values()
        if x["player"] == y["player"]:
            continue
        met.add(frozenset((x["player"], y["player"])))
        actual[x["player"]] += {"win": 1, "draw": 0.5, "loss": 0}[x["outcome"]]
        actual[y["player"]] += {"win": 1, "draw": 0.5, "loss": 0}[y["outcome"]]
        expected[x["player"]] += expected_score(ratings[x["player"]], ratings[y["player"]])
        expected[y["player"]] += expected_score(ratings[y["player"]], ratings[x["player"]])
    for pair in met:
        p, q = tuple(pair)
        actual[p] += 0.5
        actual[q] += 0.5
        expected[p] += expected_score(ratings[p], ratings[q])
        expected[q] += expected_score(ratings[q], ratings[p])
    for p in ratings:
        assert expected[p] == pytest.approx(actual[p], abs=1e-4), p

    # runs.csv and the run facts come from the runs' checkpoints and files
    for r in read_csv(out / "runs.csv"):
        assert int(r["steps"]) == 300
        train = read_csv(out / "runs" / r["run"] / "train.csv")
        updates = sum(int(t["updates"]) for t in train if int(t["step"]) == 300)
        assert int(r["updates"]) == updates and int(r["samples"]) == 32 * updates
        assert updates == (200 if r["variant"] == "shared" else 400)  # update_freq 1 after step 100, per learner


def test_rerun_keeps_finished_runs_and_reuses_evaluations(compared):
    tmp, out, _ = compared
    checkpoints = sorted((out / "runs").glob("*/checkpoints/*.pt"))
    before = {p: p.stat().st_mtime_ns for p in checkpoints}
    results_before = json.loads((out / "results.json").read_text())
    proc = run_madqn("compare", *ARGS, "--out", out, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finished earlier (300 agent steps): kept") == 6
    assert re.search(r"(\d+) of \1 evaluation matches read from", proc.stdout)
    assert {p: p.stat().st_mtime_ns for p in checkpoints} == before
    results = json.loads((out / "results.json").read_text())
    assert results["variants"] == results_before["variants"] and results["ratings"] == results_before["ratings"]


def test_unfinished_runs_resume_and_mismatched_configs_are_refused(compared, tmp_path):
    tmp, out, _ = compared
    # a run stopped at step 150 (its checkpoint) continues to 300; the other runs are kept
    from madqn.evaluation.compare import CompareSettings, plan_runs, train_command
    from madqn.config import make_config

    cfg = make_config(out / "config.toml")
    settings = CompareSettings(config=cfg, seeds=list(SEEDS), out=out)
    assert [p.status for p in plan_runs(settings)] == ["done"] * 6
    longer = CompareSettings(config=cfg.replace(steps=400), seeds=list(SEEDS), out=out)
    plans = plan_runs(longer)
    assert [(p.status, p.step) for p in plans] == [("resume", 300)] * 6
    command = train_command(longer, plans[0], out / "config.toml")
    assert command[-6:] == ["--resume", str(out / "runs" / "shared-s1"), "--steps", "400", "--set", "num_threads=1"] \
        or command[-4:] == ["--resume", str(out / "runs" / "shared-s1"), "--steps", "400"]
    proc = run_madqn("compare", *ARGS, "--out", out, "--set", "lr=0.001", cwd=tmp)
    assert proc.returncode == 2 and "was trained with lr = 0.0005" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_ctrl_c_stops_the_comparison_with_checkpoints(tmp_path):
    """SIGINT to `madqn compare` reaches the training child once: it checkpoints and stops; the comparison
    stops with one line, and a rerun would resume that run."""
    import signal
    import time

    from madqn.evaluation.compare import CompareSettings, plan_runs
    from madqn.config import make_config

    out = tmp_path / "cmp"
    args = [*ARGS[:ARGS.index("--steps")], "--steps", "20000", *ARGS[ARGS.index("--steps") + 2:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "madqn", "compare", *args, "--jobs", "1", "--out", str(out)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        checkpoint = out / "runs" / "shared-s1" / "checkpoints" / "latest.pt"
        deadline = time.time() + 120
        while not checkpoint.is_file() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert checkpoint.is_file()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == ("madqn: error: compare stopped by SIGINT; the runs saved checkpoints: "
                                               "rerun the same command to continue")
    assert "stopped by SIGINT at step" in stdout  # the child's own graceful stop
    settings = CompareSettings(config=make_config(out / "config.toml"), seeds=[1, 2], out=out)
    plans = plan_runs(settings)
    assert plans[0].status == "resume" and 0 < plans[0].step < 20000
    assert [p.status for p in plans[1:]] == ["new"] * 3


@pytest.mark.parametrize("args, message", [
    (["--env", "nonexistent_v1"], "cannot resolve env 'nonexistent_v1'"),
    (["--env", f"{ROOT / 'envs' / 'gridrace.py'}:make_heterogeneous_env"], "a shared network cannot play this env"),
    (["--set", "sharing=shared"], "trains both sharing modes"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--episodes", "1"], "--episodes must be >= 2"),
    (["--set", "lr_typo=1"], "unknown config key 'lr_typo'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    from madqn.cli import main

    code = main(["compare", "--env", CATCH, "--steps", "10", "--out", str(tmp_path / "cmp"), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "cmp").exists()


@pytest.mark.slow
def test_compare_with_every_extension_switched_on(tmp_path):
    """`madqn compare` trains, evaluates and reports runs that use all five extensions (dueling networks
    loaded by the evaluation, prioritized n-step replay, Double DQN, Adam)."""
    out = tmp_path / "cmp"
    switches = ["--set", "double=true", "--set", "dueling=true", "--set", "n_step=3", "--set", "prioritized=true",
                "--set", 'optimizer="adam"']
    proc = run_madqn("compare", *ARGS, "--out", out, *switches, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-3000:]
    assert (out / "report.md").is_file()
    for variant in ("shared", "independent"):
        config = (out / "runs" / f"{variant}-s1" / "config.toml").read_text()
        for line in ("double = true", "dueling = true", "n_step = 3", "prioritized = true", 'optimizer = "adam"'):
            assert line in config
