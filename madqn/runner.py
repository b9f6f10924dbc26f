"""The trainer and hook API under its earlier name: ``madqn.runner.Hook`` is ``madqn.Hook`` (madqn.training.trainer)."""

from madqn.training.trainer import EpisodeRecord, Hook, Trainer, TrainerBase

__all__ = ["EpisodeRecord", "Hook", "Trainer", "TrainerBase"]
