"""``madqn export RUN_DIR|CHECKPOINT --out FILE.pt``: trained agents as a small weights-only file.

The file (kind ``madqn-agents``) holds what playing needs and nothing else: each learner's ONLINE
network weights (fp32, as trained), which agents it plays, its action count and the minibatch updates that
trained it, the resolved config, every agent's observation spec and action offset, and the agent step the
weights come from. No target
network, optimizer state, replay memory, generator or emulator state: a pong_v3 model is ~6.8 MB
(shared) or ~13.5 MB (independent), against ~27 MB for a trainer checkpoint.

It loads wherever a checkpoint does: ``madqn eval FILE``, ``madqn video FILE``,
``madqn.load_agents(FILE)``, with the same safe loading (``checkpoint.safe_load``: zip checksums,
``torch.load(weights_only=True)``, format version, kind and layout checked; one clear line otherwise).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madqn.cli.evaluate import add_checkpoint_option, checkpoint_file
from madqn.cli.registry import command
from madqn.commands import madqn_command
from madqn.errors import CheckpointError, MadqnError
from madqn.evaluation.agents import Agents
from madqn.training.checkpoint import (AGENTS_KIND, FORMAT_VERSION, PLAY_KINDS, atomic_save, format_updates, online_weights,
                                      safe_load, updates_of)

__all__ = ["ExportResult", "agents_state", "export_agents"]


@dataclass
class ExportResult:
    path: Path  # the written file
    size: int  # bytes
    source: Path  # the checkpoint it was made from
    step: int  # agent step of the exported weights
    agents: list[str]
    groups: dict[str, list[str]]  # network name -> the agents it plays
    updates: dict[str, int | None]  # network name -> minibatch updates that trained it (None: not recorded)
    parameters: int  # number of network weights in the file


def agents_state(state: dict[str, Any]) -> dict[str, Any]:
    """The playing part of a trainer checkpoint (or of an export): a new ``madqn-agents`` dict.

    Weights are cloned so that each tensor owns a compact storage (a checkpoint's tensors may be
    views of larger storages, which ``torch.save`` would write whole).
    """
    groups = {}
    for name, group in state["groups"].items():
        groups[name] = {"agents": list(group["agents"]), "n_actions": int(group["n_actions"]),
                        "online": {k: v.detach().to("cpu").clone() for k, v in online_weights(group).items()}}
        if group.get("updates") is not None:  # exports made before updates were recorded have none
            groups[name]["updates"] = int(group["updates"])
    return {
        "format_version": FORMAT_VERSION,
        "kind": AGENTS_KIND,
        "config": dict(state["config"]),
        "agents": list(state["agents"]),
        "observation_specs": {a: dict(d) for a, d in state["observation_specs"].items()},
        "action_starts": {a: int(s) for a, s in state.get("action_starts", {}).items()},
        "step": int(state["step"]),
        "groups": groups,
    }


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: equal resolved paths, or (both existing) one inode (hard links)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be examined): not the same existing file
        return False


def check_destination(source: Path, out: Path, force: bool = False) -> None:
    """Refuse (``MadqnError``, one line) an ``out`` that is ``source`` itself, even with ``force``: replacing a
    trainer checkpoint with its agents would end the run's ability to resume; and an existing ``out`` without
    ``force``."""
    if _same_file(source, out):
        raise MadqnError(f"--out {out} is the checkpoint being exported (its own source); write the agents to another file")
    if out.is_dir():
        raise MadqnError(f"--out {out} is a directory; give a file name such as {out / 'agents.pt'}")
    if (out.exists() or out.is_symlink()) and not force:
        raise MadqnError(f"--out {out} already exists; give another name, or --force to replace it")


def export_agents(source: str | Path, out: str | Path, checkpoint: str = "latest",
                  force: bool = False) -> ExportResult:
    """Write ``source``'s agents (a run directory's ``checkpoints/<checkpoint>.pt``, or a checkpoint or
    export file) to ``out`` as a ``madqn-agents`` file; raises ``MadqnError`` with one line on bad input.

    ``out`` is never the source file (by resolved path, symlink or hard link) and never an existing file
    unless ``force``."""
    file = checkpoint_file(source, checkpoint)
    out = Path(out)
    check_destination(file, out, force)
    state = safe_load(file, kind=PLAY_KINDS)
    if "observation_specs" not in state:
        raise CheckpointError(f"{file} predates stored observation specs; it cannot be exported")
    try:
        exported = agents_state(state)
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"refusing to export {file}: entry {e} is missing or malformed") from None
    Agents.from_state(exported, source=str(file))  # the networks must load as madqn eval will load them
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_save(exported, out)
    except OSError as e:
        raise MadqnError(f"cannot write {out}: {e.strerror or e}") from None
    groups = exported["groups"]
    return ExportResult(path=out, size=out.stat().st_size, source=file, step=exported["step"],
                        agents=exported["agents"], groups={n: g["agents"] for n, g in groups.items()},
                        updates=updates_of(exported),
                        parameters=sum(t.numel() for g in groups.values() for t in g["online"].values()))


@command
def _export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a run's trained networks to a small weights-only file (for eval, video, load_agents)",
        description="Write the online Q-networks of a run (fp32, as trained), its config, observation specs and "
                    "action offsets to one file: no optimizer, target network or replay memory. The file loads "
                    "with 'madqn eval FILE', 'madqn video FILE' and madqn.load_agents(FILE).")
    p.add_argument("run", metavar="RUN_DIR|CHECKPOINT", help="run directory or checkpoint file")
    p.add_argument("--out", required=True, metavar="FILE.pt",
                   help="the file to write (its folder is created); never the source checkpoint")
    p.add_argument("--force", action="store_true", help="replace --out if it exists (never the source)")
    add_checkpoint_option(p)
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    result = export_agents(args.run, args.out, args.checkpoint, force=args.force)
    networks = ", ".join(f"{name} ({', '.join(agents)})" for name, agents in result.groups.items())
    print(f"wrote {result.path}: {result.size / 1e6:.1f} MB, {result.parameters:,} fp32 weights, networks {networks}, "
          f"step {result.step:,}, {format_updates(result.updates)}, from {result.source}")
    print(f"play it: {madqn_command('eval', result.path, '--opponent', 'random')}; "
          f"{madqn_command('video', result.path)}")
    return 0
