"""Learning curves from run directories: raw score per agent against agent steps, smoothed.

Each run directory gives its ``episodes.csv`` (the source of truth) and ``config.toml``. Runs whose
configs agree on everything except the seed (and bookkeeping keys such as ``device``, ``steps`` or
``prog_freq``, and keys without effect under the others, such as ``adam_eps`` with RMSProp) are one
*variant* (e.g. pong_v3 shared); a variant with several runs is drawn as the mean over its runs with
the min..max (or mean +- std) band shaded, on the agent-step range all its runs reached. One panel per
agent. Matplotlib's Agg canvas is used directly, so no display is needed and pyplot's global state is
untouched.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from madqn.config import Config, load_toml, make_config
from madqn.errors import ConfigError, MadqnError
from madqn.training.metrics import played_by_opponent

# Keys that do not change what is learned (or only how long): not part of a run's variant.
BOOKKEEPING_KEYS = frozenset({"seed", "device", "num_threads", "steps", "prog_freq", "save_freq", "save_replay",
                              "eval_freq", "eval_steps", "eval_ep", "eval_opponent", "valid_size", "video_freq",
                              "video_length", "final_eval_episodes", "final_eval_seconds"})
BANDS = ("minmax", "std")
# One colour per sharing mode in every plot (madqn plot, madqn compare), whatever the order of the runs;
# further variants of one sharing mode (other config keys) take the next free colours of the cycle.
SHARING_COLOURS = {"shared": "C0", "independent": "C1"}


@dataclass
class RunCurves:
    """The finished episodes of one run: per agent, (agent step at episode end, raw score) arrays."""

    run_dir: Path
    config: Config
    curves: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def variant(self) -> tuple:
        d = self.config.to_dict()
        ignored = BOOKKEEPING_KEYS | inert_keys(self.config)
        return tuple((k, repr(d[k])) for k in sorted(d) if k not in ignored)


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories among ``paths``; a folder without ``episodes.csv`` stands for the runs directly inside it."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise MadqnError(f"run directory not found: {p}")
        if (p / "episodes.csv").is_file():
            runs.append(p)
            continue
        inner = sorted(d for d in p.iterdir() if (d / "episodes.csv").is_file())
        if not inner:
            raise MadqnError(f"{p} is not a run directory (no episodes.csv) and holds none")
        runs.extend(inner)
    return runs


def load_run(run_dir: str | Path, source: str = "episodes") -> RunCurves:
    """A run's curves: ``source = "episodes"`` the training episodes (``episodes.csv``), ``"eval"`` the
    periodic evaluations (``eval.csv``: each seat's mean evaluation score at each evaluation step)."""
    run_dir = Path(run_dir)
    if source not in ("episodes", "eval"):
        raise MadqnError(f"source must be 'episodes' or 'eval', got {source!r}")
    if not (run_dir / "config.toml").is_file():
        raise MadqnError(f"{run_dir} has no config.toml: not a madqn run directory")
    try:
        config = make_config(None, load_toml(run_dir / "config.toml"))
    except ConfigError as e:
        raise MadqnError(f"{run_dir}: {e}") from None
    steps: dict[str, list[int]] = {}
    scores: dict[str, list[float]] = {}
    name, agent_key, score_key = ("episodes.csv", "agent", "score") if source == "episodes" else ("eval.csv", "seat", "mean")
    try:
        with open(run_dir / name, newline="") as f:
            for row in csv.DictReader(f):
                if source == "eval" and int(row["episodes"]) == 0:
                    continue  # no episode completed within the evaluation budget
                if source == "episodes" and played_by_opponent(row):
                    continue  # a seat played at random or by a pool snapshot that episode: not the network's score
                steps.setdefault(row[agent_key], []).append(int(row["step"]))
                scores.setdefault(row[agent_key], []).append(float(row[score_key]))
    except FileNotFoundError:
        raise MadqnError(f"{run_dir} has no {name}") from None
    except (KeyError, ValueError, TypeError) as e:
        raise MadqnError(f"{run_dir / name} is malformed ({type(e).__name__}: {e})") from None
    curves = {a: (np.asarray(steps[a], np.int64), np.asarray(scores[a], np.float64)) for a in steps}
    return RunCurves(run_dir, config, curves)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start): point i averages values[max(0, i-w+1)..i]."""
    values = np.asarray(values, np.float64)
    if window <= 1 or values.size == 0:
        return values.copy()
    csum = np.concatenate([[0.0], np.cumsum(values)])
    i = np.arange(1, values.size + 1)
    lo = np.maximum(0, i - window)
    return (csum[i] - csum[lo]) / (i - lo)


def inert_keys(config: Config) -> set[str]:
    """Keys whose value has no effect under ``config``'s other settings: not part of its variant."""
    inert = set()
    if config.optimizer != "adam":
        inert.add("adam_eps")
    if config.lr == config.lr_end:
        inert.add("lr_endt")  # no anneal
    if config.backend == "local":  # the actor-process keys
        inert |= {"actors", "ray_address", "sync_every", "rollout_len", "max_in_flight", "update_ratio",
                  "actor_epsilons", "apex_eps", "apex_alpha"}
    return inert


