"""Overlap mode: the background learner keeps DQN3.0's update count and target syncs, and fails loudly."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from madqn.evaluation.agents import Agents
from madqn.config import Config, make_config
from madqn.training.trainer import Hook, Trainer

from test_train import SMOKE

ROOT = Path(__file__).resolve().parents[1]


def test_overlap_keeps_the_update_ratio_and_target_syncs():
    cfg = make_config(SMOKE, {"steps": 160, "learn_start": 100, "target_q": 40, "sharing": "shared",
                              "overlap": True, "seed": 2})
    with Trainer(cfg) as trainer:
        syncs = []
        learner = trainer.groups[0].learner
        original = learner.sync_target
        learner.sync_target = lambda: (syncs.append(trainer.groups[0].updates), original())[1]
        trainer.run()
        g = trainer.groups[0]
        # (160 - 100) / 4 = 15 rounds, all done when run() returns; a sync after the rounds of steps
        # 40, 80, 120 and 160, i.e. after 0, 0, 5 and 15 updates, the serial loop's sequence
        assert g.updates == 15 and g.update_stats.count == 15
        assert syncs == [0, 0, 5, 15]
        assert all(g.update_stats.finite_flags())
        # the acting snapshot was refreshed after the last round
        for p, q in zip(trainer.acting.policy.networks[0].parameters(), learner.online_network.parameters()):
            assert torch.equal(p, q)


def test_background_learner_error_reaches_the_actor():
    cfg = make_config(SMOKE, {"steps": 200, "learn_start": 100, "sharing": "shared", "overlap": True})
    with Trainer(cfg) as trainer:
        def broken(*args, **kwargs):
            raise FloatingPointError("nan in the update")

        trainer.groups[0].learner.update = broken
        with pytest.raises(RuntimeError, match="background learner failed.*nan in the update"):
            trainer.run()
        assert trainer.step < 200


class PlaysAVideo(Hook):
    """At step ``at`` takes the networks a training video plays (``Agents.from_trainer``, as ``VideoHook``
    does), and notes whether a learning round is still queued or running then (the learner thread would be
    changing the weights while the video plays); copies the weights at the start and at the end of the video."""

    def __init__(self, at: int):
        self.at = at
        self.start = self.end = None
        self.rounds_in_flight = None

    def on_step(self, trainer):
        if trainer.step == self.at:
            agents = Agents.from_trainer(trainer, seed=0)
            network = agents.networks[trainer.agents[0]]
            self.start = [p.detach().clone() for p in network.parameters()]
            self.rounds_in_flight = trainer.background._requests.unfinished_tasks
            self.end = [p.detach().clone() for p in network.parameters()]


def test_overlap_video_plays_one_set_of_weights():
    """B5: a video recorded in overlap mode between two of the hooks' own settling points (prog_freq,
    save_freq, eval_freq) plays settled weights, not weights the learner thread is changing."""
    cfg = Config(env=f"{ROOT / 'tests' / 'tiny_catch.py'}:make", steps=64, learn_start=50, update_freq=4,
                 n_replay=100, minibatch_size=32, target_q=0, prog_freq=1000, save_freq=1000, eval_freq=0,
                 valid_size=0, hist_len=2, mlp_hidden=[64], device="cpu", num_threads=1, overlap=True,
                 sharing="shared", seed=1)
    video = PlaysAVideo(at=64)  # a round of 100 updates was queued in this step
    with Trainer(cfg, hooks=[video]) as trainer:
        trainer.run()
    assert video.start is not None
    assert video.rounds_in_flight == 0  # settled: nothing can change the weights until the next step
    for a, b in zip(video.start, video.end):
        assert torch.equal(a, b)


class OwnedLock:
    """A lock that knows which thread holds it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.owner = None

    def __enter__(self):
        self._lock.acquire()
        self.owner = threading.get_ident()

    def __exit__(self, *exc):
        self.owner = None
        self._lock.release()


def test_overlap_emulates_without_holding_the_replay_lock():
    """E5: the acting thread holds the replay lock only around its replay writes, never while the env steps,
    so the learner thread can sample while the emulator runs."""
    cfg = Config(env=f"{ROOT / 'tests' / 'tiny_catch.py'}:make", steps=300, learn_start=100, update_freq=4,
                 minibatch_size=32, target_q=0, prog_freq=1000, save_freq=1000, eval_freq=0, valid_size=0,
                 hist_len=2, mlp_hidden=[16], device="cpu", num_threads=1, overlap=True, sharing="shared", seed=1)
    with Trainer(cfg) as trainer:
        probe = OwnedLock()
        trainer.background.replay_lock = trainer._replay_lock = probe
        env = trainer.acting.envs[0]
        held_while_stepping = []
        step = env.step
        env.step = lambda actions: (held_while_stepping.append(probe.owner == threading.get_ident()), step(actions))[1]
        trainer.run()
        assert trainer.groups[0].updates == 50
    assert len(held_while_stepping) >= 300 and not any(held_while_stepping)
