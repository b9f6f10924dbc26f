"""The switchable extensions beyond DQN3.0, each against an independent computation written out here:
Double DQN targets and per-row discounts, the importance-weighted injected gradient, Adam, dueling
heads, n-step returns on a golden replay table, and the prioritized replay's sum-tree."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from madqn.config import Config
from madqn.core.learner import Learner, build_optimizer, q_targets
from madqn.core.networks import DQN3ConvNet, DuelingHead, MLPQNetwork, build_q_network
from madqn.core.prioritized import SumTree, annealed_beta, importance_weights
from madqn.core.replay import ReplayMemory
from madqn.training.trainer import Trainer

torch.set_num_threads(1)


# ---------------------------------------------------------------- Double DQN and per-row discounts

Q_ALL = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]])
ACTIONS = torch.tensor([2, 0, 1, 0])
REWARDS = torch.tensor([1.0, 0.0, -1.0, 0.5])
TERMINALS = torch.tensor([0.0, 0.0, 0.0, 1.0])
Q2_TARGET = torch.tensor([[10.0, 20.0, 30.0], [5.0, 1.0, 2.0], [3.0, 4.0, 8.0], [7.0, 7.0, 7.0]])
Q2_ONLINE = torch.tensor([[9.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 9.0, 2.0], [0.0, 0.0, 1.0]])
# row 1: action 1 illegal at s2; row 2: no legal action at s2
MASK = torch.tensor([[True, True, True], [True, False, True], [False, False, False], [True, True, True]])
DISCOUNTS = torch.tensor([0.5, 0.9, 0.99, 0.9])


def test_double_targets_with_masks_and_per_row_discounts_hand_computed():
    # online argmax over legal actions -> target value:
    # row 0: argmax(9, 1, 0) = 0 -> 10;  delta = 1 + 0.5*10 - Q[0,2]=3 = 3 -> clip 2
    # row 1: legal {0, 2}: argmax(0, 1) = 2 -> 2 (the illegal action 1 has the online max 3); delta = 0 + 0.9*2 - 0 = 1.8
    # row 2: no legal action -> 0;     delta = -1 + 0 - Q[2,1]=0.5 = -1.5
    # row 3: argmax = 2 -> 7, terminal; delta = 0.5 - Q[3,0]=1 = -0.5
    targets, delta, q2 = q_targets(Q_ALL, Q2_TARGET, ACTIONS, REWARDS, TERMINALS, discount=DISCOUNTS,
                                   clip_delta=2.0, next_action_mask=MASK, q2_online=Q2_ONLINE)
    torch.testing.assert_close(delta, torch.tensor([2.0, 1.8, -1.5, -0.5]))
    torch.testing.assert_close(q2, torch.tensor([10.0, 2.0, 0.0, 7.0]))
    torch.testing.assert_close(targets, torch.tensor([[0, 0, 2.0], [1.8, 0, 0], [0, -1.5, 0], [-0.5, 0, 0]]))


def test_plain_targets_with_masks_and_per_row_discounts_hand_computed():
    # max of the target net over legal actions: 30, 5 (not the illegal... 1), 0 (none legal), 7
    # row 0: 1 + 0.5*30 - 3 = 13 -> 2; row 1: 0 + 0.9*5 - 0 = 4.5 -> 2; row 2: -1.5; row 3: -0.5
    _, delta, q2 = q_targets(Q_ALL, Q2_TARGET, ACTIONS, REWARDS, TERMINALS, discount=DISCOUNTS,
                             clip_delta=2.0, next_action_mask=MASK)
    torch.testing.assert_close(delta, torch.tensor([2.0, 2.0, -1.5, -0.5]))
    torch.testing.assert_close(q2, torch.tensor([30.0, 5.0, 0.0, 7.0]))
    # without clipping: per-row discounts are used row by row
    _, delta, _ = q_targets(Q_ALL, Q2_TARGET, ACTIONS, REWARDS, TERMINALS, discount=DISCOUNTS,
                            clip_delta=0.0, next_action_mask=MASK)
    torch.testing.assert_close(delta, torch.tensor([13.0, 4.5, -1.5, -0.5]))


def test_double_without_mask_and_tensor_discount_equal_to_float():
    # no mask: row 2's online argmax is 1 -> target value 4; delta = -1 + 0.5*4 - 0.5 = 0.5
    _, delta, q2 = q_targets(Q_ALL, Q2_TARGET, ACTIONS, REWARDS, TERMINALS, discount=torch.full((4,), 0.5),
                             clip_delta=0.0, q2_online=Q2_ONLINE)
    torch.testing.assert_close(q2, torch.tensor([10.0, 1.0, 4.0, 7.0]))
    torch.testing.assert_close(delta, torch.tensor([3.0, 0.5, 0.5, -0.5]))
    _, delta_float, _ = q_targets(Q_ALL, Q2_TARGET, ACTIONS, REWARDS, TERMINALS, discount=0.5,
                                  clip_delta=0.0, q2_online=Q2_ONLINE)
    assert torch.equal(delta, delta_float)


def _mlp(seed):
    torch.manual_seed(seed)
    return MLPQNetwork(obs_dim=3, n_actions=3, hidden=(5,))


def _learner(net, **kw):
    args = dict(lr=0.0, lr_end=0.0, lr_endt=100, learn_start=0, discount=0.9, clip_delta=1.0, rescale_r=False,
                r_max=1.0, weight_cost=0.0, device="cpu")
    args.update(kw)
    return Learner(net, **args)


def _batch(seed=3, b=6):
    g = torch.Generator().manual_seed(seed)
    s, s2 = torch.randn(b, 1, 3, generator=g), torch.randn(b, 1, 3, generator=g)
    a = torch.randint(0, 3, (b,), generator=g)
    r = torch.tensor([2.0, -2.0, 0.05, 0.0, -0.1, 1.5])
    term = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    return s, a, r, s2, term


def test_learner_double_weights_and_discounts_gradient_independent():
    """.grad after one update (lr 0) == -sum_i w_i clip(delta_i) dQ(s_i, a_i)/dw, with Double DQN's
    y_i = r_i + g_i (1 - term_i) Q_target(s2_i, argmax_a Q_online(s2_i, a)), one sample at a time."""
    s, a, r, s2, term = _batch()
    online, target = _mlp(0), _mlp(1)
    disc = torch.tensor([0.9, 0.5, 0.81, 0.0, 0.729, 0.9])
    weights = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.75, 0.1])
    params = list(online.parameters())
    expected = [torch.zeros_like(p) for p in params]
    deltas = []
    for i in range(6):
        with torch.no_grad():
            a2 = int(online(s2[i : i + 1]).argmax())
            y = r[i] + disc[i] * (1 - term[i]) * target(s2[i : i + 1])[0, a2]
        q = online(s[i : i + 1])[0, a[i]]
        d = float((y - q.detach()).clamp(-1, 1))
        deltas.append(d)
        for acc, gr in zip(expected, torch.autograd.grad(q, params)):
            acc -= weights[i] * d * gr
    # the online and the target argmax differ somewhere, so Double DQN is really exercised
    with torch.no_grad():
        assert (online(s2).argmax(1) != target(s2).argmax(1)).any()
    learner = _learner(copy.deepcopy(online), double=True)
    learner.target_network.load_state_dict(target.state_dict())
    stats = learner.update(s, a, r, s2, term, discounts=disc, weights=weights)
    torch.testing.assert_close(stats["delta"], torch.tensor(deltas))
    for p, e in zip(learner.online_network.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def test_adam_is_torch_adam_with_adam_eps_one_step_hand_computed():
    assert type(build_optimizer([torch.nn.Parameter(torch.zeros(1))], "adam", lr=1e-3)) is torch.optim.Adam
    s, a, r, s2, term = _batch()
    learner = _learner(_mlp(0), optimizer="adam", adam_eps=1e-3, lr=0.01, lr_end=0.01)
    assert isinstance(learner.optimizer, torch.optim.Adam)
    assert learner.optimizer.param_groups[0]["eps"] == 1e-3
    before = [p.detach().clone() for p in learner.online_network.parameters()]
    learner.update(s, a, r, s2, term)
    # Adam's first step: m_hat = g, v_hat = g^2, so w -= lr * g / (|g| + eps)
    for p, w0 in zip(learner.online_network.parameters(), before):
        g = p.grad
        torch.testing.assert_close(p.detach(), w0 - 0.01 * g / (g.abs() + 1e-3))


# ---------------------------------------------------------------- dueling heads

def _count(net):
    return sum(p.numel() for p in net.parameters())


def test_adam_on_the_summed_gradient_with_eps_times_b_is_adam_on_the_mean_loss():
    """adam_eps's meaning: madqn's Adam descends on the SUMMED minibatch gradient, so adam_eps = eps * B is
    torch's Adam with eps on the minibatch-MEAN Huber loss (Rainbow's and most PyTorch code's convention),
    step for step; with adam_eps = eps (no factor B) the steps differ."""
    import torch.nn.functional as F

    eps, lr, b = 1.5e-4, 0.01, 6
    batches = [_batch(seed=20 + k) for k in range(3)]
    ref = _mlp(4)
    target = copy.deepcopy(ref)
    learner = _learner(copy.deepcopy(ref), optimizer="adam", adam_eps=eps * b, lr=lr, lr_end=lr)
    naive = _learner(copy.deepcopy(ref), optimizer="adam", adam_eps=eps, lr=lr, lr_end=lr)
    opt = torch.optim.Adam(ref.parameters(), lr=lr, eps=eps)
    for s, a, r, s2, term in batches:
        opt.zero_grad()
        with torch.no_grad():
            y = r + 0.9 * (1 - term) * target(s2).max(dim=1).values
        q_sa = ref(s).gather(1, a.view(-1, 1)).squeeze(1)
        F.huber_loss(q_sa, y, reduction="mean", delta=1.0).backward()
        opt.step()
        learner.update(s, a, r, s2, term)
        naive.update(s, a, r, s2, term)
    for p, e in zip(learner.online_network.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), e.detach(), rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(p.detach(), e.detach(), rtol=1e-4, atol=1e-5)
               for p, e in zip(naive.online_network.parameters(), ref.parameters()))
    assert Config().adam_eps == pytest.approx(1.5e-4 * 32)  # the default is Rainbow's eps for minibatches of 32


def test_dueling_conv_shape_and_parameter_count():
    # conv stack 8,224 + 32,832 + 36,928 = 77,984; two streams 2 * (3136*512 + 512) = 3,212,288;
    # V: 512 + 1 = 513; A: 512*6 + 6 = 3,078  ->  3,293,863 (DQN3.0's net: 1,687,206)
    net = DQN3ConvNet(n_actions=6, dueling=True)
    assert _count(net) == 77_984 + 3_212_288 + 513 + 3_078 == 3_293_863
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    assert net(frames).shape == (5, 6)
    shared = DQN3ConvNet(n_actions=6, n_agents=2, dueling=True)
    assert _count(shared) == 3_293_863 + 2 * 8 * 8 * 32  # the agent-indicator planes of conv1
    q = shared(frames, torch.tensor([0, 1, 0, 1, 1]))
    assert q.shape == (5, 6)


def test_dueling_q_is_v_plus_a_minus_mean_a_and_flat_for_equal_advantages():
    torch.manual_seed(0)
    net = DQN3ConvNet(n_actions=4, hist_len=2, frame_size=36, dueling=True)
    frames = torch.randint(0, 256, (3, 2, 36, 36), dtype=torch.uint8)
    with torch.no_grad():
        h = frames / 255.0
        for conv in (net.conv1, net.conv2, net.conv3):
            h = torch.relu(conv(h))
        h = h.flatten(1)
        v = net.head.value[2](torch.relu(net.head.value[0](h)))
        adv = net.head.advantage[2](torch.relu(net.head.advantage[0](h)))
        torch.testing.assert_close(net(frames), v + adv - adv.mean(1, keepdim=True))
        # equal advantages (identical output rows of the A stream): Q(s, a) = V(s) for every a
        last = net.head.advantage[2]
        last.weight.copy_(last.weight[0].expand_as(last.weight))
        last.bias.fill_(0.3)
        q = net(frames)
    torch.testing.assert_close(q, v.expand(-1, 4))


def test_dueling_mlp_splits_the_last_hidden_layer():
    # torso Linear(5, 64) = 384; streams 2 * (64*64 + 64) = 8,320; V 65; A 64*3 + 3 = 195
    net = MLPQNetwork(obs_dim=5, n_actions=3, hidden=(64, 64), dueling=True)
    assert _count(net) == 384 + 8_320 + 65 + 195
    assert isinstance(net.layers[-1], DuelingHead)
    one = build_q_network((5,), n_actions=3, hist_len=2, n_agents=2, hidden=(16,), dueling=True)
    assert _count(one) == 2 * ((10 + 2) * 16 + 16) + 17 + 16 * 3 + 3
    assert one(torch.randn(4, 2, 5), torch.tensor([0, 1, 1, 0])).shape == (4, 3)
    with pytest.raises(ValueError, match="hidden layer"):
        MLPQNetwork(obs_dim=5, n_actions=3, hidden=(), dueling=True)


# ---------------------------------------------------------------- n-step returns: golden replay table

G = 0.5
# stream 0: capacity 12, 16 entries written (logical 0..15), so entries 4..15 are stored (wrapped).
# logical entry: reward, flags.  10 = terminal final frame, 13 = truncated final frame, 15 = newest.
S0_REWARDS = {4: 1, 5: 2, 6: 4, 7: 8, 8: 16, 9: 32, 10: 0, 11: 1, 12: 2, 13: 0, 14: 4, 15: 8}
# stream 1: 5 entries, no wrap, no episode end; 4 is the newest
S1_REWARDS = {0: 3, 1: 5, 2: 7, 3: 9, 4: 0}

# (stream, logical j): (s frames, R, k, s2 frames, terminal, discount); frame value = 100*(stream+1) + j,
# 0 = zero padding.  Transitions 4 and 5 of stream 0 are not sampleable: their histories reach the
# overwritten entries 2, 3.  N = 3, hist_len = 3.
GOLDEN = {
    (0, 6): ([104, 105, 106], 4 + G * 8 + G**2 * 16, 3, [107, 108, 109], 0, G**3),
    (0, 7): ([105, 106, 107], 8 + G * 16 + G**2 * 32, 3, [108, 109, 110], 1, 0.0),  # 3 rewards, then terminal
    (0, 8): ([106, 107, 108], 16 + G * 32, 2, [108, 109, 110], 1, 0.0),  # stops at the terminal
    (0, 9): ([107, 108, 109], 32, 1, [108, 109, 110], 1, 0.0),
    (0, 11): ([0, 0, 111], 1 + G * 2, 2, [111, 112, 113], 0, G**2),  # truncation: bootstrap from 13
    (0, 12): ([0, 111, 112], 2, 1, [111, 112, 113], 0, G),
    (0, 14): ([0, 0, 114], 4, 1, [0, 114, 115], 0, G),  # stops at the write cursor (15 is the newest)
    (1, 0): ([0, 0, 200], 3 + G * 5 + G**2 * 7, 3, [201, 202, 203], 0, G**3),
    (1, 1): ([0, 200, 201], 5 + G * 7 + G**2 * 9, 3, [202, 203, 204], 0, G**3),
    (1, 2): ([200, 201, 202], 7 + G * 9, 2, [202, 203, 204], 0, G**2),
    (1, 3): ([201, 202, 203], 9, 1, [202, 203, 204], 0, G),
}


def _golden_memory(prioritized=False):
    mem = ReplayMemory(12, (1,), 3, n_streams=2, frame_dtype=np.int32, seed=0, n_step=3, discount=G,
                       prioritized=prioritized)
    for j in range(16):
        r = S0_REWARDS.get(j, 1)
        mem.add(0, [100 + j], j % 3, r, terminal=j == 10, episode_end=j in (10, 13))
    for j in range(5):
        mem.add(1, [200 + j], j % 3, S1_REWARDS[j], terminal=False, episode_end=False)
    return mem


@pytest.mark.parametrize("prioritized", [False, True])
def test_n_step_golden_table(prioritized):
    mem = _golden_memory(prioritized)
    batch = mem.sample(3000)
    seen = set()
    for i in range(len(batch.actions)):
        stream, pos = int(batch.streams[i]), int(batch.indices[i])
        logical = pos + 12 if stream == 0 and pos < 4 else pos  # stream 0 wrapped: positions 0..3 hold 12..15
        s, ret, k, s2, term, disc = GOLDEN[(stream, logical)]
        seen.add((stream, logical))
        assert batch.states[i, :, 0].tolist() == s
        assert batch.next_states[i, :, 0].tolist() == s2
        assert batch.rewards[i] == pytest.approx(ret)
        assert batch.terminals[i] == term
        assert batch.discounts[i] == pytest.approx(disc)
        assert batch.actions[i] == logical % 3
    assert seen == set(GOLDEN)


def test_n_step_one_is_dqn3_and_validation_draws_are_one_step():
    mem = _golden_memory()
    batch = mem.sample(500, dqn3=True)
    assert batch.discounts is None and batch.weights is None
    for i in range(len(batch.actions)):
        stream, pos = int(batch.streams[i]), int(batch.indices[i])
        logical = pos + 12 if stream == 0 and pos < 4 else pos
        rewards = S0_REWARDS if stream == 0 else S1_REWARDS
        assert batch.rewards[i] == rewards[logical]
        assert batch.next_states[i, -1, 0] == 100 * (stream + 1) + logical + 1


# ---------------------------------------------------------------- sum-tree and prioritized replay

def test_sum_tree_sampled_frequencies_match_priorities_chi_square():
    priorities = np.array([1.0, 0.0, 2.0, 3.0, 0.5, 0.0, 4.0, 1.5, 2.5, 0.25, 6.0])  # 11 leaves: padded to 16
    tree = SumTree(len(priorities))
    tree.set(np.arange(len(priorities)), priorities)
    assert tree.total == pytest.approx(priorities.sum())
    rng = np.random.default_rng(0)
    for stratified in (False, True):
        leaves = np.concatenate([tree.sample(64, rng, stratified=stratified) for _ in range(1000)])
        counts = np.bincount(leaves, minlength=tree.size)
        assert counts[len(priorities):].sum() == 0 and counts[1] == counts[5] == 0  # padding, zero priority
        positive = priorities > 0
        expected = len(leaves) * priorities[positive] / priorities.sum()
        stat = ((counts[: len(priorities)][positive] - expected) ** 2 / expected).sum()
        assert stat < chi2.ppf(0.999, positive.sum() - 1), (stratified, stat)
    # and a wrong distribution is detected: uniform counts fail the same test
    uniform = np.full(positive.sum(), len(leaves) / positive.sum())
    assert ((uniform - expected) ** 2 / expected).sum() > chi2.ppf(0.999, positive.sum() - 1)


def test_sum_tree_update_after_a_sample_changes_only_that_leafs_path():
    tree = SumTree(13)
    tree.set(np.arange(13), np.arange(1, 14, dtype=float))
    leaf = int(tree.sample(1, np.random.default_rng(1))[0])
    before = tree.nodes.copy()
    tree.set([leaf], [100.0])
    path, k = set(), tree.size + leaf
    while k >= 1:
        path.add(k)
        k //= 2
    changed = set(np.flatnonzero(tree.nodes != before).tolist())
    assert changed == path
    # each sum on the path equals the sum of the leaves below it, recomputed from scratch
    leaves = tree.nodes[tree.size:].astype(np.float64)
    for node in path:
        lo, hi = node, node + 1
        while lo < tree.size:
            lo, hi = 2 * lo, 2 * hi
        assert tree.nodes[node] == pytest.approx(leaves[lo - tree.size: hi - tree.size].sum())
    tree.set_one(leaf, 7.0)  # the scalar path gives the same tree as the vector one
    other = SumTree(13)
    other.set(np.arange(13), np.arange(1, 14, dtype=float))
    other.set([leaf], [7.0])
    assert np.array_equal(tree.nodes, other.nodes)


def _tree_built_from(leaves, size):
    """The sum-tree's definition written out: leaves then each level, float32, every node = left + right."""
    nodes = np.zeros(2 * size, dtype=np.float32)
    nodes[size:size + len(leaves)] = leaves
    width = size // 2
    while width >= 1:
        for k in range(width, 2 * width):
            nodes[k] = nodes[2 * k] + nodes[2 * k + 1]
        width //= 2
    return nodes


