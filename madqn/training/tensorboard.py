"""TensorBoard event files in the run directory, for watching a run live (``tensorboard --logdir runs``).

The CSV files (``madqn.training.metrics``) stay the source of truth; this mirrors them. Tags:

- ``score/<agent>``, ``episode_length/<agent>``: every finished episode (raw score, agent steps);
- whatever is published with ``Trainer.log_scalars``: ``MetricsHook`` every ``prog_freq`` steps
  (``train/epsilon``, ``td_error/<learner>``, ``q_mean/<learner>``, ``q2_max/<learner>``,
  ``updates/<learner>``, ``perf/updates_per_s/<learner>``, ``perf/env_steps_per_s``,
  ``replay_fill/<learner>``, ``train/lr/<learner>``) and evaluation hooks (DQN3.0's validation V
  and TD error) when they run;
- the text ``config``: the resolved config.toml.

x is the agent step. Learner names are the agent names (independent) or ``shared``; the sharing
mode is in the run directory name and the config text.
"""

from __future__ import annotations

import math
from pathlib import Path

from madqn.training.trainer import EpisodeRecord, Hook, Trainer


def config_markdown(toml_text: str) -> str:
    """TensorBoard renders text as Markdown: indent the TOML so it shows verbatim as a code block."""
    return "\n".join("    " + line for line in toml_text.splitlines())


class TensorBoardHook(Hook):
    """Writes ``events.out.tfevents.*`` into ``run_dir`` with torch's ``SummaryWriter``.

    A resumed run (``trainer.step > 0`` at start) purges events logged after that step by an
    earlier, longer-lived writer, so the curves do not double back.
    """

    def __init__(self, run_dir: Path, flush_secs: int = 10):
        self.run_dir = Path(run_dir)
        self.flush_secs = flush_secs
        self.writer = None

    def on_start(self, trainer: Trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.run_dir), flush_secs=self.flush_secs,
                                    purge_step=trainer.step if trainer.step > 0 else None)
        self.writer.add_text("config", config_markdown(trainer.config.to_toml()), global_step=trainer.step)

    def on_episode(self, trainer: Trainer, record: EpisodeRecord) -> None:
        for agent, score in record.scores.items():
            if agent not in record.opponent_seats():  # a seat acting at random (random_opponent) is not the network
                self.writer.add_scalar(f"score/{agent}", score, record.step)
            self.writer.add_scalar(f"episode_length/{agent}", record.lengths[agent], record.step)

    def on_scalars(self, trainer: Trainer, step: int, scalars: dict[str, float]) -> None:
        if self.writer is None:
            return
        for name, value in scalars.items():
            value = float(value)
            if math.isfinite(value):  # no data yet (e.g. no update before learn_start) is not a point
                self.writer.add_scalar(name, value, step)

    def on_end(self, trainer: Trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
