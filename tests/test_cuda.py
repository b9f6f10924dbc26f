"""The CUDA path, against the CPU path as reference (skipped without a GPU; docs/benchmarks.md says where
and when these ran on one).

- One fp32 update on CUDA (IEEE fp32 matmuls and cuDNN convolutions) gives the CPU update's deltas and
  weight change up to float rounding: different kernels sum in a different order, nothing more.
- The bf16 update on CUDA agrees with CUDA fp32 within the tolerances tests/test_precision.py measured
  for bf16 on CPU.
- A pong_v3 run trained with device = "cuda" checkpoints, resumes on CUDA, and its export loads on a
  machine without a GPU (tensors saved from CUDA come back on the CPU) with the Q-values it has on CUDA.
"""

import pytest
import torch

import madqn
from madqn.core.networks import DQN3ConvNet
from madqn.cli.export import export_agents
from madqn.training.checkpoint import safe_load
from madqn.core.learner import describe_precision
from helpers import (SMOKE, learner_update as _update, play_side_by_side, random_batch as _batch, read_csv, switches,
                     switches_during_update)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

@pytest.mark.parametrize("seed", [0, 1])
def test_cuda_fp32_update_equals_the_cpu_update_up_to_rounding(seed):
    torch.manual_seed(seed)
    net = DQN3ConvNet(6, 4, n_agents=2)
    batch = _batch(seed)
    _, cpu, change_cpu = _update(net, "fp32", batch, device="cpu", steps=2)
    learner, gpu, change_gpu = _update(net, "fp32", batch, device="cuda", steps=2)
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
    _, ref, change32 = _update(net, "fp32", batch, device="cuda")
    learner, out, change16 = _update(net, "bf16", batch, device="cuda")
    torch.testing.assert_close(out["delta"], ref["delta"], rtol=0, atol=2e-3)
    assert out["delta"].dtype == torch.float32
    assert not torch.equal(change16, change32)  # the bf16 path really ran in bf16
    assert (change16 - change32).norm() <= 0.2 * change32.norm()
    assert torch.nn.functional.cosine_similarity(change16, change32, dim=0) >= 0.99
    for p in learner.online_network.parameters():
        assert p.dtype == torch.float32 and p.is_cuda


def test_cuda_update_runs_fp32_as_ieee_and_bf16_with_tf32_whatever_the_process_set():
    """The forwards inside a CUDA update see IEEE fp32 (fp32 learner) or TF32 (bf16 learner) whatever the
    process had set; the process's switches are back afterwards. An fp32 update under a process-wide TF32
    setting still equals the CPU update up to rounding (TF32 would be ~1e-3 apart)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = switches()
    try:
        for setting in (("tf32", "tf32"), ("ieee", "ieee")):
            matmul.fp32_precision, conv.fp32_precision = setting
            assert switches_during_update("cuda", "fp32") == ({("ieee", "ieee")}, setting)
            assert switches_during_update("cuda", "bf16") == ({("tf32", "tf32")}, setting)
        matmul.fp32_precision, conv.fp32_precision = "tf32", "tf32"
        torch.manual_seed(0)
        net = DQN3ConvNet(6, 4, n_agents=2)
        _, cpu, _ = _update(net, "fp32", _batch(0), device="cpu")
        _, gpu, _ = _update(net, "fp32", _batch(0), device="cuda")
        torch.testing.assert_close(gpu["delta"], cpu["delta"], rtol=0, atol=1e-5)
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_auto_precision_is_bf16_exactly_on_gpus_with_bf16_tensor_cores():
    """Asked of each GPU by its device object; the current device stays as it was."""
    current = torch.cuda.current_device()
    for index in range(torch.cuda.device_count()):
        native = torch.cuda.get_device_capability(index)[0] >= 8
        resolved, why = describe_precision("auto", torch.device(f"cuda:{index}"))
        assert resolved == ("bf16" if native else "fp32") and why.startswith("auto: "), (index, why)
        assert torch.cuda.current_device() == current


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
    assert play_side_by_side(on_cpu, on_gpu, steps=40, epsilon=0.0, atol=1e-4) == 80
