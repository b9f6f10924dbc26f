"""The games table of docs/results.md and the README: every game and sharing mode tried, per seat, from the
committed 30-game evaluations against random players, with the aggregate over games.

    python docs/results/games_table.py            # prints the markdown table and the aggregate line

Each entry names the evaluation file (`madqn eval MODEL --opponent random --out ...`: the network in each seat
against random players, and random against random on the same episode seeds) and the run whose train.csv gives
the updates and wall time at the evaluated step. Scores are normalised per game so that 0 is the random
player's score in that seat on the same episodes and 1 adds the multiplayer-ALE paper's 50M-step gain over
random (madqn.evaluation.aggregate.REFERENCES); the aggregate is the interquartile mean over games, each game
a task and each (seed, seat) one run, with a 95% stratified-bootstrap interval (rliable's statistic).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from madqn.evaluation.aggregate import REFERENCES, aggregate, normalized

HERE = Path(__file__).resolve().parent

# (game, sharing, evaluation JSON, run directory with train.csv, evaluated agent step, preset, machine)
ENTRIES = [
    ("pong_v3", "shared", "pong_v3_shared_rmsprop/eval_random_1100k.json", "pong_v3_shared_rmsprop", 1_100_000,
     "pong_fast.toml", "2-core AMD EPYC, 1 core"),
    ("pong_v3", "independent", "pong_v3_independent_rmsprop/eval_random_1500k.json", "pong_v3_independent_rmsprop",
     1_500_000, "pong_fast_independent.toml", "2-core AMD EPYC, 1 core"),
    ("boxing_v2", "shared", "boxing_v2_shared/eval_random_700k.json", "boxing_v2_shared", 700_000,
     "boxing_fast.toml", "2-core AMD EPYC, 1 core"),
    ("boxing_v2", "independent", "boxing_v2_independent/eval_random_800k.json", "boxing_v2_independent", 800_000,
     "boxing_fast_independent.toml", "2-core AMD EPYC, 1 core"),
    ("pong_v3", "shared", "pong_v3_shared_warmup_s1/eval_random_310k.json", "pong_v3_shared_warmup_s1", 310_000,
     "pong_efficient.toml` seed 1, `--backend local", "2-core AMD EPYC, 1 core"),
    ("pong_v3", "shared", "pong_v3_shared_warmup_s2/eval_random_310k.json", "pong_v3_shared_warmup_s2", 310_000,
     "pong_efficient.toml` seed 2, `--backend local", "2-core AMD EPYC, 1 core"),
    ("pong_v3", "independent", "pong_v3_independent_efficient_s1/eval_random_250k.json",
     "pong_v3_independent_efficient_s1", 250_000, "pong_efficient_independent.toml` seed 1, `--backend local",
     "2-core AMD EPYC, 1 core"),
]


def at_step(run: str, step: int) -> tuple[int, float]:
    """(updates summed over the run's learners, wall-clock hours) at the train.csv report nearest ``step``."""
    with open(HERE / run / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    nearest = min({int(r["step"]) for r in rows}, key=lambda s: abs(s - step))
    at = [r for r in rows if int(r["step"]) == nearest]
    return max(int(r["updates"]) for r in at), float(at[0]["wall_time"]) / 3600


def seat_lines(path: str) -> dict[str, tuple[dict, dict]]:
    """seat -> (the network's line, the random baseline's line) of an evaluation JSON."""
    lines = json.loads((HERE / path).read_text())["lines"]
    out = {}
    for line in lines:
        if line.get("baseline"):
            continue
        (base,) = [b for b in lines if b.get("baseline") and b["seat"] == line["seat"]]
        out[line["seat"]] = (line, base)
    return out


def main() -> None:
    print("| game | sharing | seat | vs random (30 games, 95% CI) | random vs random | paper, 50M agent steps | "
          "normalised | agent steps | updates per learner | wall time | preset, machine |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    tasks: dict[str, list[float]] = {}
    for game, sharing, path, run, step, preset, machine in ENTRIES:
        updates, hours = at_step(run, step)
        for seat, (line, base) in seat_lines(path).items():
            score = normalized(game, line["mean"], base["mean"])
            tasks.setdefault(game, []).append(score)
            ref = REFERENCES[game]
            print(f"| {game} | {sharing} | {seat} | {line['mean']:+.1f} ± {line['half_width']:.1f} | "
                  f"{base['mean']:+.1f} | {ref.paper:g} (random {ref.random:g}) | {score:.2f} | {step:,} | "
                  f"{updates:,} | {hours:.1f} h | `configs/{preset}`, {machine} |")
    agg = aggregate(tasks)
    print(f"\nAggregate over {agg.tasks} games ({agg.runs} seat-runs: every preset and seed in the table): IQM of the normalised scores "
          f"{agg.iqm:.2f}, 95% stratified-bootstrap interval [{agg.low:.2f}, {agg.high:.2f}] "
          f"(1.00 = the paper's Ape-X DQN at 50M agent steps)")


if __name__ == "__main__":
    main()
