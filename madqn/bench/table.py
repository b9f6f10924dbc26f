"""The table ``madqn bench`` prints: a :class:`Row` per figure, the noise verdict, the machine."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

NOISY_SPREAD = 0.3  # (max - min) / median of a row's per-round ratios above which it is not reported


@dataclass
class Row:
    name: str
    value: float
    unit: str
    limit: float | None = None  # the limit / baseline measured in the same run (same unit)
    target: str = ""  # e.g. ">= 0.8" on value/limit, or "<= 7200" on value
    passed: bool | None = None
    note: str = ""
    spread: float | None = None  # (max - min) / median of the per-round ratios (or values, without a limit)
    inconsistent: bool = False  # contradicts other rows of the same window (end-to-end above its bound)
    round_ratio: float | None = None  # median over rounds of value / limit measured in the same round

    @property
    def ratio(self) -> float | None:
        if self.round_ratio is not None:
            return self.round_ratio
        return None if not self.limit else self.value / self.limit

    @property
    def noisy(self) -> bool:
        return self.inconsistent or (self.spread is not None and self.spread > NOISY_SPREAD)


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def verdict(rows: list[Row]) -> str:
    """One line over the table: were the repeats steady enough for the ratios to mean anything?"""
    timed = [r for r in rows if r.spread is not None]
    noisy = [r for r in timed if r.noisy]
    if not noisy:
        worst = max((r.spread for r in timed), default=0.0)
        return (f"Repeats agreed: every timed row's per-round ratio within {100 * worst:.0f}% between rounds "
                f"(threshold {100 * NOISY_SPREAD:.0f}%), so the ratios are comparable.")
    contradictions = sum(r.inconsistent for r in noisy)
    extra = f"; {contradictions} end-to-end run(s) beat the bound of the component rows" if contradictions else ""
    return (f"The machine was too noisy for {len(noisy)} of {len(timed)} timed rows: their per-round ratios differed "
            f"by more than {100 * NOISY_SPREAD:.0f}%{extra}. Those rows say 'noisy' instead of a ratio; rerun on a "
            "quieter machine.")


def format_table(rows: list[Row]) -> str:
    header = ["row", "measured", "unit", "limit (same run)", "ratio", "target", "result", "note"]
    lines = [verdict(rows), "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if r.noisy:
            ratio = ""
            result = "noisy" + (" (above bound)" if r.inconsistent else f" ({100 * r.spread:.0f}%)")
        else:
            ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
            result = "" if r.passed is None else ("pass" if r.passed else "MISS")
        lines.append("| " + " | ".join([r.name, _fmt(r.value), r.unit, _fmt(r.limit), ratio, r.target, result,
                                        r.note]) + " |")
    return "\n".join(lines)


def machine_description(device: str) -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = (f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}, {platform.system()} {platform.release()}")
    if device.startswith("cuda"):
        text += f", GPU {torch.cuda.get_device_name(torch.device(device))}"
    try:
        text += f", load average {os.getloadavg()[0]:.1f} at start"
    except OSError:
        pass
    return text
