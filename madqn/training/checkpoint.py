"""Checkpoints: written atomically, loaded without executing pickled code, checked before use.

``checkpoints/latest.pt`` (kind ``madqn-trainer``) holds a format version, the resolved config,
the step, episode and update counters, every learner's online/target networks, optimizer state and
pending statistics, all random generator states, and the acting state: per env copy the emulator
state (when the env can capture it, as madqn's own ``AtariEnv`` does) and per agent seat its recent
history, the transition waiting for its reward, its episode score and length. Epsilon and the
learning rate are functions of the step (DQN3.0's schedules), so the step restores them.
``checkpoints/replay.pt`` (kind ``madqn-replay``, only with ``save_replay = true``) holds the replay
memory, tagged with the step of the checkpoint it belongs to. ``madqn export`` writes kind
``madqn-agents`` (madqn.cli.export): only what playing needs, loaded like a checkpoint by ``madqn eval``,
``madqn video`` and ``madqn.load_agents`` (``PLAY_KINDS``).

Writing: a temporary file in the same directory, fsync, rename, fsync of the directory; a crash or a
full disk mid-write leaves the previous file intact. Reading: the zip checksums are verified first
(truncated or bit-flipped files are refused), then ``torch.load(weights_only=True)`` (a file that
pickles code is refused without running it), then the format version, kind and layout.

Test hook (never set it in real runs): ``MADQN_FAULT=checkpoint_write:N[:ACTION]`` hits the N-th
checkpoint file this process writes, after half of its temporary file is on disk. ACTION ``kill``
(default) sends SIGKILL to the process, ``enospc`` raises ``OSError(ENOSPC)`` (a full disk),
``stall`` sleeps 60 s before finishing the write (a window for signal tests).

:class:`CheckpointHook` writes a run's checkpoints (every ``save_freq`` agent steps and at the end).
"""

from __future__ import annotations

import csv
import errno
import io
import os
import signal
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from madqn.errors import CheckpointError
from madqn.training.guard import NumericsGuard
from madqn.training.learners import UPDATE_STAT_KEYS
from madqn.training.trainer import Hook, TrainerBase

FORMAT_VERSION = 2
TRAINER_KIND = "madqn-trainer"
REPLAY_KIND = "madqn-replay"
AGENTS_KIND = "madqn-agents"  # madqn export: online networks, config, observation specs (madqn.cli.export)
PLAY_KINDS = (TRAINER_KIND, AGENTS_KIND)  # files that can play (madqn eval, madqn video, load_agents)
LATEST = "latest.pt"
REPLAY = "replay.pt"

# ---- writing ------------------------------------------------------------------------------------

_checkpoint_writes = 0  # files written by atomic_save in this process (for the MADQN_FAULT test hook)


def _fault_action() -> str | None:
    """The MADQN_FAULT action for the checkpoint write that is starting, if it is the one to hit."""
    global _checkpoint_writes
    _checkpoint_writes += 1
    parts = os.environ.get("MADQN_FAULT", "").split(":")
    if len(parts) >= 2 and parts[0] == "checkpoint_write" and parts[1].isdigit() and int(parts[1]) == _checkpoint_writes:
        return parts[2] if len(parts) > 2 else "kill"
    return None


