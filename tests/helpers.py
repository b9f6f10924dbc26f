"""Small helpers shared by the tests (imported as ``helpers``: pytest puts tests/ on sys.path)."""

import copy
import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from madqn.config import make_config
from madqn.core.learner import Learner
from madqn.envs.adapters import make_env
from madqn.training.distributed import DistributedTrainer
from madqn.training.trainer import Hook

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"


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


def learner_update(net, precision, batch, device="cpu", steps=1, lr=2.5e-4):
    """``steps`` DQN3RMSprop updates of a copy of ``net`` on the same batch (a second step exercises the
    RMSProp state). Returns the learner, the last update's stats and the total weight change, both on the CPU."""
    learner = Learner(copy.deepcopy(net), lr=lr, lr_end=lr, lr_endt=1, learn_start=0, discount=0.99,
                      clip_delta=1.0, rescale_r=True, r_max=1.0, weight_cost=0.0, device=device, precision=precision)
    before = [p.detach().cpu().clone() for p in learner.online_network.parameters()]
    states, actions, rewards, next_states, terminals, ids = (t.to(device) for t in batch)
    for _ in range(steps):
        stats = learner.update(states, actions, rewards, next_states, terminals, agent_ids=ids)
    change = torch.cat([(p.detach().cpu() - b).flatten()
                        for p, b in zip(learner.online_network.parameters(), before)])
    return learner, {k: v.detach().cpu() for k, v in stats.items()}, change


def switches():
    """The process-global TF32 switches the CUDA learner sets around an update."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    return matmul.fp32_precision, conv.fp32_precision


def switches_during_update(device, precision, batch_size=4):
    """(switches seen by the online network's forwards inside ``Learner.update``, switches after it)."""
    torch.manual_seed(0)
    from madqn.core.networks import DQN3ConvNet

    net = DQN3ConvNet(6, 4, n_agents=2)
    seen = []
    net.register_forward_hook(lambda *_: seen.append(switches()))
    learner_update(net, precision, random_batch(0, batch=batch_size), device=device)
    return set(seen), switches()


def play_side_by_side(a, b, steps=60, epsilon=0.05, atol=0.0):
    """Both agent sets act on the same real pong_v3 observations (a's actions step the env); returns how
    many (step, agent) decisions were compared. Actions must be equal, and Q-values bitwise equal
    (``atol`` 0) or within ``atol``."""
    env = make_env("pong_v3", make_config(SMOKE), seed=5, convert=False)
    observations, infos = env.reset()
    a.reset()
    b.reset()
    compared = 0
    for _ in range(steps):
        actions = a.act(observations, infos, epsilon)
        assert b.act(observations, infos, epsilon) == actions
        for agent in observations:
            qa = a._q_values(a.networks[agent], [agent])
            qb = b._q_values(b.networks[agent], [agent])
            if atol == 0.0:
                assert np.array_equal(qa, qb)
            else:
                np.testing.assert_allclose(qb, qa, rtol=0, atol=atol)
            compared += 1
        observations, _, _, _, infos = env.step(actions)
        if not env.agents:
            break
    env.close()
    return compared


class CountingTrainer(DistributedTrainer):
    """Records what it received, to check that nothing is counted twice."""

    received_steps = 0
    received_entries = 0

    def _ingest(self, batch):
        self.received_steps += batch.steps
        self.received_entries += len(batch.entries)
        super()._ingest(batch)


class KillActorOnce(Hook):
    """Kills actor 0's process (SIGKILL) once the learner has passed ``at`` agent steps."""

    def __init__(self, at: int):
        self.at = at
        self.killed_pid = None

    def on_step(self, trainer):
        if self.killed_pid is None and trainer.step >= self.at:
            self.killed_pid = trainer.pool.pids()[0]
            os.kill(self.killed_pid, signal.SIGKILL)
            self.killed(trainer)

    def killed(self, trainer) -> None:
        """Right after the kill (a pool may wait here for the actor's restart)."""
