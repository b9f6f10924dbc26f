"""Overlap mode: the background learner keeps DQN3.0's update count and target syncs, and fails loudly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madqn.config import make_config
from madqn.runner import Trainer

from test_train import SMOKE


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
        assert g.updates == 15 and len(g.stats) == 15
        assert syncs == [0, 0, 5, 15]
        assert all(np.isfinite(float(s["abs_delta"])) for s in g.stats)
        # the acting snapshot was refreshed after the last round
        for p, q in zip(trainer.policy.networks[0].parameters(), learner.online_network.parameters()):
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