def test_sum_tree_deferred_sums_equal_a_tree_built_from_scratch_bit_for_bit():
    """Leaf writes of every batch size (the loop and the numpy propagation, sparse and whole levels), read
    back through ``total`` and ``nodes``: each time the same tree as one built from its leaves."""
    rng = np.random.default_rng(4)
    for n_leaves in (1, 2, 13, 1000, 4096):
        tree = SumTree(n_leaves)
        for count in (1, 2, 5, 16, 17, 40, 300, 5000, 1, 3):
            if rng.random() < 0.5:
                tree.set(rng.integers(0, n_leaves, count), rng.random(count).astype(np.float32) * 3)
            else:
                for leaf in rng.integers(0, n_leaves, count):
                    tree.set_one(int(leaf), float(rng.random()))
            reference = _tree_built_from(tree.get(np.arange(n_leaves)), tree.size)
            assert tree.total == reference[1] and np.array_equal(tree.nodes, reference), (n_leaves, count)


def test_importance_weights_and_beta_hand_computed():
    # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (P_i / min P)^-beta
    w = importance_weights(np.array([0.1, 0.2, 0.4, 0.1]), beta=0.5)
    np.testing.assert_allclose(w, [1.0, 2 ** -0.5, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(importance_weights(np.array([0.3, 0.6]), beta=1.0), [1.0, 0.5], rtol=1e-6)
    assert annealed_beta(0, beta_start=0.4, learn_start=100, anneal_steps=1000) == 0.4
    assert annealed_beta(100, beta_start=0.4, learn_start=100, anneal_steps=1000) == 0.4
    assert annealed_beta(600, beta_start=0.4, learn_start=100, anneal_steps=1000) == pytest.approx(0.7)
    assert annealed_beta(1100, beta_start=0.4, learn_start=100, anneal_steps=1000) == 1.0
    assert annealed_beta(5000, beta_start=0.4, learn_start=100, anneal_steps=1000) == 1.0


def _chain(mem, stream, n, start=0):
    for j in range(n):
        mem.add(stream, [start + j], 0, 0.0, terminal=False, episode_end=False)


def test_prioritized_memory_priorities_weights_and_max_priority_hand_computed():
    mem = ReplayMemory(8, (1,), 1, n_streams=2, frame_dtype=np.int32, seed=0, prioritized=True,
                       priority_alpha=0.5, priority_eps=0.01)
    _chain(mem, 0, 4)  # transitions 0, 1, 2 complete (max priority 1), 3 waits for its successor
    _chain(mem, 1, 2, 10)  # transition 0 of stream 1 complete
    leaf = lambda s, j: s * 8 + j  # noqa: E731
    np.testing.assert_array_equal(mem.tree.get([leaf(0, 0), leaf(0, 1), leaf(0, 2), leaf(0, 3), leaf(1, 0), leaf(1, 1)]),
                                  [1, 1, 1, 0, 1, 0])
    # |clipped delta| + eps, ** alpha: (0.49 + 0.01) ** 0.5, (1.99 + .01) ** .5, (0 + .01) ** .5, (0.24 + .01) ** .5
    mem.update_priorities(np.array([0, 0, 0, 1]), np.array([0, 1, 2, 0]), np.array([0.49, -1.99, 0.0, 0.24]))
    p = np.array([0.5 ** 0.5, 2 ** 0.5, 0.1, 0.5])
    np.testing.assert_allclose(mem.tree.get([leaf(0, 0), leaf(0, 1), leaf(0, 2), leaf(1, 0)]), p, rtol=1e-6)
    assert mem.max_priority == pytest.approx(2.0)
    mem.add(0, [4], 0, 0.0, False, False)  # completes transition 3: the largest priority so far, 2 ** 0.5
    assert mem.tree.get([leaf(0, 3)])[0] == pytest.approx(2 ** 0.5)
    p = np.append(p, 2 ** 0.5)  # leaves (0,0) (0,1) (0,2) (1,0) (0,3)
    batch = mem.sample(4000, beta=0.5)
    keys = batch.streams * 8 + batch.indices
    order = [leaf(0, 0), leaf(0, 1), leaf(0, 2), leaf(1, 0), leaf(0, 3)]
    freq = np.array([(keys == k).mean() for k in order])
    np.testing.assert_allclose(freq, p / p.sum(), atol=0.02)
    # importance weights: (P_i / min_batch P)^-0.5, min P = 0.1 / sum -> (p_i / 0.1) ** -0.5
    expected = {k: (pk / 0.1) ** -0.5 for k, pk in zip(order, p)}
    np.testing.assert_allclose(batch.weights, [expected[k] for k in keys], rtol=1e-5)


def test_prioritized_sampling_only_valid_transitions_and_state_round_trip():
    mem = ReplayMemory(20, (1,), 3, n_streams=2, frame_dtype=np.int32, seed=3, prioritized=True, n_step=2)
    rng = np.random.default_rng(0)
    for t in range(75):
        for s in range(2):
            end = rng.random() < 0.15
            mem.add(s, [t * 10 + s], int(rng.integers(3)), float(rng.integers(-1, 2)), end and rng.random() < 0.5, end)
        if t % 5 == 4:
            b = mem.sample(16)
            mem.update_priorities(b.streams, b.indices, rng.normal(size=16))
    valid = set(zip(*mem.valid_indices()))
    batch = mem.sample(2000)
    assert set(zip(batch.streams.tolist(), batch.indices.tolist())) <= valid
    state = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in mem.state_dict().items()}
    restored = ReplayMemory(20, (1,), 3, n_streams=2, frame_dtype=np.int32, seed=99, prioritized=True, n_step=2)
    restored.load_state_dict(state)
    assert np.array_equal(restored.tree.nodes, mem.tree.nodes) and restored.max_priority == mem.max_priority
    a, b = mem.sample(32, beta=0.7), restored.sample(32, beta=0.7)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.weights, b.weights)
    with pytest.raises(ValueError, match="prioritized"):
        ReplayMemory(20, (1,), 3, n_streams=2, frame_dtype=np.int32).load_state_dict(state)


