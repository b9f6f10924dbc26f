"""precision = "bf16": the update agrees with fp32 on a fixed batch, master state stays fp32, the CUDA
switches are never touched on CPU, and the CLI reports what "auto" chose.

Tolerances (measured on 4 seeds of this batch: delta within 4e-4, weight change 4-9% apart in relative
norm, cosine >= 0.996): clipped deltas and q2_max within 2e-3 (|Q| is ~0.1 at init, bf16 keeps 8
significant bits), the weight change of one DQN3RMSprop step within 20% relative norm and cosine >= 0.99.
"""

import pytest
import torch

from madqn import cli
from madqn.core.learner import Learner, cuda_fp32_precision, describe_precision
from madqn.core.networks import DQN3ConvNet
from helpers import ROOT, learner_update as _update, random_batch as _batch, switches, switches_during_update

LR = 2.5e-4


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_update_agrees_with_fp32_on_a_fixed_batch(seed):
    torch.manual_seed(seed)
    net = DQN3ConvNet(6, 4, n_agents=2)
    batch = _batch(seed)
    _, ref, change32 = _update(net, "fp32", batch)
    learner, out, change16 = _update(net, "bf16", batch)

    clipped = ref["delta"].abs() == 1.0
    assert 0 < clipped.sum() < len(clipped)  # both clipped and unclipped rows
    torch.testing.assert_close(out["delta"], ref["delta"], rtol=0, atol=2e-3)
    assert torch.equal(out["delta"][clipped], ref["delta"][clipped])
    for key in ("q2_max", "q_mean", "abs_delta"):
        assert abs(out[key].item() - ref[key].item()) <= 2e-3, key
    assert out["delta"].dtype == torch.float32  # targets/delta computed in fp32

    assert not torch.equal(change16, change32)  # the bf16 path really ran in bf16
    assert (change16 - change32).norm() <= 0.2 * change32.norm()
    assert torch.nn.functional.cosine_similarity(change16, change32, dim=0) >= 0.99

    # master weights, their gradients and the DQN3RMSprop state stay fp32
    for p in learner.online_network.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        state = learner.optimizer.state[p]
        assert state["g"].dtype == state["g2"].dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in learner.target_network.parameters())


