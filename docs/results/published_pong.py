"""madqn's single-agent Pong curve against Dopamine's published DQN curves, at equal frames.

    python docs/results/published_pong.py [[LABEL=]EPISODES_CSV ...] [--out docs/results/pong_single_vs_dopamine.png]

Dopamine's baselines (github.com/google/dopamine, baselines/atari/data/pong.json, 5 runs per agent;
extracted to dopamine_pong_dqn.csv) give, per iteration of 250,000 agent steps (1M frames), the mean
return of the training episodes that ended in it. The same number is computed here from madqn's
`episodes.csv` (score of every training episode, by the agent step at which it ended), so both curves are
training returns per 1M frames. Prints a markdown table (per iteration: each madqn run; each Dopamine
agent's lowest, mean and highest run) and draws the curves with the Dopamine runs' range shaded. Without
arguments it reads the two committed runs (configs/pong_single_fast.toml and configs/pong_single_dopamine.toml).
"""
from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT_STEPS_PER_ITERATION = 250_000


def madqn_curve(path):
    """Mean training-episode score per iteration (episodes counted in the iteration in which they ended)."""
    scores = collections.defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            scores[int(row["step"]) // AGENT_STEPS_PER_ITERATION].append(float(row["score"]))
    last = max(scores)
    complete = {i: v for i, v in scores.items() if i < last}  # the last iteration is still running
    return {i: sum(v) / len(v) for i, v in sorted(complete.items())}, {i: len(v) for i, v in complete.items()}


def dopamine_curves(path=HERE / "dopamine_pong_dqn.csv"):
    """agent -> iteration -> list of the runs' values."""
    curves = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            curves[row["agent"]][int(row["iteration"])].append(float(row["training_return"]))
    return curves


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("episodes", nargs="*", help="LABEL=PATH or PATH (labelled by its folder) of an episodes.csv",
                        default=[f"configs/pong_single_fast.toml={HERE / 'pong_single' / 'episodes.csv'}",
                                 f"configs/pong_single_dopamine.toml={HERE / 'pong_single_dopamine' / 'episodes.csv'}"])
    parser.add_argument("--out", default=str(HERE / "pong_single_vs_dopamine.png"))
    args = parser.parse_args()
    runs = {}
    for spec in args.episodes:
        label, _, path = spec.rpartition("=")
        runs[label or Path(path).parent.name] = madqn_curve(path)
    published = dopamine_curves()
    names = list(published)
    iterations = sorted({i for ours, _ in runs.values() for i in ours})
    print("| iteration (frames) | " + " | ".join(f"madqn {label} (episodes)" for label in runs) + " | "
          + " | ".join(f"Dopamine {n}: lowest / mean / highest of 5 runs" for n in names) + " |")
    print("|---" * (1 + len(runs) + len(names)) + "|")
    for i in iterations:
        cells = [f"{ours[i]:.1f} ({counts[i]})" if i in ours else "" for ours, counts in runs.values()]
        for n in names:
            values = published[n][i]
            cells.append(f"{min(values):.1f} / {sum(values) / len(values):.1f} / {max(values):.1f}")
        print(f"| {i} ({i}M-{i + 1}M) | " + " | ".join(cells) + " |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon = max(iterations) + 4
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for n, colour in zip(names, ["tab:blue", "tab:green"]):
        its = list(range(horizon + 1))
        lo = [min(published[n][i]) for i in its]
        hi = [max(published[n][i]) for i in its]
        mean = [sum(published[n][i]) / len(published[n][i]) for i in its]
        x = [i + 0.5 for i in its]
        ax.fill_between(x, lo, hi, color=colour, alpha=0.2, label=f"Dopamine {n}: range of 5 runs")
        ax.plot(x, mean, color=colour, lw=1)
    for (label, (ours, _)), colour in zip(runs.items(), ["tab:red", "tab:purple", "tab:orange", "tab:brown"]):
        ax.plot([i + 0.5 for i in ours], list(ours.values()), "o-", color=colour, lw=2,
                label=f"madqn, {label} (seed 1)")
    ax.set_xlabel("frames (millions; 4 per agent step)")
    ax.set_ylabel("mean training-episode return")
    ax.set_title("ALE Pong, single agent: training returns per 1M frames")
    ax.set_ylim(-21.5, 21.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
