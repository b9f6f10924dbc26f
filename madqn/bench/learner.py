"""Learner rows: ``LearnerSet.learn`` in fp32 and bf16 against a bare PyTorch update of the same network,
its achieved GFLOP/s against the matmul peak, and the bare update in bf16 and channels_last."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from madqn.bench.measure import Section, Timings, _sync, _threads, compared, rate
from madqn.bench.peak import peak_gflops
from madqn.bench.table import Row
from madqn.config import make_config
from madqn.core.learner import cuda_fp32_precision
from madqn.training.trainer import Trainer


def _filled_trainer(sharing: str, device: str, precision: str = "fp32", n_fill: int = 2_000, compile: bool = False,
                    cuda_graph: bool = False):
    """A Trainer on pong_v3 whose replay holds ``n_fill`` real steps (random play); ``compile``: its learners
    compiled (``compile = true``); ``cuda_graph``: its updates captured in CUDA graphs, the replay frames on
    the GPU (``cuda_graph = true``, ``replay_device = "learner"``)."""
    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "replay_memory": 10_000,
                             "learn_start": 10**9, "steps": 10**9, "vector_env": "inline", "seed": 0,
                             "precision": precision, "num_threads": _threads(), "compile": compile,
                             "cuda_graph": cuda_graph, "replay_device": "learner" if cuda_graph else "host"})
    trainer = Trainer(cfg)
    while trainer.step < n_fill:
        trainer.env_step()
    return trainer


def bare_update(network, device, batch: int = 32, precision: str = "fp32", channels_last: bool = False,
                compiled: bool = False, graphed: bool = False):
    """The limit: a textbook PyTorch DQN update of ``network`` (float input already on the device);
    ``precision = "bf16"``: its forwards under bf16 autocast; ``channels_last``: weights and input NHWC;
    ``compiled``: the forwards and loss (with their backward) and the optimizer step each compiled by
    ``torch.compile``, the overhead-free reference for madqn's ``compile = true``; ``graphed`` (CUDA): the whole
    update captured in one CUDA graph and replayed, the overhead-free reference on a GPU."""
    online = copy.deepcopy(network).to(device)
    target = copy.deepcopy(network).to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    online.to(memory_format=fmt)
    target.to(memory_format=fmt)
    opt = torch.optim.RMSprop(online.parameters(), lr=2.5e-4, alpha=0.95, eps=0.01, centered=True,
                              capturable=graphed)
    g = torch.Generator().manual_seed(0)
    shape = (batch, online.hist_len, online.frame_size, online.frame_size)
    s = (torch.rand(shape, generator=g) * 255).to(device).contiguous(memory_format=fmt)
    s2 = (torch.rand(shape, generator=g) * 255).to(device).contiguous(memory_format=fmt)
    a = torch.randint(0, online.n_actions, (batch,), generator=g).to(device)
    r = torch.rand(batch, generator=g).to(device)
    term = torch.zeros(batch, device=device)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16",
                              cache_enabled=not graphed)
    on_cuda = torch.device(device).type == "cuda"

    def loss_fn():
        with autocast:
            with torch.no_grad():
                y = r + 0.99 * (1 - term) * target(s2).max(1).values.float()
            q = online(s).gather(1, a[:, None]).squeeze(1).float()
        return F.smooth_l1_loss(q, y, reduction="sum")

    step = opt.step
    if compiled:
        loss_fn, step = torch.compile(loss_fn), torch.compile(opt.step)

    def update() -> None:
        # on CUDA the same fp32 arithmetic as the Learner's: IEEE for fp32, TF32 beside bf16 autocast
        with cuda_fp32_precision("tf32" if precision == "bf16" else "ieee") if on_cuda else contextlib.nullcontext():
            loss = loss_fn()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            step()

    if graphed:  # CUDA's recipe: warm up on a side stream, then capture one update
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                update()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            update()
        return graph.replay
    return update


def update_flops(learner, batch: int = 32) -> float:
    """FLOPs of one ``Learner.update`` on a batch of ``batch``, counted by PyTorch from the layer shapes
    (every matmul and convolution of the target forward, the online forward and the backward)."""
    net = learner.online_network
    learner = copy.deepcopy(learner)  # the update below must not move the benchmarked weights
    shape = (batch, net.hist_len, net.frame_size, net.frame_size)
    frames = torch.zeros(shape, dtype=torch.uint8, device=learner.device)
    zeros = torch.zeros(batch, device=learner.device)
    ids = torch.zeros(batch, dtype=torch.long, device=learner.device)
    with FlopCounterMode(display=False) as counter:
        learner.update(frames, ids, zeros, frames, zeros, agent_ids=ids)
    return float(counter.get_total_flops())


def learner_section(device: str, n: int) -> Section:
    """LearnerSet.learn in fp32 and bf16, and the bare PyTorch update in fp32 / bf16 / channels_last, one learner."""
    sync = _sync(device)
    trainers = {p: _filled_trainer("independent", device, p) for p in ("fp32", "bf16")}
    trainers["bf16-compiled"] = _filled_trainer("independent", device, "bf16", compile=True)
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        for p in ("fp32", "bf16"):
            trainers[f"{p}-graph"] = _filled_trainer("independent", device, p, cuda_graph=True)
    network = trainers["fp32"].groups[0].learner.online_network
    flops = update_flops(trainers["fp32"].groups[0].learner)
    key = f"learner[{device}]"
    probes = {}
    for precision in ("fp32", "bf16"):
        for cl in (False, True):
            bare = bare_update(network, device, precision=precision, channels_last=cl)
            probes[f"{key}/bare-{precision}{'-cl' if cl else ''}"] = lambda bare=bare: rate(bare, n, sync)
    bare = bare_update(network, device, precision="bf16", channels_last=device == "cpu", compiled=True)
    probes[f"{key}/bare-bf16-compiled"] = lambda bare=bare: rate(bare, n, sync)
    if on_cuda:
        for p in ("fp32", "bf16"):
            bare = bare_update(network, device, precision=p, graphed=True)
            probes[f"{key}/bare-{p}-graph"] = lambda bare=bare: rate(bare, n, sync)
    for variant, t in trainers.items():
        probes[f"{key}/madqn-{variant}"] = lambda t=t: rate(
            lambda: t.learners.learn(t.step, groups=t.groups[:1]), n, sync)  # one learner's round
    for k in (f"{key}/bare-bf16-compiled", f"{key}/madqn-bf16-compiled") + \
            ((f"{key}/madqn-fp32-graph", f"{key}/madqn-bf16-graph") if on_cuda else ()):
        probes[k]()  # compile and capture before the window: the first calls take tens of seconds
    replay = trainers["fp32"].groups[0].replay
    sample_ms = 1e3 / rate(lambda: replay.sample(32), 200) if device == "cpu" else None
    threads = _threads()

    def rows(t: Timings) -> list[Row]:
        return learner_rows(t, device, flops, threads, sample_ms) + (graph_rows(t, device) if on_cuda else [])

    return Section(probes, rows, [t.close for t in trainers.values()])


def learner_rows(t: Timings, device: str, flops: float, threads: int, sample_ms: float | None = None) -> list[Row]:
    """LearnerSet.learn per precision against the bare fp32 update, the achieved GFLOP/s against the matmul
    peak of the same precision (``flops`` per update), and the bare update in bf16 and channels_last."""
    key = f"learner[{device}]"
    out = [compared(t, f"learner [{device}]: LearnerSet.learn fp32 (sample, convert, DQN3.0 update)",
                    f"{key}/madqn-fp32", f"{key}/bare-fp32", "updates/s", target=">= 0.95 x limit",
                    check=lambda ratio: ratio >= 0.95,
                    note=f"limit: bare PyTorch fp32 update, same net, batch 32, {threads} threads"),
           compared(t, f"learner [{device}]: LearnerSet.learn bf16 (precision = \"bf16\")",
                    f"{key}/madqn-bf16", f"{key}/bare-fp32", "updates/s",
                    note="limit: the same bare PyTorch fp32 update")]
    for precision in ("fp32", "bf16"):
        peak = f"peak[{device}]/{precision}"
        row = compared(t, f"learner [{device}]: achieved arithmetic, {precision}", f"{key}/madqn-{precision}", peak,
                       "GFLOP/s", target=">= 0.5 x limit" if precision == "bf16" else "",
                       check=(lambda ratio: ratio >= 0.5) if precision == "bf16" else None,
                       note=f"{flops / 1e9:.2f} GFLOP per update x updates/s; limit: the {precision} matmul peak")
        row.value, row.limit = t.median(f"{key}/madqn-{precision}") * flops * 1e-9, peak_gflops(t, device, precision)
        row.round_ratio *= flops  # updates/s x FLOP per update over FLOP/s
        out.append(row)
    out += [compared(t, f"learner [{device}]: bare update, bf16 autocast", f"{key}/bare-bf16", f"{key}/bare-fp32",
                     "updates/s", note="limit: the bare fp32 update"),
            compared(t, f"learner [{device}]: bare update, fp32 channels_last", f"{key}/bare-fp32-cl",
                     f"{key}/bare-fp32", "updates/s", note="limit: the bare fp32 update (NCHW)"),
            compared(t, f"learner [{device}]: bare update, bf16 channels_last", f"{key}/bare-bf16-cl",
                     f"{key}/bare-bf16", "updates/s", note="limit: the bare bf16 update (NCHW)"),
            compared(t, f"learner [{device}]: LearnerSet.learn bf16, compile = true", f"{key}/madqn-bf16-compiled",
                     f"{key}/bare-bf16-compiled", "updates/s", target=">= 0.9 x limit",
                     check=lambda ratio: ratio >= 0.9,
                     note="limit: the bare bf16 update compiled (torch.compile: forwards, loss, backward, optimizer)"),
            compared(t, f"learner [{device}]: LearnerSet.learn bf16, compiled vs eager", f"{key}/madqn-bf16-compiled",
                     f"{key}/madqn-bf16", "updates/s", note="limit: the same learner, eager (compile = false)")]
    if sample_ms is not None:
        share = 100 * sample_ms * t.median(f"{key}/madqn-fp32") / 1e3
        out.append(Row("replay: sample(32) (one gather of 32x5 frames)", sample_ms, "ms",
                       note=f"{share:.1f}% of an fp32 update"))
    return out


def graph_rows(t: Timings, device: str) -> list[Row]:
    """CUDA: LearnerSet.learn with its update captured in a CUDA graph and the replay frames on the GPU,
    against the bare update captured the same way (the overhead-free reference) and against the target."""
    key = f"learner[{device}]"
    out = []
    for p in ("fp32", "bf16"):
        out.append(compared(t, f"learner [{device}]: LearnerSet.learn {p}, cuda_graph + replay on the GPU",
                            f"{key}/madqn-{p}-graph", f"{key}/bare-{p}-graph", "updates/s",
                            target=">= 0.5 x limit, >= 2000 updates/s",
                            check=lambda ratio, p=p: ratio >= 0.5 and t.median(f"{key}/madqn-{p}-graph") >= 2000,
                            note=f"limit: the bare {p} update captured in one CUDA graph"))
        out.append(compared(t, f"learner [{device}]: LearnerSet.learn {p}, captured vs eager",
                            f"{key}/madqn-{p}-graph", f"{key}/madqn-{p}", "updates/s",
                            note="limit: the same learner, eager, replay on the host"))
    return out