def _write_with_fault(f: Any, obj: Any, action: str) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getbuffer()
    f.write(data[: len(data) // 2])
    f.flush()
    os.fsync(f.fileno())
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if action == "stall":
        print("madqn: MADQN_FAULT: stalled in the middle of a checkpoint write", file=sys.stderr, flush=True)
        time.sleep(60)
        f.write(data[len(data) // 2:])
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
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


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to ``path`` via a fsynced temporary file and an atomic rename."""
    action = _fault_action()
    if action is None:
        _atomic_write(path, lambda f: torch.save(obj, f))
    else:
        _atomic_write(path, lambda f: _write_with_fault(f, obj, action))


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda f: f.write(text.encode()))


def remove_temporaries(directory: Path) -> None:
    """Delete temporary files left by a write that was killed (never a complete checkpoint)."""
    for tmp in Path(directory).glob(".*.tmp-*"):
        tmp.unlink(missing_ok=True)


# ---- loading ------------------------------------------------------------------------------------

def safe_load(path: Path, kind: str | tuple[str, ...] = TRAINER_KIND, map_location: Any = "cpu",
              mmap: bool = False) -> dict[str, Any]:
    """Load a madqn checkpoint file without unpickling code; ``CheckpointError`` with one clear line otherwise.

    ``kind``: the file kind expected, or a tuple of accepted kinds (``PLAY_KINDS``).

    ``mmap``: tensors stay backed by the file (the replay memory is copied into place without
    holding a second copy in RAM).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        raise CheckpointError(f"refusing to load {path}: not a complete madqn checkpoint "
                              "(truncated, or not a checkpoint file)") from None
    if damaged is not None:
        raise CheckpointError(f"refusing to load {path}: the file is corrupt (checksum mismatch in {damaged})")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # pickle.UnpicklingError (code or foreign objects), RuntimeError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"refusing to load {path}: it holds more than tensors and plain values, which madqn "
                              f"checkpoints never do (tampered or foreign file: {first[:160]})") from None
    if not isinstance(obj, dict) or "format_version" not in obj:
        raise CheckpointError(f"refusing to load {path}: not a madqn checkpoint")
    if obj["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {obj['format_version']!r} is not supported "
                              f"(this madqn reads format {FORMAT_VERSION})")
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if obj.get("kind") not in kinds:
        expected = " or ".join(repr(k) for k in kinds)
        raise CheckpointError(f"refusing to load {path}: it is a {obj.get('kind')!r} file, expected {expected}")
    _check_layout(obj, _LAYOUT[obj["kind"]], path)
    if obj["kind"] == TRAINER_KIND:  # the acting side of one backend, its config's first (that one's error)
        backend = obj["config"].get("backend")
        layouts = sorted(ACTING_LAYOUT.items(), key=lambda item: item[0] != backend)
        if not any(_has_layout(obj, layout) for _, layout in layouts):
            _check_layout(obj, layouts[0][1], path)
    return obj


_LAYOUT: dict[str, dict[str, type | tuple[type, ...]]] = {
    TRAINER_KIND: {"config": dict, "agents": list, "step": int, "episodes": int, "learn_from": int,
                   "wall_time": float, "groups": dict, "rng": dict},  # + the acting side's part: ACTING_LAYOUT
    REPLAY_KIND: {"step": int, "groups": dict},
    AGENTS_KIND: {"config": dict, "agents": list, "step": int, "groups": dict, "observation_specs": dict,
                  "action_starts": dict},
}


# a trainer checkpoint's acting side, one of these by the backend that wrote it: the in-process acting loop's
# state (env copies, slots), or what a Ray run's learner holds (the newest replay entry of each stream). Ray
# checkpoints written before this table also carry empty acting-loop lists: they load.
ACTING_LAYOUT: dict[str, dict[str, type]] = {
    "local": {"envs": list, "slots": list, "observations": list, "action_masks": list},
    "ray": {"held": list},
}
# what the acting side saves only where it has it: the opponent pool (config.pool_every > 0)
OPTIONAL_ACTING_KEYS = ("pool",)


def _has_layout(obj: dict[str, Any], layout: dict[str, Any]) -> bool:
    return all(isinstance(obj.get(key), want) and not isinstance(obj.get(key), bool) for key, want in layout.items())


def _check_layout(obj: dict[str, Any], layout: dict[str, Any], path: Path) -> None:
    for key, want in layout.items():
        if not _has_layout(obj, {key: want}):
            raise CheckpointError(f"refusing to load {path}: entry {key!r} is missing or malformed")


def online_weights(group: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The online network's weights of one entry of a loaded file's ``groups``: the learner's in a trainer
    checkpoint (``group["learner"]["online"]``), the exported ones in a ``madqn-agents`` file (``group["online"]``).
    What playing loads (``Agents.from_state``) and what ``madqn export`` writes."""
    return group["online"] if "online" in group else group["learner"]["online"]


def updates_of(state: dict[str, Any]) -> dict[str, int | None]:
    """Minibatch updates of each network of a loaded checkpoint or export (None where the file predates them)."""
    return {name: (int(g["updates"]) if g.get("updates") is not None else None) for name, g in state["groups"].items()}


def format_updates(updates: dict[str, int | None]) -> str:
    """``updates shared 545,000`` / ``updates first_0 372,500, second_0 372,500`` / ``updates not recorded``."""
    if all(n is None for n in updates.values()):
        return "updates not recorded"
    return "updates " + ", ".join(f"{name} {'?' if n is None else f'{n:,}'}" for name, n in updates.items())


def load_run_checkpoint(run_dir: Path) -> tuple[dict[str, Any], Path]:
    """The latest trainer checkpoint of a run directory, with its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"cannot resume: run directory {run_dir} does not exist")
    path = run_dir / "checkpoints" / LATEST
    if not path.is_file():
        raise CheckpointError(f"cannot resume: {run_dir} has no checkpoint ({path} is missing)")
    return safe_load(path), path


# ---- what a checkpoint holds --------------------------------------------------------------------

def _to_torch(x: Any) -> Any:
    """numpy arrays -> tensors, recursively (weights_only loading accepts tensors, not arrays)."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.array(x))  # a copy: frames handed out by envs may be read-only
    if isinstance(x, dict):
        return {k: _to_torch(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_torch(v) for v in x)
    return x


def _to_numpy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, dict):
        return {k: _to_numpy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_numpy(v) for v in x)
    return x


def trainer_state(trainer: Any) -> dict[str, Any]:
    """Everything needed to continue ``trainer`` (not the replay memory; see ``replay_state``): the
    learner set's and the acting side's ``state_dict``, the run's counters and torch generators."""
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    acting = trainer.acting.state_dict()
    return {
        "format_version": FORMAT_VERSION,
        "kind": TRAINER_KIND,
        "config": trainer.config.to_dict(),
        "agents": list(trainer.agents),
        # how each agent's raw observations become network inputs (madqn.load_agents needs it)
        "observation_specs": {a: spec.to_dict() for a, spec in trainer.observation_specs.items()},
        "action_starts": dict(trainer.action_starts),
        "step": int(trainer.step),
        "episodes": int(trainer.episodes),
        "wall_time": float(time.time() - trainer.start_time),
        **trainer.learners.state_dict(),  # learn_from, groups
        **_to_torch({k: v for k, v in acting.items() if k != "rng"}),  # envs, slots, observations, action_masks
        "rng": {"numpy": _to_torch(acting["rng"]), "torch": torch.get_rng_state(), "cuda": list(cuda_rng)},
    }


def replay_state(trainer: Any) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "kind": REPLAY_KIND, "step": int(trainer.step),
            "groups": {name: {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in memory.items()}
                       for name, memory in trainer.learners.replay_state_dict().items()}}


# ---- writing a run's checkpoints ------------------------------------------------------------------

class CheckpointHook(Hook):
    """Saves ``checkpoints/latest.pt`` (and ``replay.pt`` with ``save_replay``) every ``save_freq``
    agent steps and at the end of the run.

    Never saves weights the guard finds non-finite, nor the state of a run that ended by an
    exception (it may be mid-step). A failed write (full disk) leaves the previous checkpoint in
    place, records ``error`` and stops the run after the current step.
    """

    def __init__(self, run_dir: Path, guard: NumericsGuard | None = None):
        self.dir = Path(run_dir) / "checkpoints"
        self.guard = guard
        self.error: CheckpointError | None = None
        self.saved_step: int | None = None  # step of the newest complete checkpoint

    @property
    def path(self) -> Path:
        return self.dir / LATEST

    def on_start(self, trainer: TrainerBase) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_temporaries(self.dir)
        self.next_save = (trainer.step // trainer.config.save_freq + 1) * trainer.config.save_freq

    def on_step(self, trainer: TrainerBase) -> None:
        if trainer.step >= self.next_save:
            self.save(trainer)
            self.next_save = (trainer.step // trainer.config.save_freq + 1) * trainer.config.save_freq

    def on_end(self, trainer: TrainerBase) -> None:
        if trainer.failed or self.error is not None or trainer.step == self.saved_step:
            return
        self.save(trainer)

    def save(self, trainer: TrainerBase) -> None:
        if self.error is not None or (self.guard is not None and not self.guard.check(trainer)):
            return
        try:
            if trainer.config.save_replay:
                atomic_save(replay_state(trainer), self.dir / REPLAY)
            atomic_save(trainer_state(trainer), self.path)
        except OSError as e:  # the previous checkpoint files are untouched (atomic_save)
            self.error = CheckpointError(f"cannot write the checkpoint of step {trainer.step} to {self.dir}: "
                                         f"{e.strerror or e}")
            trainer.stop_requested = True
            return
        self.saved_step = trainer.step


# ---- restoring ----------------------------------------------------------------------------------

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


def _learner_state(state: dict[str, Any]) -> dict[str, Any]:
    """The learner set's part of a checkpoint. Files written before the running update statistics hold one
    row per unreported update (``stats``): they become the sums they add up to."""
    groups = {}
    for name, saved in state["groups"].items():
        if "update_stats" not in saved:
            rows = saved["stats"].reshape(-1, len(UPDATE_STAT_KEYS)).float()
            saved = {**saved, "update_stats": {"sums": rows.sum(0), "count": len(rows)}}
        groups[name] = saved
    return {"learn_from": state["learn_from"], "groups": groups}


def restore_trainer(trainer: Any, state: dict[str, Any], path: Path) -> bool:
    """Load networks, optimizers, counters and generators; the acting state when the envs allow it.

    Returns True when every env copy continues its episode exactly; False when some env cannot
    capture its state (or the actors of a Ray run): then every env copy starts a fresh episode and
    the interrupted episodes are simply not reported.
    """
    check_compatible(state, trainer, path)
    try:
        try:
            trainer.learners.load_state_dict(_learner_state(state))
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
        trainer.step = int(state["step"])
        trainer.episodes = int(state["episodes"])
        trainer.start_time = time.time() - float(state["wall_time"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available() and len(state["rng"]["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        return trainer.acting.load_state_dict(acting_state(state))
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"{path}: checkpoint content does not fit this run ({type(e).__name__}: "
                              f"{str(e).strip()[:200]})") from None


def acting_state(state: dict[str, Any]) -> dict[str, Any]:
    """The acting side's part of a checkpoint, as numpy arrays and plain values."""
    keys = [k for layout in ACTING_LAYOUT.values() for k in layout] + list(OPTIONAL_ACTING_KEYS)
    return {"rng": state["rng"]["numpy"], **_to_numpy({k: state[k] for k in keys if k in state})}


def close_interrupted_episodes(trainer: Any, state: dict[str, Any]) -> None:
    """After restoring the replay memory into fresh episodes: end each stream's interrupted episode
    (each agent's newest frame in the checkpoint becomes a truncated final frame)."""
    trainer.acting.close_interrupted_episodes(acting_state(state))


def restore_replay(trainer: Any, state: dict[str, Any], path: Path) -> None:
    missing = [g.name for g in trainer.groups if g.name not in state["groups"]]
    if missing:
        raise CheckpointError(f"{path}: replay file has no memory for {missing[0]}")
    try:
        trainer.learners.load_replay_state_dict(
            {name: {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in saved.items()}
             for name, saved in state["groups"].items()})
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from None


# ---- metrics files ------------------------------------------------------------------------------

def truncate_csv(path: Path, column: str, max_value: int) -> int:
    """Rewrite a metrics CSV keeping the header and the complete rows with ``column`` <= max_value; atomic.

    A resumed run appends from its checkpoint, so rows the interrupted run wrote after that
    checkpoint would otherwise be duplicated: train.csv is cut at the checkpoint's step (its rows
    are written before the checkpoint of the same step), episodes.csv at the checkpoint's episode
    count (an episode row carries the step at which its last step began, which can equal the
    checkpoint's step while the episode ended after it). Returns the number of rows dropped.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        rows = list(reader)
    if header is None or column not in header:
        return 0
    index = header.index(column)
    keep = []
    for row in rows:
        try:
            complete = len(row) == len(header) and int(row[index]) <= max_value
        except ValueError:
            complete = False
        if complete:
            keep.append(row)
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(keep)
    atomic_write_text(path, out.getvalue())
    return len(rows) - len(keep)