def test_prioritized_tree_after_many_adds_equals_a_reference_recomputation():
    """Many adds on several streams, through episode ends and wrap-arounds, with draws and priority updates in
    between: every leaf holds what the rule says (0 without a successor, the largest priority so far when the
    successor arrives, (|delta| + eps) ** alpha after an update) and every inner node is the float32 sum of its
    children, exactly as a tree built from scratch from those leaves (so draws are as before, bit for bit)."""
    cap, n_streams, alpha, eps = 37, 3, 0.6, 1e-3
    mem = ReplayMemory(cap, (1,), 2, n_streams=n_streams, frame_dtype=np.int32, seed=5, prioritized=True,
                       priority_alpha=alpha, priority_eps=eps)
    rng = np.random.default_rng(11)
    reference = np.zeros(n_streams * cap)  # leaf values by the rule, kept here independently of the memory
    written, last_end, max_p = np.zeros(n_streams, dtype=int), np.ones(n_streams, dtype=bool), 1.0
    for t in range(2000):
        s = int(rng.integers(n_streams))
        pos = written[s] % cap
        end = bool(rng.random() < 0.1)
        mem.add(s, [t], 0, 0.0, end and rng.random() < 0.5, end)
        reference[s * cap + pos] = 0.0
        if written[s] > 0 and not last_end[s]:
            reference[s * cap + (pos - 1) % cap] = np.float32(max_p ** alpha)
        written[s] += 1
        last_end[s] = end
        if t % 23 == 22 and mem.can_sample():
            batch = mem.sample(8)
            rejected = (mem.tree.get(batch.streams * cap + batch.indices) == 0)  # none: a draw is positive
            assert not rejected.any()
            reference[mem.tree.get(np.arange(n_streams * cap)) == 0] = 0.0  # draws zero leaves they reject
            deltas = rng.normal(size=8)
            mem.update_priorities(batch.streams, batch.indices, deltas, entries=batch.entries)
            leaves = batch.streams * cap + batch.indices
            values = (np.minimum(np.abs(deltas), np.inf) + eps) ** alpha
            for leaf, value in zip(leaves, values):
                if reference[leaf] > 0:
                    reference[leaf] = np.float32(value)
            max_p = max(max_p, float((np.abs(deltas) + eps).max()))
        if t % 97 == 0 or t == 1999:
            leaves = mem.tree.get(np.arange(n_streams * cap))
            np.testing.assert_allclose(leaves, reference, rtol=1e-6, atol=0)
            assert np.array_equal(mem.tree.nodes, _tree_built_from(leaves, mem.tree.size)), t
    assert mem.max_priority == pytest.approx(max_p)


