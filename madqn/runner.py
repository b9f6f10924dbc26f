"""Deprecated: the trainer and hook API's earlier name. Import from ``madqn`` instead:
``from madqn import Hook, Trainer, EpisodeRecord`` (``TrainerBase``: ``madqn.training.trainer``).
This module goes away in a later release."""

import warnings

from madqn.training.trainer import EpisodeRecord, Hook, Trainer, TrainerBase

warnings.warn("madqn.runner is deprecated: import Hook, Trainer and EpisodeRecord from madqn "
              "(TrainerBase from madqn.training.trainer)", DeprecationWarning, stacklevel=2)

__all__ = ["EpisodeRecord", "Hook", "Trainer", "TrainerBase"]
