"""The short table printed at the end of a command: how far the run got, how well each agent did, where its files are.

Built from the run directory alone (``summarize_run``), so any command (train, eval, compare,
video) can print it for any run. Scores come from ``episodes.csv``: the mean raw score of each
agent's last ``window`` training episodes (``final``) and the best such running mean (``best``).
Evaluation results get their own columns: passed in as ``evaluations``, or else the run's periodic
evaluations (``eval.csv``: the last one and the best one per seat); nothing is shown for
evaluations that did not happen.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from madqn.commands import madqn_command, tensorboard_command
from madqn.config import load_toml
from madqn.errors import MadqnError


@dataclass
class AgentResult:
    episodes: int
    final: float  # mean raw score of the last `window` episodes
    best: float  # best running mean over `window` consecutive episodes
    eval_final: float | None = None
    eval_best: float | None = None


@dataclass
class RunSummary:
    run_dir: Path
    env: str
    sharing: str
    seed: int
    steps: int  # agent steps done
    total_steps: int  # agent steps asked for (config.steps)
    episodes: int  # finished episodes (of all env copies)
    wall_time: float | None  # seconds
    updates: dict[str, int]  # learner -> gradient updates
    agents: dict[str, AgentResult]
    window: int
    files: dict[str, str] = field(default_factory=dict)  # what -> where (or the command that makes it)
    precision: str = "fp32"  # the learner's arithmetic as it ran (config.toml records "auto" resolved)


def running_best(scores: np.ndarray, window: int) -> float:
    """Best mean over ``window`` consecutive scores (all of them when there are fewer)."""
    if scores.size <= window:
        return float(scores.mean())
    csum = np.concatenate([[0.0], np.cumsum(scores)])
    return float(((csum[window:] - csum[:-window]) / window).max())


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize_run(run_dir: str | Path, *, wall_time: float | None = None, window: int = 20,
                  evaluations: dict[str, tuple[float, float]] | None = None) -> RunSummary:
    """Read ``run_dir`` (config.toml, episodes.csv, train.csv, checkpoints/, events, plots/, videos/).

    ``evaluations``: agent -> (final, best) evaluation score, from a command that evaluated.
    ``wall_time`` defaults to the last ``wall_time`` in train.csv.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise MadqnError(f"{run_dir} has no config.toml: not a madqn run directory")
    config = load_toml(run_dir / "config.toml")
    episodes = _read_csv(run_dir / "episodes.csv")
    train = _read_csv(run_dir / "train.csv")
    scores: dict[str, list[float]] = {}
    for row in episodes:
        scores.setdefault(row["agent"], []).append(float(row["score"]))
    agents: dict[str, AgentResult] = {}
    for agent, values in scores.items():
        arr = np.asarray(values)
        agents[agent] = AgentResult(len(values), float(arr[-window:].mean()), running_best(arr, window))
    if evaluations is None:
        evaluations = periodic_evaluations(run_dir)
    for agent, (final, best) in evaluations.items():
        result = agents.setdefault(agent, AgentResult(0, float("nan"), float("nan")))
        result.eval_final, result.eval_best = final, best
    steps = max((int(r["step"]) for r in train), default=max((int(r["step"]) for r in episodes), default=0))
    last = [r for r in train if int(r["step"]) == steps]
    if wall_time is None and last:
        wall_time = float(last[-1]["wall_time"])
    summary = RunSummary(
        run_dir=run_dir, env=str(config.get("env", "?")), sharing=str(config.get("sharing", "?")),
        seed=int(config.get("seed", 0)), steps=steps, total_steps=int(config.get("steps", steps)),
        episodes=len({(r["episode"]) for r in episodes}), wall_time=wall_time,
        updates={r["learner"]: int(r["updates"]) for r in last}, agents=agents, window=window,
        precision=str(config.get("precision", "fp32")))
    summary.files = _files(run_dir)
    return summary


def periodic_evaluations(run_dir: Path) -> dict[str, tuple[float, float]]:
    """Seat -> (score of the last periodic evaluation, best evaluation score) from ``eval.csv``
    (``madqn.evaluation.eval_hook``); evaluations in which the seat completed no episode are skipped."""
    scores: dict[str, list[float]] = {}
    for row in _read_csv(Path(run_dir) / "eval.csv"):
        if int(row["episodes"]) > 0:
            scores.setdefault(row["seat"], []).append(float(row["mean"]))
    return {seat: (values[-1], max(values)) for seat, values in scores.items()}


def _files(run_dir: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    checkpoints = sorted((run_dir / "checkpoints").glob("*.pt"))
    if checkpoints:
        files["checkpoints"] = ", ".join(str(p) for p in checkpoints)
    metrics = [run_dir / n for n in ("episodes.csv", "train.csv", "eval.csv", "valid.csv") if (run_dir / n).is_file()]
    metrics += sorted(p for p in run_dir.glob("*.csv") if p not in metrics)
    if metrics:
        files["metrics"] = ", ".join(str(p) for p in metrics)
    if any(run_dir.glob("events.out.tfevents.*")):
        files["tensorboard"] = tensorboard_command(run_dir)
    plots = sorted((run_dir / "plots").glob("*.png"))
    files["plots"] = ", ".join(map(str, plots)) if plots else madqn_command("plot", run_dir)
    videos = sorted(p for p in (run_dir / "videos").glob("*") if p.suffix in (".mp4", ".gif"))
    if videos:
        shown = ", ".join(map(str, videos[-2:]))
        files["videos"] = (f"{len(videos)} in {run_dir / 'videos'} (latest {shown})" if len(videos) > 2 else shown)
    elif checkpoints:
        files["videos"] = madqn_command("video", run_dir, "--out", run_dir / "videos" / "eval.mp4")
    return files


def _num(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def format_summary(s: RunSummary) -> str:
    """A few aligned lines: the run, then one row per agent, then the files."""
    wall = "" if s.wall_time is None else f", {s.wall_time:.1f} s wall ({s.steps / max(s.wall_time, 1e-9):.0f} steps/s)"
    updates = ", ".join(f"{k} {v}" for k, v in s.updates.items()) or "none"
    precision = "" if s.precision == "fp32" else f", precision {s.precision}"
    lines = [f"run {s.run_dir}: {s.env}, sharing {s.sharing}, seed {s.seed}{precision}",
             f"  {s.steps}/{s.total_steps} agent steps, {s.episodes} episodes{wall}; updates: {updates}"]
    has_eval = any(a.eval_final is not None for a in s.agents.values())
    header = ["agent", "episodes", f"final (last {s.window} ep)", f"best ({s.window}-ep mean)"]
    if has_eval:
        header += ["eval final", "eval best"]
    rows = [header]
    for agent, a in s.agents.items():
        row = [agent, str(a.episodes), _num(a.final), _num(a.best)]
        if has_eval:
            row += [_num(a.eval_final), _num(a.eval_best)]
        rows.append(row)
    if len(rows) == 1:
        lines.append("  no finished episodes yet")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    key_w = max((len(k) for k in s.files), default=0)
    lines += [f"  {k.ljust(key_w)}  {v}" for k, v in s.files.items()]
    return "\n".join(lines)
