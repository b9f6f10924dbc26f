"""Checkpoints: written atomically, loaded without executing pickled code (``weights_only=True``).

A checkpoint is a dict of tensors and plain Python values: format version, resolved config, step
counters, every learner's online/target networks and optimizer state, and RNG states. The file is
written to a temporary name in the same directory, fsynced and renamed, so a crash mid-write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from madqn.env import action_starts, observation_specs
from madqn.errors import CheckpointError

FORMAT_VERSION = 1


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to ``path`` via a fsynced temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def safe_load(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a madqn checkpoint without unpickling arbitrary objects; one clear error otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle.UnpicklingError, RuntimeError (truncated zip), EOFError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"refusing to load {path}: not a valid madqn checkpoint ({first[:200]})") from None
    if not isinstance(obj, dict) or "format_version" not in obj:
        raise CheckpointError(f"refusing to load {path}: not a madqn checkpoint")
    if obj["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {obj['format_version']} is not supported "
                              f"(this madqn reads format {FORMAT_VERSION})")
    return obj


def trainer_state(trainer: Any) -> dict[str, Any]:
    """Everything needed to continue ``trainer`` (not the replay memory; see ``replay_state``)."""
    return {
        "format_version": FORMAT_VERSION,
        "config": trainer.config.to_dict(),
        "agents": list(trainer.agents),
        # how each agent's raw observations become network inputs (madqn.load_agents needs it)
        "observations": {a: spec.to_dict() for a, spec in observation_specs(trainer.envs[0], trainer.config).items()},
        "action_starts": action_starts(trainer.envs[0]),
        "step": trainer.step,
        "episodes": trainer.episodes,
        "groups": {g.name: {"agents": list(g.agents), "n_actions": g.n_actions, "learner": g.learner.state_dict(),
                            "updates": g.updates, "r_max": g.learner.r_max} for g in trainer.groups},
        "rng": {"numpy": trainer.rng.bit_generator.state, "torch": torch.get_rng_state()},
    }


def replay_state(trainer: Any) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "step": trainer.step,
            "groups": {g.name: {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                for k, v in g.replay.state_dict().items()} for g in trainer.groups}}


def check_compatible(state: dict[str, Any], trainer: Any, path: Path) -> None:
    """Refuse a checkpoint whose networks cannot belong to ``trainer`` (naming the mismatch)."""
    want_sharing = trainer.config.sharing
    got_sharing = state["config"].get("sharing")
    if got_sharing != want_sharing:
        raise CheckpointError(f"{path}: checkpoint has sharing = {got_sharing}, this run has sharing = {want_sharing}")
    if list(state["agents"]) != list(trainer.agents):
        raise CheckpointError(f"{path}: checkpoint agents {state['agents']} differ from the env's {trainer.agents}")
    for g in trainer.groups:
        saved = state["groups"].get(g.name)
        if saved is None:
            raise CheckpointError(f"{path}: checkpoint has no network for {g.name}")
        if saved["n_actions"] != g.n_actions:
            raise CheckpointError(f"{path}: {g.name} has {saved['n_actions']} actions in the checkpoint "
                                  f"but {g.n_actions} in this env")


def restore_trainer(trainer: Any, state: dict[str, Any], path: Path) -> None:
    check_compatible(state, trainer, path)
    trainer.step = int(state["step"])
    trainer.episodes = int(state["episodes"])
    for g in trainer.groups:
        saved = state["groups"][g.name]
        try:
            g.learner.load_state_dict(saved["learner"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: network of {g.name} does not fit this config ({str(e).splitlines()[0]})") from None
        g.updates = int(saved["updates"])
        g.learner.r_max = float(saved["r_max"])
    trainer.rng.bit_generator.state = state["rng"]["numpy"]
    torch.set_rng_state(state["rng"]["torch"])


def restore_replay(trainer: Any, state: dict[str, Any]) -> None:
    for g in trainer.groups:
        saved = state["groups"][g.name]
        g.replay.load_state_dict({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in saved.items()})
