"""Timing: probes (functions returning a rate) interleaved round by round in one window, and rows made
from the per-round ratios."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from madqn.bench.table import Row


@dataclass
class Timings:
    """Each probe's rate in every round of one measurement window."""

    rates: dict[str, list[float]]

    def median(self, key: str) -> float:
        return statistics.median(self.rates[key])

    __getitem__ = median  # timings["probe"]: its median rate

    def per_round(self, fn: Callable[[dict[str, float]], float]) -> list[float]:
        """``fn`` of each round's rates (a ratio of two probes, a bound from several)."""
        rounds = len(next(iter(self.rates.values())))
        return [fn({k: v[i] for k, v in self.rates.items()}) for i in range(rounds)]


def spread(values: list[float]) -> float:
    """(max - min) / median: how much the rounds disagreed."""
    return (max(values) - min(values)) / statistics.median(values)


def interleaved(fns: dict[str, Callable[[], float]], repeats: int) -> Timings:
    """Every rate function once per round, ``repeats`` rounds, the order reversed every other round."""
    results: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in (names if r % 2 == 0 else names[::-1]):
            results[k].append(fns[k]())
    return Timings(results)


def rate(fn: Callable[[], None], n: int, sync: Callable[[], None] = lambda: None) -> float:
    """Calls per second of ``fn`` over ``n`` calls (``sync`` waits for queued device work)."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return n / (time.perf_counter() - start)


def compared(t: Timings, name: str, value: str, limit: str, unit: str, *, target: str = "",
             check: Callable[[float], bool] | None = None, note: str = "", per: float = 1.0,
             inverse: bool = False) -> Row:
    """A row of probe ``value`` next to probe ``limit``: medians x ``per`` (``inverse``: 1000 / rate, in ms),
    the ratio per round and its median; ``check`` judges that median ratio."""
    conv = (lambda x: 1e3 / x) if inverse else (lambda x: x * per)
    ratios = t.per_round(lambda r: conv(r[value]) / conv(r[limit]))
    ratio = statistics.median(ratios)
    return Row(name, conv(t.median(value)), unit, conv(t.median(limit)), target,
               None if check is None else check(ratio), note, spread(ratios), round_ratio=ratio)


@dataclass
class Section:
    """Probes timed in the shared window, and the rows made from their medians once the window is over."""

    probes: dict[str, Callable[[], float]]
    rows: Callable[[Timings], list[Row]]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            c()


def _sync(device: str) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)


def _threads() -> int:
    return torch.get_num_threads()
