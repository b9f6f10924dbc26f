"""Small helpers shared by the tests (imported as ``helpers``: pytest puts tests/ on sys.path)."""

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def read_csv(path):
    """The rows of a CSV file as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_madqn(*args, cwd, timeout=600):
    """Run this checkout's ``madqn`` CLI in a subprocess (not whichever madqn is installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "madqn", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)
