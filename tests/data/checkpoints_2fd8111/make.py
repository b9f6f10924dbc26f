"""How the files beside this script were made: checkpoints written by madqn at commit 2fd8111, before the
numpy generators were saved as packed words (they were ``bit_generator.state`` dicts) and while a Ray run's
checkpoint carried empty acting entries. tests/test_checkpoint.py loads them with today's madqn.

    git archive 2fd8111 madqn tests/tiny_catch.py | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/data/checkpoints_2fd8111/make.py tests/data/checkpoints_2fd8111
"""

import sys
from pathlib import Path

import torch

from madqn.config import Config
from madqn.training.checkpoint import atomic_save, replay_state, trainer_state
from madqn.training.distributed import DistributedTrainer
from madqn.training.trainer import Trainer

out = Path(sys.argv[1])
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the env is tiny_catch:make, as under pytest
common = dict(env="tiny_catch:make", replay_memory=400, learn_start=40, prog_freq=1000, save_freq=1000, eval_freq=0,
              valid_size=0, device="cpu", hist_len=2, mlp_hidden=[8], target_q=50, sharing="independent",
              final_eval_episodes=0, seed=3)
torch.manual_seed(0)
local = Trainer(Config(**common, steps=120))
local.run()
atomic_save(trainer_state(local), out / "local.pt")
atomic_save(replay_state(local), out / "local_replay.pt")
local.close()
ray = DistributedTrainer(Config(**common, steps=64, backend="ray", actors=1, rollout_len=30), pool="inline")
ray.run()
atomic_save(trainer_state(ray), out / "ray.pt")
ray.close()
