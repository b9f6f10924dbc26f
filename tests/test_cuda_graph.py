"""``cuda_graph = true``: the learner's update captured in a CUDA graph equals the eager update.

The CUDA cases need a GPU (skipped elsewhere; docs/benchmarks.md says where they ran). In float64 no rounding
difference can flip a ReLU, so the captured learner, left to run its own 50 updates beside the eager one
(fresh minibatches, the lr annealed through the graph's device scalar, the target synced every 20), must
end within 1e-6 of the eager weights (relative to their change): DQN3.0's defaults, the extensions (shared
network, double, dueling, n-step discounts, importance weights) and Adam. A resumed learner (new optimizer
state tensors) captures again. On a machine without CUDA the setting is refused in one line.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from madqn.core.learner import Learner
from madqn.core.networks import DQN3ConvNet
from helpers import run_madqn
from test_compiled import UPDATES, batches

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _learner(net, captured: bool, **kw) -> Learner:
    return Learner(copy.deepcopy(net), lr=2.5e-4, lr_end=1e-4, lr_endt=UPDATES, learn_start=0, discount=0.99,
                   clip_delta=1.0, rescale_r=False, r_max=1.0, weight_cost=0.0, device="cuda", cuda_graph=captured,
                   **kw)


def _run(learner: Learner, data: list[dict]) -> list[torch.Tensor]:
    stats = []
    for step, b in enumerate(data):
        b = {k: None if v is None else v.cuda() for k, v in b.items()}
        s = learner.update(b["states"], b["actions"], b["rewards"], b["next_states"], b["terminals"],
                           agent_ids=b["agent_ids"], step=step, discounts=b["discounts"], weights=b["weights"])
        stats.append(torch.stack([s["abs_delta"], s["q_mean"], s["q2_max"]]).float().cpu())
        if step % 20 == 19:
            learner.sync_target()
    return stats


@cuda
@pytest.mark.parametrize("variant", ["dqn3", "extensions", "adam"])
def test_captured_update_equals_the_eager_update_over_50_updates_in_float64(variant):
    torch.manual_seed(0)
    kw = {"dqn3": dict(net=DQN3ConvNet(6)),
          "extensions": dict(net=DQN3ConvNet(6, n_agents=2, dueling=True), n_step=True, prioritized=True,
                             double=True),
          "adam": dict(net=DQN3ConvNet(6, n_agents=2), double=True, optimizer="adam", adam_eps=4.8e-3)}[variant]
    net = kw.pop("net").double()
    data = batches(UPDATES, n_step=kw.pop("n_step", False), prioritized=kw.pop("prioritized", False))
    eager, captured = _learner(net, False, **kw), _learner(net, True, **kw)
    start = [p.detach().clone() for p in eager.online_network.parameters()]
    eager_stats, captured_stats = _run(eager, data), _run(captured, data)
    assert len(captured._graphs) == 1  # one capture, replayed 50 times
    for a, b in zip(eager_stats, captured_stats):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    for (name, p), q, p0 in zip(eager.online_network.named_parameters(), captured.online_network.parameters(), start):
        change = (p - p0).norm()
        assert change > 0, name
        assert ((p - q).norm() / change).item() < 1e-6, name


@cuda
def test_a_resumed_captured_learner_captures_again_and_goes_on_like_the_eager_one():
    torch.manual_seed(1)
    net = DQN3ConvNet(6, n_agents=2).double()
    data = batches(20, n_step=False, prioritized=False)
    eager, captured = _learner(net, False), _learner(net, True)
    _run(eager, data[:10])
    _run(captured, data[:10])
    resumed = _learner(net, True)
    resumed.load_state_dict(copy.deepcopy(captured.state_dict()))
    _run(eager, data[10:])
    _run(resumed, data[10:])
    for p, q in zip(eager.online_network.parameters(), resumed.online_network.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-9)


def test_cuda_graph_without_a_cuda_device_is_one_clear_line(tmp_path):
    done = run_madqn("train", "--env", CATCH, "--steps", "50", "--device", "cpu", "--run-dir", tmp_path / "run",
                     "--set", "cuda_graph=true", cwd=tmp_path)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cuda_graph = true" in lines[0] and "Traceback" not in done.stderr
