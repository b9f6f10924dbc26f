"""``compile = true``: the compiled learner update equals the eager one (DQN3.0's maths, op by op).

Two learners start from the same weights and take the same 50 minibatches; the compiled one runs the
forwards, targets and injected backward as one ``torch.compile`` graph and the optimizer as one fused
kernel. Float rounding of the compiled kernels differs from the eager ones (other summation orders inside
fused loops), so the weights are compared against the size of what the 50 updates changed: the largest
difference must stay below 1% (fp32) or 5% (bf16, whose rounding is coarser) of the largest change, and
the per-update statistics must agree to the same tolerance.
"""

from __future__ import annotations

import copy

import pytest
import torch

from madqn.core.learner import DQN3RMSprop, Learner, dqn3_rmsprop_
from madqn.core.networks import DQN3ConvNet

from helpers import random_batch

UPDATES = 50


def batches(n: int, *, n_step: bool, prioritized: bool):
    """``n`` fixed minibatches (random_batch), with per-row discounts gamma**k (n-step returns, k in 1..3)
    and importance weights in (0, 1] (prioritized replay) when asked."""
    out = []
    for k in range(n):
        states, actions, rewards, next_states, terminals, ids = random_batch(seed=k)
        g = torch.Generator().manual_seed(1000 + k)
        discounts = 0.99 ** torch.randint(1, 4, (32,), generator=g).float() if n_step else None
        weights = torch.rand(32, generator=g) * 0.9 + 0.1 if prioritized else None
        out.append(dict(states=states, actions=actions, rewards=rewards, next_states=next_states,
                        terminals=terminals, agent_ids=ids, discounts=discounts, weights=weights))
    return out


def train(net, compiled: bool, data, **kw):
    learner = Learner(copy.deepcopy(net), lr=2.5e-4, lr_end=1e-4, lr_endt=UPDATES, learn_start=0, discount=0.99,
                      clip_delta=1.0, rescale_r=False, r_max=1.0, weight_cost=0.0, device="cpu", compile=compiled,
                      **kw)
    stats = []
    for step, b in enumerate(data):
        s = learner.update(b["states"], b["actions"], b["rewards"], b["next_states"], b["terminals"],
                           agent_ids=b["agent_ids"], step=step, discounts=b["discounts"], weights=b["weights"])
        stats.append(torch.stack([s["abs_delta"], s["q_mean"], s["q2_max"]]).float())
        if step % 20 == 19:
            learner.sync_target()
    return learner, torch.stack(stats)


def assert_same_training(net, tolerance, *, n_step=False, prioritized=False, **kw):
    data = batches(UPDATES, n_step=n_step, prioritized=prioritized)
    eager, eager_stats = train(net, False, data, **kw)
    compiled, compiled_stats = train(net, True, data, **kw)
    start = dict(net.named_parameters())
    worst = 0.0
    for (name, p), q in zip(eager.online_network.named_parameters(), compiled.online_network.parameters()):
        change = (p.detach() - start[name].detach()).abs().max().item()
        assert change > 0, f"{name} did not move: the test would not see a difference"
        worst = max(worst, (p.detach() - q.detach()).abs().max().item() / change)
    assert worst < tolerance, f"compiled weights differ from eager by {worst:.2%} of the change (limit {tolerance:.0%})"
    scale = eager_stats.abs().amax(dim=0)
    assert ((eager_stats - compiled_stats).abs().amax(dim=0) <= tolerance * scale).all()
    for p, q in zip(eager.target_network.parameters(), compiled.target_network.parameters()):
        assert (p - q).abs().max() <= tolerance * p.abs().max()
    return worst


def test_compiled_update_equals_eager_with_dqn3_defaults():
    """DQN3.0's own settings: fp32, plain DQN targets, centred RMSProp (fused kernel), one network per agent."""
    torch.manual_seed(0)
    assert_same_training(DQN3ConvNet(6), 0.01)


def test_compiled_update_equals_eager_with_the_extensions_under_bf16():
    """A shared network (agent indicator) with double DQN, dueling heads, n-step discounts, importance
    weights and bf16 autocast, the preset's precision."""
    torch.manual_seed(1)
    assert_same_training(DQN3ConvNet(6, n_agents=2, dueling=True), 0.05, n_step=True, prioritized=True,
                         double=True, precision="bf16")


@pytest.mark.slow
def test_compiled_update_equals_eager_with_adam():
    torch.manual_seed(2)
    assert_same_training(DQN3ConvNet(6, n_agents=2), 0.01, double=True, optimizer="adam", adam_eps=4.8e-3)


def test_fused_rmsprop_kernel_equals_the_foreach_step_and_the_formula():
    """The fused kernel against the foreach kernels and against DQN3.0's formula written out, with weight
    cost and an annealed (changing) learning rate: a tensor lr compiles once."""
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32, 3, 3), (512,), (7, 5)]
    params = [torch.randn(s, generator=g) for s in shapes]
    runs = {name: ([p.clone() for p in params], [torch.zeros_like(p) for p in params],
                   [torch.zeros_like(p) for p in params]) for name in ("foreach", "fused", "formula")}
    for step in range(5):
        grads = [torch.randn(s, generator=g) for s in shapes]
        lr = 2.5e-4 * (1 - step / 10)
        for name, (ps, gs, g2s) in runs.items():
            if name == "formula":
                for p, grad, gg, gg2 in zip(ps, grads, gs, g2s):
                    d = grad + 0.01 * p
                    gg.copy_(0.95 * gg + 0.05 * d)
                    gg2.copy_(0.95 * gg2 + 0.05 * d * d)
                    p.sub_(lr * d / torch.sqrt(gg2 - gg * gg + 0.01))
            else:
                dqn3_rmsprop_(ps, grads, gs, g2s, [torch.empty_like(p) for p in ps], lr=lr, decay=0.95, eps=0.01,
                              weight_cost=0.01, fused=name == "fused")
    for name in ("fused", "formula"):
        for a, b in zip(runs["foreach"][0], runs[name][0]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not torch.equal(runs["foreach"][0][0], params[0])
