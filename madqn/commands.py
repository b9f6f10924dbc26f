"""Commands that madqn prints for the user to run next (resume, plot, video, TensorBoard).

Each must run as printed in the shell madqn was started from. ``madqn`` is often not on PATH there
(``make train`` runs ``.venv/bin/madqn`` without activating the venv), so the printed program is
``madqn`` only when that name resolves to the script running now; otherwise it is the script's full
path, or ``<python> -m madqn`` when madqn runs as a module or a library.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def madqn_program(argv0: str | None = None, path: str | None = None) -> str:
    """The shell words that run this madqn: ``madqn``, ``/abs/.venv/bin/madqn`` or ``/abs/python -m madqn``.

    ``argv0`` (default ``sys.argv[0]``) and ``path`` (default ``$PATH``) are parameters for testing.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    on_path = shutil.which("madqn", path=path)
    if argv0 and Path(argv0).name == "madqn" and Path(argv0).is_file():  # the console script
        if on_path and _same_file(on_path, argv0):
            return "madqn"
        return shlex.quote(str(Path(argv0).absolute()))
    python = Path(sys.executable)
    if on_path and Path(on_path).parent == python.parent:  # library use; madqn of this Python is on PATH
        return "madqn"
    return f"{shlex.quote(str(python))} -m madqn"


def madqn_command(*args: str | os.PathLike) -> str:
    """A madqn command line that runs as printed: ``madqn_command("plot", run_dir)``."""
    return " ".join([madqn_program(), *(shlex.quote(str(a)) for a in args)])


def resume_command(run_dir: str | os.PathLike) -> str:
    return madqn_command("train", "--resume", run_dir)


def tensorboard_command(logdir: str | os.PathLike, path: str | None = None) -> str:
    """``tensorboard --logdir DIR`` with the program as it runs here (the venv's script, or ``python -m``)."""
    logdir = shlex.quote(str(logdir))
    if shutil.which("tensorboard", path=path):
        return f"tensorboard --logdir {logdir}"
    beside = Path(sys.executable).parent / "tensorboard"
    if beside.is_file():
        return f"{shlex.quote(str(beside.absolute()))} --logdir {logdir}"
    return f"{shlex.quote(sys.executable)} -m tensorboard.main --logdir {logdir}"
