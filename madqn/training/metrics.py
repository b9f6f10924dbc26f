"""Run metrics: CSV files are the source of truth.

Files in the run directory:
- ``episodes.csv``: one row per agent per finished episode (raw, unclipped score; ``random_seat`` 1 when the
  seat acted uniformly at random that episode, ``config.random_opponent``; ``snapshot_step`` the agent step of
  the opponent-pool snapshot that played the seat, empty when the current networks did, ``config.pool_every``).
- ``train.csv``: one row per learner every ``prog_freq`` agent steps (updates, mean |clipped delta|,
  mean Q(s,a), mean max Q_target(s2), epsilon, learning rate, agent steps/s).

Each ``train.csv`` report is also published with ``Trainer.log_scalars`` (names in ``report``), which
the progress display (``madqn.training.progress``) and TensorBoard (``madqn.training.tensorboard``) show.
"""

from __future__ import annotations

import csv
import time
from collections import deque
from pathlib import Path
from typing import TextIO

from madqn.training.trainer import EpisodeRecord, Hook, Trainer

EPISODE_FIELDS = ["step", "episode", "env", "agent", "score", "length", "truncated", "epsilon", "wall_time",
                  "random_seat", "snapshot_step"]
TRAIN_FIELDS = ["step", "learner", "updates", "abs_delta", "q_mean", "q2_max", "epsilon", "lr", "steps_per_s",
                "replay_size", "wall_time"]