def test_prioritized_update_skips_a_transition_whose_slot_was_overwritten_after_the_draw():
    """Overlap mode: the acting thread may write while the learner thread computes a minibatch's deltas. A
    sampled transition whose slot was reused since belongs to someone else: its new priority is not touched."""
    mem = ReplayMemory(4, (1,), 1, frame_dtype=np.int32, seed=0, prioritized=True, priority_alpha=1.0,
                       priority_eps=0.01)
    _chain(mem, 0, 4)  # transitions 0, 1, 2 complete with priority 1
    batch = mem.sample(32)
    assert {0, 2} <= set(batch.indices.tolist())
    _chain(mem, 0, 2, 4)  # entries 4 and 5 overwrite slots 0 and 1: slot 0 now holds transition 4 (priority 1)
    assert mem.tree.get([0, 1, 2, 3]).tolist() == [1.0, 0.0, 1.0, 1.0]
    mem.update_priorities(batch.streams, batch.indices, np.full(32, 0.5), entries=batch.entries)
    np.testing.assert_allclose(mem.tree.get([0, 1, 2, 3]), [1.0, 0.0, 0.51, 1.0])  # only transition 2 updated


def test_prioritized_learner_round_leaves_transitions_written_during_the_update_alone():
    """The same through the learner set as overlap mode runs it: the replay lock is released between the draw
    and the priority update, and the acting thread writes then (here at exactly that moment, no thread)."""
    from madqn.envs.adapters import make_env
    from madqn.training.learners import LearnerSet

    config = Config(**{**TINY, "replay_memory": 40, "minibatch_size": 32, "hist_len": 1, "sharing": "shared"},
                    steps=1000, prioritized=True, priority_alpha=1.0)
    env = make_env(config.env, config)
    learners = LearnerSet(config, env, 1, False, [0], torch.device("cpu"))
    replay = learners.groups[0].replay
    cap = replay.capacity
    frame = np.zeros(env.observation_space("left").shape, np.uint8)
    for t in range(cap):  # stream 0 full, no episode end: transitions 0 .. cap-2 complete with priority 1
        replay.add(0, frame, 0, 0.0, False, False)

    class ActingWritesBetweenDrawAndUpdate:
        """The replay lock of overlap mode; on its first release (after the draw) the actor writes cap entries."""

        releases = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.releases += 1
            if self.releases == 1:
                for _ in range(cap):
                    replay.add(0, frame, 0, 0.0, False, False)

    before = replay.tree.get(np.arange(cap)).copy()
    learners.learn(step=500, replay_lock=ActingWritesBetweenDrawAndUpdate())
    assert learners.groups[0].updates == 1
    # every slot was rewritten after the draw: no leaf may carry the old transitions' priorities
    np.testing.assert_array_equal(replay.tree.get(np.arange(cap)), before)


