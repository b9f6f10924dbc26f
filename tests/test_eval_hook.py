"""Periodic evaluation during training and DQN3.0's validation statistics."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from madqn.config import make_config
from madqn.eval_hook import draw_validation_set, validation_statistics
from madqn.runner import Trainer

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.toml"


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_validation_statistics_match_a_per_sample_computation():
    """V = mean max_a Q_target(s2, a), TD error = mean |clip(r + gamma (1 - term) V(s2) - Q(s, a))|, one sample at a time."""
    cfg = make_config(SMOKE, {"steps": 200, "sharing": "shared", "seed": 5, "num_threads": 1})
    with Trainer(cfg) as trainer:
        trainer.run()
        g = trainer.groups[0]
        g.learner.sync_target()
        with torch.no_grad():  # make online and target differ, so that using the wrong one shows
            for p in g.learner.online_network.parameters():
                p.add_(0.01 * torch.randn_like(p))
        sampler_state = g.replay.rng.bit_generator.state
        valid = draw_validation_set(g, 40, np.random.default_rng(0), trainer.device)
        assert g.replay.rng.bit_generator.state == sampler_state  # the training sampler is untouched
        v, td = validation_statistics(g.learner, valid, chunk=16)
        q2s, deltas = [], []
        with torch.no_grad():
            for i in range(len(valid)):
                ids = valid.agent_ids[i:i + 1]
                q = g.learner.online_network(valid.states[i:i + 1], ids)[0, valid.actions[i]].item()
                q2 = g.learner.target_network(valid.next_states[i:i + 1], ids).max().item()
                y = valid.rewards[i].item() + cfg.discount * (1 - valid.terminals[i].item()) * q2
                q2s.append(q2)
                deltas.append(abs(min(max(y - q, -cfg.clip_delta), cfg.clip_delta)))
        assert v == pytest.approx(np.mean(q2s), rel=1e-5)
        assert td == pytest.approx(np.mean(deltas), rel=1e-5)
        # the same generator seed draws the same held-out set
        again = draw_validation_set(g, 40, np.random.default_rng(0), trainer.device)
        assert torch.equal(again.states, valid.states) and torch.equal(again.actions, valid.actions)
