"""madqn.core.policy: batched acting over stacked independent networks equals per-agent forwards."""

from __future__ import annotations

import numpy as np
import torch

from madqn.core.actor import epsilon_greedy
from madqn.config import make_config
from madqn.core.learner import DQN3RMSprop
from madqn.core.networks import DQN3ConvNet, MLPQNetwork
from madqn.core.policy import ActingNetworks, StackedNetworks
from madqn.training.trainer import Trainer

from test_train import SMOKE


def _frames(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 4, 84, 84), dtype=np.uint8)


def _per_agent_q(networks, states, groups):
    with torch.no_grad():
        return np.stack([networks[g](torch.from_numpy(states[k:k + 1]))[0].numpy() for k, g in enumerate(groups)])


def test_stacked_q_values_equal_per_agent_forwards_and_follow_updates():
    torch.manual_seed(0)
    nets = [DQN3ConvNet(6), DQN3ConvNet(6), DQN3ConvNet(6)]
    acting = ActingNetworks(nets, torch.device("cpu"))
    assert acting.stacked is not None and acting.stacked.is_bound()
    states = _frames(7, 1)
    groups = np.array([2, 0, 0, 1, 2, 0, 2])  # uneven groups: padded inside the vmapped call
    ids = np.zeros(7, np.int64)
    q = acting.q_values(states, groups, ids)
    ref = _per_agent_q(nets, states, groups)
    np.testing.assert_allclose(q, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(q.argmax(1), ref.argmax(1))
    # an optimizer step on one network and a load_state_dict on another write through the views
    opt = DQN3RMSprop(nets[0].parameters(), lr=0.01)
    nets[0](torch.from_numpy(states[:2])).sum().backward()
    opt.step()
    nets[1].load_state_dict(DQN3ConvNet(6).state_dict())
    q2 = acting.q_values(states, groups, ids)
    ref2 = _per_agent_q(nets, states, groups)
    np.testing.assert_allclose(q2, ref2, rtol=1e-5, atol=1e-6)
    assert not np.allclose(q2[groups == 0], q[groups == 0]) and not np.allclose(q2[groups == 1], q[groups == 1])
    np.testing.assert_allclose(q2[groups == 2], q[groups == 2], rtol=1e-6)  # untouched network
    # rows of a single group take that network alone
    np.testing.assert_allclose(acting.q_values(states[:3], [1, 1, 1], ids[:3]),
                               _per_agent_q(nets, states[:3], [1, 1, 1]), rtol=1e-5, atol=1e-6)


def test_batched_actions_equal_per_agent_actions():
    """Same rng, same epsilon: epsilon_greedy over the batched Q-values picks the per-agent actions."""
    torch.manual_seed(1)
    nets = [DQN3ConvNet(6), DQN3ConvNet(6)]
    acting = ActingNetworks(nets, torch.device("cpu"))
    states = _frames(16, 2)
    groups = np.tile([0, 1], 8)
    for epsilon in (0.0, 0.3):
        batched = epsilon_greedy(lambda sel: acting.q_values(states[sel], groups[sel], groups[sel]),
                                 16, epsilon, np.random.default_rng(5), 6)
        single = epsilon_greedy(lambda sel: _per_agent_q(nets, states[sel], groups[sel]),
                                16, epsilon, np.random.default_rng(5), 6)
        assert np.array_equal(batched, single)


def test_snapshot_copy_changes_only_on_refresh():
    torch.manual_seed(2)
    nets = [MLPQNetwork(5, 3, hist_len=2), MLPQNetwork(5, 3, hist_len=2)]
    acting = ActingNetworks(nets, torch.device("cpu"), snapshot=True)
    assert not acting.stacked.is_bound()
    states = np.random.default_rng(0).normal(size=(4, 2, 5)).astype(np.float32)
    groups = np.array([0, 1, 1, 0])
    before = acting.q_values(states, groups, groups)
    with torch.no_grad():
        for p in nets[1].parameters():
            p.add_(0.5)
    np.testing.assert_array_equal(acting.q_values(states, groups, groups), before)
    acting.refresh()
    with torch.no_grad():
        ref = np.stack([nets[g](torch.from_numpy(states[k:k + 1]))[0].numpy() for k, g in enumerate(groups)])
    np.testing.assert_allclose(acting.q_values(states, groups, groups), ref, rtol=1e-5, atol=1e-6)


def test_stacked_rebinds_parameters_replaced_from_outside():
    nets = [DQN3ConvNet(4), DQN3ConvNet(4)]
    stacked = StackedNetworks(nets)
    nets[0].fc.weight.data = nets[0].fc.weight.data.clone() + 1.0  # e.g. a .to() that re-allocates
    assert not stacked.is_bound()
    stacked.rebind()
    assert stacked.is_bound() and torch.equal(stacked.params["fc.weight"][0], nets[0].fc.weight)


def test_trainer_independent_acting_uses_one_stacked_forward():
    cfg = make_config(SMOKE, {"sharing": "independent", "num_envs": 2, "vector_env": "inline", "seed": 4})
    with Trainer(cfg) as trainer:
        assert trainer.acting.policy.stacked is not None and trainer.acting.policy.stacked.is_bound()
        rng = np.random.default_rng(3)
        for slot in trainer.acting.slots.values():
            slot.history.frames[:] = rng.integers(0, 256, size=slot.history.frames.shape, dtype=np.uint8)
        slots = list(trainer.acting.slots.values())
        calls = []
        original = trainer.acting.policy._stacked_q
        trainer.acting.policy._stacked_q = lambda x, g: calls.append(len(g)) or original(x, g)
        actions = trainer.acting.act(slots, epsilon=0.0)
        assert calls == [4]  # all 4 slots (2 agents x 2 copies) in one vmapped forward
        with torch.no_grad():
            expected = [int(trainer.learners.group_of[s.agent].learner.online_network(
                torch.from_numpy(s.history.state()[None]))[0].argmax()) for s in slots]
        assert actions.tolist() == expected


def test_independent_agents_with_different_observation_shapes_act_greedily_together():
    """Equal action counts, different observation shapes: the greedy rows of the two agents cannot be
    stacked into one array, so each network is evaluated on its own rows (was a ValueError from np.stack)."""
    from tiny_catch import make_heterogeneous

    cfg = make_config(None, {"sharing": "independent", "steps": 300, "hist_len": 2, "mlp_hidden": [16],
                             "replay_memory": 1_000, "learn_start": 100, "ep_endt": 100, "ep_end": 0.0,
                             "update_freq": 4, "target_q": 50, "prog_freq": 1_000, "save_freq": 10_000,
                             "valid_size": 0, "device": "cpu", "seed": 2})
    with Trainer(cfg, make_heterogeneous) as trainer:
        assert [trainer.acting.slots[(0, a)].history.state().shape for a in ("left", "right")] == [(2, 25), (2, 26)]
        trainer.run()  # from step 200 on epsilon is 0: both agents act greedily in every step
        assert trainer.step == 300 and all(g.updates > 0 for g in trainer.groups)
        slots = [trainer.acting.slots[(0, a)] for a in ("left", "right")]
        actions = trainer.acting.act(slots, epsilon=0.0)
        with torch.no_grad():
            expected = [int(trainer.learners.group_of[s.agent].learner.online_network(
                torch.from_numpy(s.history.state()[None]))[0].argmax()) for s in slots]
        assert actions.tolist() == expected
