"""Small helpers shared by the tests (imported as ``helpers``: pytest puts tests/ on sys.path)."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import torch

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


def random_batch(seed=0, batch=32):
    """A fixed replay batch for pong-sized networks (6 actions, hist_len 4, 2 agent ids): uint8 states and
    next states that overlap by 3 frames as in the replay memory, rewards in {-1, 0, 1}, 20% terminals."""
    g = torch.Generator().manual_seed(seed)
    whole = torch.randint(0, 256, (batch, 5, 84, 84), dtype=torch.uint8, generator=g)
    actions = torch.randint(0, 6, (batch,), generator=g)
    rewards = torch.randint(-1, 2, (batch,), generator=g).float()
    terminals = (torch.rand(batch, generator=g) < 0.2).float()
    agent_ids = torch.randint(0, 2, (batch,), generator=g)
    return whole[:, :4], actions, rewards, whole[:, 1:], terminals, agent_ids
