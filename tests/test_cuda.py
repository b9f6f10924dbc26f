"""The CUDA path, against the CPU path as reference (skipped without a GPU; docs/benchmarks.md says where
and when these ran on one).

- One fp32 update on CUDA (IEEE fp32 matmuls and cuDNN convolutions) gives the CPU update's deltas and
  weight change up to float rounding: different kernels sum in a different order, nothing more.
- The bf16 update on CUDA agrees with CUDA fp32 within the tolerances tests/test_precision.py measured
  for bf16 on CPU.
- A pong_v3 run trained with device = "cuda" checkpoints, resumes on CUDA, and its export loads on a
  machine without a GPU (tensors saved from CUDA come back on the CPU) with the Q-values it has on CUDA.
"""

import copy

import numpy as np
import pytest
import torch

import madqn
from madqn.config import make_config
from madqn.core.learner import Learner
from madqn.core.networks import DQN3ConvNet
from madqn.envs.adapters import make_env
from madqn.cli.export import export_agents
from madqn.training.checkpoint import safe_load
from helpers import ROOT, random_batch as _batch, read_csv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMOKE = ROOT / "configs" / "smoke.toml"
LR = 2.5e-4


def _update(net, device, precision, batch, steps=2):
    """``steps`` updates on the same batch (the second one exercises the RMSProp state); returns the stats
    of the last one and the total weight change, both on the CPU."""
    learner = Learner(copy.deepcopy(net), lr=LR, lr_end=LR, lr_endt=1, learn_start=0, discount=0.99,
                      clip_delta=1.0, rescale_r=True, r_max=1.0, weight_cost=0.0, device=device, precision=precision)
    before = [p.detach().cpu().clone() for p in learner.online_network.parameters()]
    states, actions, rewards, next_states, terminals, ids = (t.to(device) for t in batch)
    for _ in range(steps):
        stats = learner.update(states, actions, rewards, next_states, terminals, agent_ids=ids)
    change = torch.cat([(p.detach().cpu() - b).flatten()
                        for p, b in zip(learner.online_network.parameters(), before)])
    return learner, {k: v.detach().cpu() for k, v in stats.items()}, change


@pytest.mark.parametrize("seed", [0, 1])
def test_cuda_fp32_update_equals_the_cpu_update_up_to_rounding(seed):
    torch.manual_seed(seed)
    net = DQN3ConvNet(6, 4, n_agents=2)
    batch = _batch(seed)
    _, cpu, change_cpu = _update(net, "cpu", "fp32", batch)
    learner, gpu, change_gpu = _update(net, "cuda", "fp32", batch)
    assert next(learner.online_network.parameters()).is_cuda

    torch.testing.assert_close(gpu["delta"], cpu["delta"], rtol=0, atol=1e-5)
    for key in ("q2_max", "q_mean", "abs_delta"):
        assert abs(gpu[key].item() - cpu[key].item()) <= 1e-5, key
    # TF32 would be ~1e-3 apart here; IEEE fp32 is rounding only
    assert (change_gpu - change_cpu).norm() <= 1e-4 * change_cpu.norm()
    assert change_cpu.norm() > 0


def test_cuda_bf16_update_agrees_with_cuda_fp32():
    torch.manual_seed(0)
    net = DQN3ConvNet(6, 4, n_agents=2)
    batch = _batch(0)
    _, ref, change32 = _update(net, "cuda", "fp32", batch, steps=1)
    learner, out, change16 = _update(net, "cuda", "bf16", batch, steps=1)
    torch.testing.assert_close(out["delta"], ref["delta"], rtol=0, atol=2e-3)
    assert out["delta"].dtype == torch.float32
    assert not torch.equal(change16, change32)  # the bf16 path really ran in bf16
    assert (change16 - change32).norm() <= 0.2 * change32.norm()
    assert torch.nn.functional.cosine_similarity(change16, change32, dim=0) >= 0.99
    for p in learner.online_network.parameters():
        assert p.dtype == torch.float32 and p.is_cuda


def test_pong_run_on_cuda_resumes_and_its_export_plays_on_the_cpu(tmp_path):
    run_dir = tmp_path / "run"
    overrides = dict(learn_start=40, sharing="shared", final_eval_episodes=0, device="cuda", save_freq=100,
                     save_replay=True)
    madqn.train("pong_v3", SMOKE, run_dir=run_dir, steps=100, **overrides)
    first = safe_load(run_dir / "checkpoints" / "latest.pt")
    assert first["step"] == 100
    madqn.train(resume=run_dir, steps=200, device="cuda")
    updates = [int(r["updates"]) for r in read_csv(run_dir / "train.csv")]
    assert updates and updates[-1] > 0

    out = tmp_path / "model.pt"
    export_agents(run_dir, out)
    on_cpu = madqn.load_agents(out, device="cpu", seed=3)
    on_gpu = madqn.load_agents(out, device="cuda", seed=3)
    env = make_env("pong_v3", make_config(SMOKE), seed=5, convert=False)
    observations, infos = env.reset()
    on_cpu.reset()
    on_gpu.reset()
    compared = 0
    for _ in range(40):
        actions = on_cpu.act(observations, infos, 0.0)
        assert on_gpu.act(observations, infos, 0.0) == actions
        for agent in observations:
            q_cpu = on_cpu._q_values(on_cpu.networks[agent], [agent])
            q_gpu = on_gpu._q_values(on_gpu.networks[agent], [agent])
            np.testing.assert_allclose(q_gpu, q_cpu, rtol=0, atol=1e-4)
            compared += 1
        observations, _, _, _, infos = env.step(actions)
    env.close()
    assert compared == 80