class CsvWriter:
    """Append rows to a CSV file, writing the header once; flushed on every row.

    A file written by an earlier madqn whose columns are the first of ``fieldnames`` (a run resumed after
    columns were added) is rewritten once with the new header, its rows' new columns left empty."""

    def __init__(self, path: Path, fieldnames: list[str]):
        new = not path.exists() or path.stat().st_size == 0
        if not new:
            with open(path, newline="") as f:
                old = next(csv.reader(f), [])
                rows = list(csv.reader(f)) if old != fieldnames and old == fieldnames[:len(old)] else None
            if rows is not None:
                tmp = path.with_name(path.name + ".tmp")
                with open(tmp, "w", newline="") as f:
                    csv.writer(f).writerows([fieldnames, *rows])
                tmp.replace(path)
        self.file: TextIO = open(path, "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=fieldnames)
        if new:
            self.writer.writeheader()
            self.file.flush()

    def write(self, row: dict) -> None:
        self.writer.writerow(row)
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class MetricsHook(Hook):
    """Writes ``episodes.csv`` and ``train.csv`` (every ``prog_freq`` steps) and publishes each report as scalars."""

    def __init__(self, run_dir: Path, window: int = 20):
        self.run_dir = Path(run_dir)
        self.recent = {}  # agent -> deque of recent raw scores
        self.window = window
        self.episodes: CsvWriter | None = None
        self.train: CsvWriter | None = None
        self.last_step = 0
        self.last_time = time.time()

    def on_start(self, trainer: Trainer) -> None:
        self.episodes = CsvWriter(self.run_dir / "episodes.csv", EPISODE_FIELDS)
        self.train = CsvWriter(self.run_dir / "train.csv", TRAIN_FIELDS)
        self.recent = {a: deque(maxlen=self.window) for a in trainer.agents}
        for row in read_rows(self.run_dir / "episodes.csv"):  # a resumed run: its earlier episodes
            if row.get("agent") in self.recent and not played_by_opponent(row):
                self.recent[row["agent"]].append(float(row["score"]))
        self.last_step, self.last_time = trainer.step, time.time()
        self.last_updates = {g.name: g.updates for g in trainer.groups}
        self.next_report = (trainer.step // trainer.config.prog_freq + 1) * trainer.config.prog_freq

    def on_episode(self, trainer: Trainer, record: EpisodeRecord) -> None:
        eps = record.epsilon  # what the episode was played with (on Ray: by its actor)
        wall = time.time() - trainer.start_time
        for agent, score in record.scores.items():
            random_seat = agent in record.random_seats
            snapshot = record.snapshot_seats.get(agent)
            if not random_seat and snapshot is None:  # the recent scores are the networks'
                self.recent[agent].append(score)
            self.episodes.write({"step": record.step, "episode": record.episode, "env": record.env_index,
                                 "agent": agent, "score": score, "length": record.lengths[agent],
                                 "truncated": int(record.truncated),
                                 "epsilon": 1.0 if random_seat else trainer.config.eval_ep if snapshot is not None
                                 else round(eps, 6),
                                 "wall_time": round(wall, 3), "random_seat": int(random_seat),
                                 "snapshot_step": "" if snapshot is None else int(snapshot)})

    def on_step(self, trainer: Trainer) -> None:
        if trainer.step >= self.next_report:
            self.report(trainer)
            self.next_report = (trainer.step // trainer.config.prog_freq + 1) * trainer.config.prog_freq

    def on_end(self, trainer: Trainer) -> None:
        if trainer.step > self.last_step:
            # keep the statistics: a checkpoint written after this row carries them into a resumed
            # run, whose next regular row then covers the whole prog_freq interval
            self.report(trainer, clear=False)
        for w in (self.episodes, self.train):
            if w is not None:
                w.close()

    def report(self, trainer: Trainer, clear: bool = True) -> None:
        """One train.csv row per learner, published as scalars: ``train/epsilon``, ``perf/env_steps_per_s``
        (agent steps as ``madqn.config`` counts them), and per learner ``td_error/<learner>`` (mean
        |clipped delta|), ``q_mean/``, ``q2_max/``, ``updates/``, ``perf/updates_per_s/``, ``train/lr/``,
        ``replay_fill/`` (fraction of the learner's replay capacity in use)."""
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        sps = (trainer.step - self.last_step) / elapsed
        self.last_step, self.last_time = trainer.step, now
        eps = trainer.epsilon()
        scalars = {"train/epsilon": eps, "perf/env_steps_per_s": sps}
        for g in trainer.groups:
            stats = g.update_stats.means()
            if clear:
                g.update_stats.clear()
            lr = g.learner.optimizer.param_groups[0]["lr"]
            self.train.write({"step": trainer.step, "learner": g.name, "updates": g.updates,
                              "abs_delta": stats["abs_delta"], "q_mean": stats["q_mean"], "q2_max": stats["q2_max"],
                              "epsilon": round(eps, 6), "lr": lr, "steps_per_s": round(sps, 2),
                              "replay_size": len(g.replay), "wall_time": round(now - trainer.start_time, 3)})
            updates_per_s = (g.updates - self.last_updates.get(g.name, g.updates)) / elapsed
            self.last_updates[g.name] = g.updates
            scalars.update({
                f"td_error/{g.name}": stats["abs_delta"], f"q_mean/{g.name}": stats["q_mean"],
                f"q2_max/{g.name}": stats["q2_max"], f"updates/{g.name}": g.updates,
                f"perf/updates_per_s/{g.name}": updates_per_s, f"train/lr/{g.name}": lr,
                f"replay_fill/{g.name}": len(g.replay) / (g.replay.capacity * g.replay.n_streams)})
        trainer.log_scalars(scalars)


def read_rows(path: Path) -> list[dict]:
    """The rows of a metrics CSV (none if it does not exist yet)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def played_by_opponent(row: dict) -> bool:
    """An ``episodes.csv`` row of a seat the current networks did not play that episode: a random player
    (``random_opponent``) or an opponent-pool snapshot (``pool_every``); its score is not the networks'."""
    return played_randomly(row) or bool(row.get("snapshot_step"))


def played_randomly(row: dict) -> bool:
    """An ``episodes.csv`` row of a seat that acted uniformly at random that episode (``config.random_opponent``):
    its score is a random player's, not a network's (files from before the column have none)."""
    return row.get("random_seat") == "1"
