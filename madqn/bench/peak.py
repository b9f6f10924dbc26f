"""Peak arithmetic: a large fp32 and a large bf16 matmul, what the core can do at best."""

from __future__ import annotations

from typing import Callable

import torch

from madqn.bench.measure import Section, Timings, _sync, compared, rate
from madqn.bench.table import Row


def peak_section(device: str, size: int, n: int) -> Section:
    """FLOP/s of a ``size`` x ``size`` x ``size`` matmul in fp32 and in bf16: what the core can do at best."""
    sync = _sync(device)
    g = torch.Generator().manual_seed(0)
    a32, b32 = (torch.rand(size, size, generator=g).to(device) for _ in range(2))
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    flop = 2.0 * size**3

    def probe(a, b) -> Callable[[], float]:
        return lambda: flop * rate(lambda: torch.mm(a, b), n, sync)

    def rows(t: Timings) -> list[Row]:
        return [compared(t, f"peak [{device}]: bf16 matmul {size}^3", f"peak[{device}]/bf16", f"peak[{device}]/fp32",
                         "GFLOP/s", per=1e-9, note="limit: the same matmul in fp32")]

    return Section({f"peak[{device}]/fp32": probe(a32, b32), f"peak[{device}]/bf16": probe(a16, b16)}, rows)


def peak_gflops(t: Timings, device: str, precision: str) -> float:
    return t.median(f"peak[{device}]/{precision}") * 1e-9
