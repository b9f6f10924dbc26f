"""Numerical guard: stop a run whose Q-values, TD errors or weights became NaN/Inf, and never checkpoint them.

Checked every ``prog_freq`` agent steps (before the metrics report consumes the learners' per-update
statistics) and before every checkpoint write: a few host syncs per learner per check, never one
per update, so it costs nothing measurable on a GPU. A diverged run stops after the current step
with a message naming the step and the learner; its last good checkpoint is kept.
"""

from __future__ import annotations

import torch

from madqn.errors import NonFiniteError
from madqn.training.learners import SHARED, UPDATE_STAT_KEYS
from madqn.training.trainer import Hook, Trainer

_STAT_NAMES = {"abs_delta": "the TD error (delta)", "q_mean": "the Q-values Q(s, a)",
               "q2_max": "the target Q-values max_a Q_target(s2, a)"}


def _learner_label(trainer: Trainer, group) -> str:
    if group.name == SHARED:
        return f"the shared learner (agents {', '.join(group.agents)})"
    return f"the learner of agent {group.agents[0]}"


def find_non_finite(trainer: Trainer) -> str | None:
    """What is NaN/Inf (statistics since the last report, online or target weights), or None."""
    for g in trainer.groups:
        label = _learner_label(trainer, g)
        for key, what in zip(UPDATE_STAT_KEYS, g.update_stats.finite_flags()):
            if not what:
                return f"{_STAT_NAMES[key]} of {label} became NaN/Inf"
        for kind, net in (("online", g.learner.online_network), ("target", g.learner.target_network)):
            params = list(net.parameters())
            if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
                name = next(n for n, p in net.named_parameters() if not bool(torch.isfinite(p).all()))
                return f"the {kind} network weights ({name}) of {label} became NaN/Inf"
    return None


class NumericsGuard(Hook):
    """Checks every ``prog_freq`` steps; on a NaN/Inf records ``error`` and asks the trainer to stop.

    Register it before the metrics hook (which clears the statistics it reads).
    """

    def __init__(self) -> None:
        self.error: NonFiniteError | None = None
        self.last_finite_step = 0

    def on_start(self, trainer: Trainer) -> None:
        self.last_finite_step = trainer.step
        self.next_check = (trainer.step // trainer.config.prog_freq + 1) * trainer.config.prog_freq

    def on_step(self, trainer: Trainer) -> None:
        if trainer.step >= self.next_check:
            self.check(trainer)
            self.next_check = (trainer.step // trainer.config.prog_freq + 1) * trainer.config.prog_freq

    def check(self, trainer: Trainer) -> bool:
        """True when everything is finite; otherwise record the error, stop the run, return False."""
        if self.error is not None:
            return False
        problem = find_non_finite(trainer)
        if problem is None:
            self.last_finite_step = trainer.step
            return True
        self.error = NonFiniteError(f"NaN/Inf at step {trainer.step}: {problem} "
                                    f"(all finite at step {self.last_finite_step}); training stopped")
        trainer.stop_requested = True
        return False
