import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Processes the tests start indirectly (env worker processes, Ray workers) import this checkout too,
# not whichever madqn is installed.
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one pytest-xdist worker per core: one torch thread each
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def madqn_cli():
    """Build a command line that runs this checkout's ``madqn`` in a subprocess: ``cmd, env = madqn_cli(args...)``."""

    def build(*args: str):
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        return [sys.executable, "-m", "madqn", *map(str, args)], env

    return build