def test_prioritized_memory_costs_at_most_16_bytes_per_transition():
    for capacity, streams in ((1000, 3), (1024, 2), (5000, 1)):
        plain = ReplayMemory(capacity, (84, 84), 4, n_streams=streams)
        prio = ReplayMemory(capacity, (84, 84), 4, n_streams=streams, prioritized=True)
        assert 0 < (prio.nbytes - plain.nbytes) / (capacity * streams) <= 16


# ---------------------------------------------------------------- every switch through the trainers

ALL_SWITCHES = dict(double=True, dueling=True, n_step=3, prioritized=True, optimizer="adam")
TINY = dict(env=f"{Path(__file__).resolve().parent / 'tiny_catch.py'}:make", replay_memory=500, learn_start=100,
            prog_freq=100, save_freq=1000, eval_freq=0, valid_size=0, device="cpu", rollout_len=32, sync_every=2,
            target_q=100, hist_len=2, mlp_hidden=[32], num_threads=1)


def _check_learners(trainer):
    for g in trainer.groups:
        assert g.updates > 0 and isinstance(g.learner.optimizer, torch.optim.Adam) and g.learner.double
        assert isinstance(g.learner.online_network.layers[-1], DuelingHead)
        assert g.replay.n_step == 3
        leaves = g.replay.tree.nodes[g.replay.tree.size:]
        assert len(np.unique(leaves[leaves > 0])) > 5  # priorities from TD errors, not only the initial max


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_every_switch_with_the_distributed_learner_and_its_actors(sharing):
    """The Ray backend's learner and actors (here in this process): dueling networks on both sides,
    weights published to the actors, prioritized n-step replay fed from their batches."""
    from madqn.training.distributed import DistributedTrainer

    trainer = DistributedTrainer(Config(**TINY, steps=400, actors=2, sharing=sharing, **ALL_SWITCHES), pool="inline")
    try:
        trainer.run()
        _check_learners(trainer)
        for actor in trainer.pool.actors:
            assert actor.weights_version > 0
            for network, g in zip(actor.networks, trainer.groups):
                assert network.state_dict().keys() == g.learner.online_network.state_dict().keys()
    finally:
        trainer.close()


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_every_switch_with_the_local_trainer(sharing):
    trainer = Trainer(Config(**TINY, steps=300, sharing=sharing, num_envs=2, vector_env="inline", **ALL_SWITCHES))
    try:
        trainer.run()
        _check_learners(trainer)
        assert trainer.groups[0].replay.n_streams == (2 if sharing == "independent" else 4)
    finally:
        trainer.close()


