"""DQN3.0 Q update: hand-computed targets, the centred RMSProp step, gradient injection, Learner."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from madqn.core.learner import DQN3RMSprop, Learner, lr_at, q_targets
from madqn.core.networks import DQN3ConvNet, MLPQNetwork

torch.set_num_threads(1)


# ---------------------------------------------------------------- q_targets (getQUpdate)

Q_ALL = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0], [2.0, 0.0, 0.25], [0.0, 0.0, 0.5]])
Q2_ALL = torch.tensor([[0.0, 4.0, 1.0], [3.0, 2.0, 10.0], [1.0, 1.5, -2.0], [5.0, 6.0, 0.0]])
ACTIONS = torch.tensor([1, 0, 2, 0])
REWARDS = torch.tensor([0.5, -1.0, 0.0, 1.0])
TERMINALS = torch.tensor([0.0, 1.0, 0.0, 0.0])


def _targets_from(deltas):
    # targets[i, a_i] = delta_i, zero elsewhere; ACTIONS = [1, 0, 2, 0]
    d0, d1, d2, d3 = deltas
    return torch.tensor([[0.0, d0, 0.0], [d1, 0.0, 0.0], [0.0, 0.0, d2], [d3, 0.0, 0.0]])


def test_q_targets_hand_computed():
    # discount 0.5, clip 1:
    # row 0: q2_max 4,  q2 = 0.5*4 = 2,  delta = 0.5 + 2 - Q[0,1]=2   = 0.5
    # row 1: terminal,  q2 = 0,          delta = -1 + 0 - Q[1,0]=0.5  = -1.5 -> -1
    # row 2: q2_max 1.5, q2 = 0.75,      delta = 0 + 0.75 - Q[2,2]=.25 = 0.5
    # row 3: q2_max 6,  q2 = 3,          delta = 1 + 3 - Q[3,0]=0     = 4 -> 1
    targets, delta, q2_max = q_targets(Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=1.0)
    torch.testing.assert_close(delta, torch.tensor([0.5, -1.0, 0.5, 1.0]))
    torch.testing.assert_close(q2_max, torch.tensor([4.0, 10.0, 1.5, 6.0]))
    torch.testing.assert_close(targets, _targets_from([0.5, -1.0, 0.5, 1.0]))


def test_q_targets_without_clipping_and_bool_terminals():
    targets, delta, _ = q_targets(
        Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS.bool(), discount=0.5, clip_delta=0.0
    )
    torch.testing.assert_close(delta, torch.tensor([0.5, -1.5, 0.5, 4.0]))
    torch.testing.assert_close(targets, _targets_from([0.5, -1.5, 0.5, 4.0]))


def test_q_targets_rescale_r():
    # rewards / r_max=2 = [0.25, -0.5, 0, 0.5]
    # row 0: 0.25 + 2 - 2 = 0.25; row 1: -0.5 - 0.5 = -1.0; row 2: 0 + 0.75 - 0.25 = 0.5; row 3: 0.5 + 3 - 0 = 3.5
    _, delta, _ = q_targets(
        Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=10.0, r_max=2.0, rescale_r=True
    )
    torch.testing.assert_close(delta, torch.tensor([0.25, -1.0, 0.5, 3.5]))
    _, delta, _ = q_targets(
        Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=1.0, r_max=2.0, rescale_r=True
    )
    torch.testing.assert_close(delta, torch.tensor([0.25, -1.0, 0.5, 1.0]))
    # r_max is ignored without rescale_r
    _, delta, _ = q_targets(Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=10.0, r_max=2.0)
    torch.testing.assert_close(delta, torch.tensor([0.5, -1.5, 0.5, 4.0]))


def test_q_targets_masked_max_over_legal_next_actions():
    mask = torch.tensor([[True, False, True], [True, True, True], [False, False, False], [True, True, False]])
    # row 0: the illegal 4.0 is ignored, q2_max = 1, delta = 0.5 + 0.5 - 2 = -1.0
    # row 1: q2_max 10 (terminal, unused), delta -1.5 -> -1
    # row 2: no legal action -> q2_max 0, delta = 0 + 0 - 0.25 = -0.25
    # row 3: legal max 6 (same as unmasked), delta 4 -> 1
    targets, delta, q2_max = q_targets(
        Q_ALL, Q2_ALL, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=1.0, next_action_mask=mask
    )
    torch.testing.assert_close(q2_max, torch.tensor([1.0, 10.0, 0.0, 6.0]))
    torch.testing.assert_close(delta, torch.tensor([-1.0, -1.0, -0.25, 1.0]))
    torch.testing.assert_close(targets, _targets_from([-1.0, -1.0, -0.25, 1.0]))


def test_q_targets_stays_outside_autodiff():
    q_all = Q_ALL.clone().requires_grad_(True)
    q2_all = Q2_ALL.clone().requires_grad_(True)
    outs = q_targets(q_all, q2_all, ACTIONS, REWARDS, TERMINALS, discount=0.5, clip_delta=1.0)
    assert all(not t.requires_grad for t in outs)


# ---------------------------------------------------------------- DQN3RMSprop

P0 = [1.0, -2.0, 0.5]
GRADS = [[0.2, -0.4, 0.0], [-0.1, 0.3, 1.0]]


def _run_optimizer(opt_factory, p0=P0, grads=GRADS):
    p = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float64))
    opt = opt_factory([p])
    out = []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        out.append(p.detach().clone())
    return out


def test_dqn3_rmsprop_two_steps_hand_computed():
    # Step 1, element 0: g = 0.05*0.2 = 0.01, g2 = 0.05*0.04 = 0.002,
    #   sqrt(0.002 - 0.0001 + 0.01) = sqrt(0.0119) = 0.10908712, p = 1 - 0.1*0.2/0.10908712 = 0.81666030
    # Step 2, element 2: g = 0.05, g2 = 0.05, sqrt(0.05 - 0.0025 + 0.01) = 0.23979158,
    #   p = 0.5 - 0.1*1/0.23979158 = 0.08297117
    p1, p2 = _run_optimizer(lambda ps: DQN3RMSprop(ps, lr=0.1))
    torch.testing.assert_close(p1, torch.tensor([0.8166603005943577, -1.6984886554222363, 0.5], dtype=torch.float64))
    torch.testing.assert_close(
        p2, torch.tensor([0.9065363683020533, -1.9003635837496398, 0.08297117188585063], dtype=torch.float64)
    )


def test_dqn3_rmsprop_weight_cost():
    # grad' = grad + 0.5 * p, e.g. step 1 element 0: 0.2 + 0.5 = 0.7,
    #   sqrt(0.05*0.49 - 0.035^2 + 0.01) = sqrt(0.033275), p = 1 - 0.1*0.7/0.18241436 = 0.61625829
    p1, p2 = _run_optimizer(lambda ps: DQN3RMSprop(ps, lr=0.1, weight_cost=0.5))
    torch.testing.assert_close(
        p1, torch.tensor([0.6162582887192101, -1.5639877380949905, 0.28047148002061933], dtype=torch.float64)
    )
    torch.testing.assert_close(
        p2, torch.tensor([0.5026045469391356, -1.4162976958576023, -0.14088475775671921], dtype=torch.float64)
    )


def test_dqn3_rmsprop_is_not_torch_centered_rmsprop():
    ours = _run_optimizer(lambda ps: DQN3RMSprop(ps, lr=0.1))
    theirs = _run_optimizer(lambda ps: torch.optim.RMSprop(ps, lr=0.1, alpha=0.95, eps=0.01, centered=True))
    # torch: p = 1 - 0.1*0.2/(sqrt(0.0019) + 0.01) = 0.62679..., ours 0.81666...
    assert abs(theirs[0][0].item() - 0.6267890) < 1e-6
    assert not torch.allclose(ours[0], theirs[0], rtol=1e-3, atol=1e-3)


def test_dqn3_rmsprop_many_params_lr_change_and_state_dict():
    torch.manual_seed(0)
    shapes = [(3,), (2, 2), (4,)]
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes]
    frozen_before = params[2].detach().clone()
    opt = DQN3RMSprop(params, lr=0.1)
    grads = [torch.randn(s, dtype=torch.float64) for s in shapes[:2]]
    expected = []
    for p, g in zip(params[:2], grads):
        p.grad = g.clone()
        # numpy reference at lr 0.05 (one step, state starts at zero)
        pn, gn = p.detach().numpy(), g.numpy()
        expected.append(pn - 0.05 * gn / np.sqrt(0.05 * gn**2 - (0.05 * gn) ** 2 + 0.01))
    opt.param_groups[0]["lr"] = 0.05  # annealing goes through param_groups
    opt.step()
    for p, e in zip(params[:2], expected):
        np.testing.assert_allclose(p.detach().numpy(), e, rtol=1e-12)
    assert torch.equal(params[2], frozen_before) and params[2] not in opt.state  # no grad: untouched
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"g", "g2"}
    opt2 = DQN3RMSprop([torch.nn.Parameter(p.detach().clone()) for p in params], lr=0.1)
    opt2.load_state_dict(sd)
    torch.testing.assert_close(opt2.state_dict()["state"][1]["g2"], sd["state"][1]["g2"])
    assert opt2.param_groups[0]["lr"] == 0.05


# ---------------------------------------------------------------- lr_at


def test_lr_at_anneal_numbers():
    kw = dict(learn_start=100, lr_start=1e-3, lr_end=1e-4, lr_endt=1000)
    assert lr_at(0, **kw) == pytest.approx(1e-3)
    assert lr_at(100, **kw) == pytest.approx(1e-3)
    assert lr_at(600, **kw) == pytest.approx(5.5e-4)  # t = 500: 9e-4 * 0.5 + 1e-4
    assert lr_at(1100, **kw) == pytest.approx(1e-4)
    assert lr_at(10_000, **kw) == pytest.approx(1e-4)
    # DQN3.0 defaults: lr_end = lr, constant
    assert lr_at(3_000_000, learn_start=50_000, lr_start=2.5e-4, lr_end=2.5e-4, lr_endt=1_000_000) == pytest.approx(2.5e-4)


def test_lr_at_runs_upwards_as_a_warm_up():
    """configs/pong_efficient.toml's warm-up: lr 2.5e-4 rising to lr_end 1e-3 over lr_endt = 50k agent steps of
    learning (learn_start 10k), then 1e-3; by hand: at t steps of learning 7.5e-4 * (50k - t) / 50k below 1e-3."""
    kw = dict(learn_start=10_000, lr_start=2.5e-4, lr_end=1e-3, lr_endt=50_000)
    assert lr_at(5_000, **kw) == pytest.approx(2.5e-4)
    assert lr_at(10_000, **kw) == pytest.approx(2.5e-4)
    assert lr_at(20_000, **kw) == pytest.approx(4e-4)  # t = 10k: 1e-3 - 7.5e-4 * 0.8
    assert lr_at(35_000, **kw) == pytest.approx(6.25e-4)  # t = 25k: half way
    assert lr_at(60_000, **kw) == pytest.approx(1e-3)
    assert lr_at(300_000, **kw) == pytest.approx(1e-3)


# ---------------------------------------------------------------- gradient injection and Learner

DISCOUNT = 0.9


def _batch(seed=0, batch=6, obs_dim=3, n_actions=3):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, 1, obs_dim, generator=g)
    next_states = torch.randn(batch, 1, obs_dim, generator=g)
    actions = torch.randint(0, n_actions, (batch,), generator=g)
    # large rewards on some rows so that both clipped and unclipped deltas occur
    rewards = torch.tensor([2.0, -2.0, 0.05, 0.0, -0.1, 1.5])[:batch]
    terminals = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])[:batch]
    return states, actions, rewards, next_states, terminals


def _small_mlp(seed=0):
    torch.manual_seed(seed)
    return MLPQNetwork(obs_dim=3, n_actions=3, hidden=(5,))


def _independent_grad(net, target, states, actions, rewards, next_states, terminals):
    """-sum_i clip(delta_i) dQ(s_i, a_i)/dw, one autograd.grad call per sample."""
    params = list(net.parameters())
    total = [torch.zeros_like(p) for p in params]
    deltas = []
    for i in range(states.shape[0]):
        with torch.no_grad():
            y = rewards[i] + DISCOUNT * (1 - terminals[i]) * target(next_states[i : i + 1]).max()
        q_sa = net(states[i : i + 1])[0, actions[i]]
        d = (y - q_sa.detach()).clamp(-1.0, 1.0)
        deltas.append(d.item())
        for acc, gr in zip(total, torch.autograd.grad(q_sa, params)):
            acc -= d * gr
    return total, deltas


def _huber_grad(net, target, states, actions, rewards, next_states, terminals):
    """Gradient of the SUMMED Huber(threshold 1) loss of Q(s, a) - y."""
    net.zero_grad()
    with torch.no_grad():
        y = rewards + DISCOUNT * (1 - terminals) * target(next_states).max(dim=1).values
    q_sa = net(states).gather(1, actions.view(-1, 1)).squeeze(1)
    F.huber_loss(q_sa, y, reduction="sum", delta=1.0).backward()
    return [p.grad.clone() for p in net.parameters()]


def _learner(net, **overrides):
    kw = dict(
        lr=0.01, lr_end=0.001, lr_endt=100, learn_start=10, discount=DISCOUNT, clip_delta=1.0,
        rescale_r=False, r_max=1.0, weight_cost=0.0, device="cpu",
    )
    kw.update(overrides)
    return Learner(net, **kw)


def test_injected_gradient_equals_clipped_delta_sum_and_summed_huber():
    batch = _batch()
    reference = _small_mlp()
    target = copy.deepcopy(reference)
    expected, deltas = _independent_grad(copy.deepcopy(reference), target, *batch)
    assert any(abs(d) == 1.0 for d in deltas) and any(abs(d) < 1.0 for d in deltas)
    huber = _huber_grad(copy.deepcopy(reference), target, *batch)

    learner = _learner(reference)
    learner.update(*batch, step=60)
    for p, e, h in zip(learner.online_network.parameters(), expected, huber):
        torch.testing.assert_close(p.grad, e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.grad, h, rtol=1e-5, atol=1e-6)


def test_learner_update_applies_dqn3_rmsprop_to_that_gradient():
    batch = _batch(seed=1)
    net = _small_mlp(seed=1)
    before = [p.detach().clone().double() for p in net.parameters()]
    grad, deltas = _independent_grad(copy.deepcopy(net), copy.deepcopy(net), *batch)
    learner = _learner(net)
    target_before = copy.deepcopy(learner.target_network.state_dict())

    out = learner.update(*batch, step=60)  # t = 50: lr = 0.009 * 50/100 + 0.001 = 0.0055
    lr = 0.0055
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    for p, p0, g in zip(learner.online_network.parameters(), before, grad):
        g = g.double()
        # first step from zero state: g = 0.05 grad, g2 = 0.05 grad^2
        expected = p0 - lr * g / torch.sqrt(0.05 * g**2 - (0.05 * g) ** 2 + 0.01)
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-7)

    # metrics: 0-dim detached tensors
    for key in ("abs_delta", "q_mean", "q2_max"):
        assert out[key].dim() == 0 and not out[key].requires_grad
    assert out["abs_delta"].item() == pytest.approx(float(np.mean(np.abs(deltas))), rel=1e-5)

    # target untouched, never given gradients, until sync_target
    for name, t in learner.target_network.state_dict().items():
        assert torch.equal(t, target_before[name])
    assert all(p.grad is None and not p.requires_grad for p in learner.target_network.parameters())
    assert not learner.target_network.training
    learner.sync_target()
    for (n1, t1), (n2, t2) in zip(
        learner.target_network.state_dict().items(), learner.online_network.state_dict().items()
    ):
        assert n1 == n2 and torch.equal(t1, t2)
    assert all(not p.requires_grad for p in learner.target_network.parameters())


def test_summed_update_with_eps_times_batch_squared_is_tensorflows_centred_rmsprop_on_the_mean_loss():
    """configs/pong_single_dopamine.toml's claim: Dopamine's DQN (TF1 RMSPropOptimizer, centred, eps 1e-5
    inside the root, on the minibatch MEAN Huber loss) takes the same steps as madqn's summed-gradient
    update with eps = 1e-5 * B^2. Reference: TF1's update rule written out here on autograd's gradient of
    the mean loss, with its mean square started at 0 like DQN3.0's (TF starts it at 1, a difference that
    has decayed below 1e-5 of its start after 225 updates)."""
    eps_tf, lr, decay, steps = 1e-5, 0.01, 0.95, 3
    batches = [_batch(seed=10 + k) for k in range(steps)]
    b = batches[0][0].shape[0]
    reference = _small_mlp(seed=3)
    target = copy.deepcopy(reference)
    ref = copy.deepcopy(reference).double()
    target64 = copy.deepcopy(target).double()
    ms = [torch.zeros_like(p) for p in ref.parameters()]
    mg = [torch.zeros_like(p) for p in ref.parameters()]
    for batch in batches:
        batch64 = [t.double() if t.is_floating_point() else t for t in batch]
        mean_grads = [g / b for g in _huber_grad(ref, target64, *batch64)]  # the gradient of the MEAN loss
        with torch.no_grad():
            for p, g, m2, m1 in zip(ref.parameters(), mean_grads, ms, mg):
                m2.mul_(decay).add_((1 - decay) * g**2)
                m1.mul_(decay).add_((1 - decay) * g)
                p -= lr * g / torch.sqrt(m2 - m1**2 + eps_tf)

    learner = _learner(reference, lr=lr, lr_end=lr, eps=eps_tf * b**2)
    for k, batch in enumerate(batches):
        learner.update(*batch, step=60 + k)
    moved = 0.0
    for p, r, p0 in zip(learner.online_network.parameters(), ref.parameters(), target.parameters()):
        torch.testing.assert_close(p.detach().double(), r.detach(), rtol=1e-5, atol=1e-6)
        moved = max(moved, (r.detach() - p0.detach().double()).abs().max().item())
    assert moved > 1e-3  # the steps are large enough for a wrong eps to show
    # and DQN3.0's own eps (0.01, whatever the batch) takes different steps on this batch size
    other = _learner(copy.deepcopy(target), lr=lr, lr_end=lr, eps=0.01)
    for k, batch in enumerate(batches):
        other.update(*batch, step=60 + k)
    assert any(not torch.allclose(p.detach().double(), r.detach(), rtol=1e-3, atol=1e-4)
               for p, r in zip(other.online_network.parameters(), ref.parameters()))


def test_learner_state_dict_round_trip_continues_identically():
    batch = _batch(seed=2)
    a = _learner(_small_mlp(seed=2))
    a.update(*batch, step=11)
    b = _learner(_small_mlp(seed=99))
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    out_a = a.update(*batch, step=12)
    out_b = b.update(*batch, step=12)
    for pa, pb in zip(a.online_network.parameters(), b.online_network.parameters()):
        assert torch.equal(pa, pb)
    assert torch.equal(out_a["abs_delta"], out_b["abs_delta"])


class _RecordingNet(torch.nn.Module):
    def __init__(self, n_agents):
        super().__init__()
        self.n_agents = n_agents
        self.linear = torch.nn.Linear(2, 2)
        self.seen = []

    def forward(self, x, agent_ids=None):
        self.seen.append(agent_ids)
        return self.linear(x.float())


def test_learner_passes_agent_ids_only_to_shared_networks():
    x = torch.zeros(3, 2)
    ids = torch.tensor([0, 1, 0])
    for n_agents in (0, 2):
        learner = _learner(_RecordingNet(n_agents))
        learner.q_values(x, ids)
        learner.update(x, torch.tensor([0, 1, 0]), torch.zeros(3), x, torch.zeros(3), agent_ids=ids)
        seen = learner.online_network.seen + learner.target_network.seen
        assert len(seen) == 3
        assert all((s is None) if n_agents == 0 else (s is ids) for s in seen)


def test_learner_shared_conv_update_with_masks():
    torch.manual_seed(3)
    learner = _learner(DQN3ConvNet(n_actions=3, n_agents=2), lr=2.5e-4, lr_end=2.5e-4)
    g = torch.Generator().manual_seed(4)
    states = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8, generator=g)
    next_states = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8, generator=g)
    ids = torch.tensor([0, 1])
    masks = torch.tensor([[True, False, True], [False, False, False]])
    q_before = learner.q_values(states, ids)
    out = learner.update(
        states, torch.tensor([2, 0]), torch.tensor([1.0, -1.0]), next_states, torch.tensor([0.0, 0.0]),
        agent_ids=ids, next_action_masks=masks, step=0,
    )
    assert q_before.shape == (2, 3) and not q_before.requires_grad
    assert not torch.equal(learner.q_values(states, ids), q_before)
    with torch.no_grad():
        q2 = learner.target_network(next_states, ids)
    assert out["q2_max"].item() == pytest.approx(max(q2[0, 0].item(), q2[0, 2].item()) / 2, rel=1e-5, abs=1e-7)
    assert math.isfinite(out["abs_delta"].item())