def test_bf16_targets_equal_q_targets_of_the_bf16_q_values():
    """The targets/delta are DQN3.0's getQUpdate applied (in fp32) to the Q-values the bf16 forwards give."""
    torch.manual_seed(5)
    net = DQN3ConvNet(6, 4, n_agents=2)
    states, actions, rewards, next_states, terminals, ids = _batch(5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        q_all = net(states, ids).float()
        q2_all = net(next_states, ids).float()
    q_sa = q_all.gather(1, actions.view(-1, 1)).squeeze(1)
    expected = (rewards + 0.99 * q2_all.max(1).values * (1 - terminals) - q_sa).clamp(-1, 1)
    _, out, _ = _update(net, "bf16", (states, actions, rewards, next_states, terminals, ids))
    torch.testing.assert_close(out["delta"], expected, rtol=0, atol=1e-6)


def test_cpu_update_leaves_the_cuda_switches_alone():
    """The TF32 switches are process-global: a CPU learner neither reads nor sets them (the acting forwards
    of another thread run under whatever the process has)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = switches()
    try:
        matmul.fp32_precision, conv.fp32_precision = "tf32", "ieee"  # a setting no learner would choose
        for precision in ("fp32", "bf16"):
            assert switches_during_update("cpu", precision) == ({("tf32", "ieee")}, ("tf32", "ieee"))
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_cuda_fp32_precision_sets_and_restores_the_tf32_switches():
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = (matmul.fp32_precision, conv.fp32_precision)
    for mode in ("tf32", "ieee"):
        with cuda_fp32_precision(mode):
            assert (matmul.fp32_precision, conv.fp32_precision) == (mode, mode)
        assert (matmul.fp32_precision, conv.fp32_precision) == before


def test_describe_precision():
    cpu = torch.device("cpu")
    assert describe_precision("fp32", cpu) == ("fp32", "set")
    assert describe_precision("bf16", cpu) == ("bf16", "set")
    flags = open("/proc/cpuinfo").read().split()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    resolved, why = describe_precision("auto", cpu)
    assert resolved == ("bf16" if native else "fp32") and why.startswith("auto: ")
    with pytest.raises(ValueError, match="precision"):
        Learner(DQN3ConvNet(6), lr=LR, lr_end=LR, lr_endt=1, learn_start=0, discount=0.99, clip_delta=1.0,
                rescale_r=True, r_max=1.0, weight_cost=0.0, device="cpu", precision="fp16")


def test_cli_precision_auto_is_resolved_in_the_first_line_and_the_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["train", "--env", f"{ROOT / 'tests' / 'tiny_catch.py'}:make", "--precision", "auto",
                     "--steps", "60", "--run-dir", str(run_dir), "--set", "learn_start=20",
                     "--set", "final_eval_episodes=0", "--set", "device='cpu'", "--set", "num_threads=1"])
    assert code == 0
    resolved, why = describe_precision("auto", torch.device("cpu"))
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("madqn train: ") and f"precision {resolved} ({why})" in first
    assert f'precision = "{resolved}"' in (run_dir / "config.toml").read_text()
    summary = next(line for line in out.splitlines() if line.startswith(f"run {run_dir}:"))
    assert summary.endswith(", precision bf16") == (resolved == "bf16")  # the summary names a non-default precision
    with pytest.raises(SystemExit) as bad:
        cli.build_parser().parse_args(["train", "--precision", "fp16"])
    assert bad.value.code == 2 and "invalid choice: 'fp16'" in capsys.readouterr().err


class TwoGpuBox:
    """What torch.cuda reports on a machine with a Turing GPU (sm_75: bf16 only emulated) as cuda:0 and a
    Hopper GPU (sm_90: bf16 tensor cores) as cuda:1. This machine has no GPU, let alone two kinds; the
    functions torch's own ``is_bf16_supported`` reads are replaced, and it runs as it would there."""

    capability = {0: (7, 5), 1: (9, 0)}

    def __init__(self, monkeypatch, current):
        self.current = current
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_device_properties",
                            lambda d=None: type("Props", (), {"major": self.capability[self._index(d)][0]})())
        monkeypatch.setattr(cuda, "get_device_capability", lambda d=None: self.capability[self._index(d)])
        monkeypatch.setattr(cuda, "_check_bf16_tensor_supported", lambda d=None: True)  # emulation works
        monkeypatch.setattr(cuda, "device", self._device)
        monkeypatch.setattr(torch.version, "hip", None)

    def _index(self, d):
        if d is None:
            return self.current
        d = torch.device(d) if not isinstance(d, int) else d
        return d if isinstance(d, int) else (self.current if d.index is None else d.index)

    def _device(self, d):
        box = self

        class Selected:
            def __enter__(self):
                self.saved, box.current = box.current, box._index(d)

            def __exit__(self, *exc):
                box.current = self.saved

        return Selected()


@pytest.mark.parametrize("current", [0, 1])
def test_auto_precision_asks_the_learners_gpu_for_native_bf16_not_emulated(monkeypatch, current):
    """precision = "auto" picks bf16 only on a GPU with bf16 tensor cores, asked on the learner's device
    (not whichever device is current): on a Turing GPU bf16 is emulated, slower than fp32."""
    box = TwoGpuBox(monkeypatch, current)
    assert describe_precision("auto", torch.device("cuda:0"))[0] == "fp32"
    assert describe_precision("auto", torch.device("cuda:1")) == ("bf16", "auto: this GPU has bf16 tensor cores")
    assert describe_precision("auto", torch.device("cuda"))[0] == ("bf16" if current == 1 else "fp32")
    assert box.current == current  # the current device is left as it was


def test_auto_precision_on_a_cuda_device_without_cuda_is_fp32():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert describe_precision("auto", torch.device("cuda:1")) == ("fp32", "auto: no native bf16 on cuda")