@pytest.mark.slow
def test_every_switch_on_ray(tmp_path):
    """A real Ray run (2 actor processes) with all five switches."""
    import madqn

    result = madqn.train(config=Config(**TINY, steps=600, actors=2, backend="ray", sharing="independent",
                                       **ALL_SWITCHES), run_dir=tmp_path / "run", handle_signals=False)
    assert result.steps >= 600 and all(n > 0 for n in result.updates.values())


@pytest.mark.parametrize("bad, message", [
    ({"n_step": 0}, "'n_step' must be >= 1"),
    ({"priority_alpha": 1.5}, "'priority_alpha' must be <= 1"),
    ({"prioritized": True, "priority_eps": 0.0}, "'priority_eps' must be > 0"),
    ({"dueling": True, "mlp_hidden": [], "network": "mlp"}, "'dueling' needs at least one hidden layer"),
    ({"optimizer": "sgd"}, "'optimizer' must be one of rmsprop, adam"),
])
def test_bad_extension_settings_name_the_key(bad, message):
    from madqn.config import make_config
    from madqn.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        make_config(None, bad)


def test_double_without_target_network_is_plain_dqn():
    s, a, r, s2, term = _batch()
    plain = _learner(_mlp(0), use_target=False).update(s, a, r, s2, term)
    double = _learner(_mlp(0), use_target=False, double=True).update(s, a, r, s2, term)
    assert torch.equal(plain["delta"], double["delta"]) and torch.equal(plain["q2_max"], double["q2_max"])


def test_rainbow_lite_preset_switches_everything_on():
    from madqn.config import make_config

    c = make_config(Path(__file__).resolve().parents[1] / "configs" / "rainbow_lite.toml")
    assert (c.double, c.dueling, c.n_step, c.prioritized, c.optimizer) == (True, True, 3, True, "adam")
    assert (c.lr, c.lr_end, c.adam_eps) == (6.25e-5, 6.25e-5, 4.8e-3)


def test_dueling_checkpoint_loads_for_play(tmp_path):
    """A run's dueling networks come back through madqn.load_agents (madqn eval, video, export use it)."""
    import madqn

    result = madqn.train(config=Config(**TINY, steps=150, sharing="shared", **ALL_SWITCHES), run_dir=tmp_path / "run",
                         handle_signals=False, final_eval_episodes=0)
    agents = madqn.load_agents(result.run_dir)
    network = next(iter(agents.networks.values()))
    assert isinstance(network.layers[-1], DuelingHead)
    checkpoint = madqn.training.checkpoint.safe_load(result.run_dir / "checkpoints" / "latest.pt")
    saved = checkpoint["groups"]["shared"]["learner"]
    for k, v in network.state_dict().items():
        assert torch.equal(v, saved["online"][k])