def group_variants(runs: Sequence[RunCurves]) -> list[tuple[str, list[RunCurves]]]:
    """Runs grouped by variant, in order of first appearance, each labelled ``env sharing`` (plus the
    config keys that tell apart variants sharing env and sharing) and its run count."""
    groups: dict[tuple, list[RunCurves]] = {}
    for r in runs:
        groups.setdefault(r.variant, []).append(r)
    labels = []
    variants = list(groups)
    for key in variants:
        c = groups[key][0].config
        label = f"{c.env} {c.sharing}"
        twins = [k for k in variants if k != key and dict(k)["env"] == dict(key)["env"]
                 and dict(k)["sharing"] == dict(key)["sharing"]]
        if twins:
            differing = sorted({name for t in twins for (name, v) in key if dict(t).get(name) != v})
            label += " " + " ".join(f"{n}={getattr(c, n)}" for n in differing)
        n = len(groups[key])
        label += f" ({n} seeds)" if n > 1 else f" (seed {c.seed})"
        labels.append(label)
    return list(zip(labels, groups.values()))


def variant_colours(variants: Sequence[tuple[str, list[RunCurves]]]) -> list[str]:
    """Matplotlib colours for ``group_variants``' variants: the first variant of each sharing mode gets
    that mode's colour (``SHARING_COLOURS``), every other variant the next colour not yet used."""
    spare = [f"C{i}" for i in range(10) if f"C{i}" not in SHARING_COLOURS.values()]
    colours: list[str] = []
    for _, members in variants:
        colour = SHARING_COLOURS.get(members[0].config.sharing)
        if colour is None or colour in colours:
            colour = spare[sum(c in spare for c in colours) % len(spare)]
        colours.append(colour)
    return colours


def plot_learning_curves(runs: Sequence[str | Path | RunCurves], out_path: str | Path, *, window: int = 10,
                         size: tuple[int, int] = (1200, 450), dpi: int = 100, band: str = "minmax",
                         title: str | None = None, ylabel: str | None = None) -> Path:
    """Write ``learning_curves_figure(...)`` to ``out_path`` (.png, .svg or .pdf) at exactly ``size`` pixels."""
    out_path = Path(out_path)
    if out_path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise MadqnError(f"plot file {out_path} must end in .png, .svg or .pdf")
    fig = learning_curves_figure(runs, window=window, size=size, dpi=dpi, band=band, title=title, ylabel=ylabel)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=dpi)
    return out_path


def learning_curves_figure(runs: Sequence[str | Path | RunCurves], *, window: int = 10,
                           size: tuple[int, int] = (1200, 450), dpi: int = 100, band: str = "minmax",
                           title: str | None = None, ylabel: str | None = None):
    """A matplotlib Figure of ``size`` = (width, height) pixels, one panel per agent: score vs agent steps.

    Each variant is one colour (``variant_colours``: shared and independent always the same two): a single run as its raw scores (faint) and their ``window``-episode
    trailing mean; several runs as the mean of their smoothed curves on 200 points of the common
    step range with the ``band`` ("minmax" or "std") shaded.
    """
    from matplotlib.figure import Figure

    if band not in BANDS:
        raise MadqnError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    if window < 1:
        raise MadqnError(f"the smoothing window must be >= 1 episode, got {window}")
    width, height = (int(v) for v in size)
    if width < 100 or height < 100:
        raise MadqnError(f"plot size must be at least 100x100 pixels, got {width}x{height}")
    loaded = [r if isinstance(r, RunCurves) else load_run(r) for r in runs]
    if not loaded:
        raise MadqnError("no runs to plot")
    agents: list[str] = []
    for r in loaded:
        agents += [a for a in r.curves if a not in agents]
    if not agents:
        raise MadqnError("no finished episodes yet in " + ", ".join(str(r.run_dir) for r in loaded))

    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    axes = fig.subplots(1, len(agents), squeeze=False, sharey=True)[0]
    variants = group_variants(loaded)
    colours = variant_colours(variants)
    for ax, agent in zip(axes, agents):
        for (label, members), colour in zip(variants, colours):
            _draw_variant(ax, [m.curves[agent] for m in members if agent in m.curves], label, colour, window, band)
        ax.set_title(agent)
        ax.set_xlabel("agent steps")
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    axes[0].set_ylabel(ylabel or (f"score (raw, {window}-episode mean)" if window > 1 else "score (raw)"))
    # below the panels, one variant per line: long labels (variants told apart by several keys) take the
    # figure's width instead of squeezing the panels
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


def _draw_variant(ax, curves: list[tuple[np.ndarray, np.ndarray]], label: str, colour: str, window: int,
                  band: str) -> None:
    if not curves:
        return
    marker = "o" if max(len(s) for s, _ in curves) == 1 else None
    if len(curves) == 1:
        steps, scores = curves[0]
        if window > 1:
            ax.plot(steps, scores, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(steps, smooth(scores, window), color=colour, label=label, marker=marker)
        return
    lo = max(int(s[0]) for s, _ in curves)
    hi = min(int(s[-1]) for s, _ in curves)
    if lo >= hi:  # the runs share no step range: draw them one by one
        for i, (steps, scores) in enumerate(curves):
            ax.plot(steps, smooth(scores, window), color=colour, label=label if i == 0 else None, marker=marker)
        return
    grid = np.linspace(lo, hi, 200)
    ys = np.stack([np.interp(grid, steps, smooth(scores, window)) for steps, scores in curves])
    mean = ys.mean(0)
    low, high = (ys.min(0), ys.max(0)) if band == "minmax" else (mean - ys.std(0), mean + ys.std(0))
    ax.fill_between(grid, low, high, color=colour, alpha=0.2, linewidth=0)
    ax.plot(grid, mean, color=colour, label=label)
