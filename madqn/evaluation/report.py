"""The report directory of ``madqn compare``: report.md, results.json, raw CSV files and PNG plots.

Everything here formats numbers computed by ``madqn.evaluation.compare.build_results`` from the raw rows
(``episodes.csv``) and the runs' files; nothing is computed twice. Intervals are shown as
``mean ± half-width`` of the Student-t 95% confidence interval.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from madqn.config import _toml_value
from madqn.evaluation.plot import load_run, plot_learning_curves
from madqn.evaluation.protocol import ROW_FIELDS
from madqn.training.checkpoint import atomic_write_text


def fmt(summary: dict[str, Any] | None, digits: int = 2) -> str:
    """``mean ± half_width`` of a ``Summary.to_dict()`` (``mean`` alone for n = 1, ``-`` for none)."""
    if summary is None or summary["n"] == 0:
        return "-"
    if summary["n"] < 2 or not math.isfinite(summary["half_width"]):
        return f"{summary['mean']:.{digits}f}"
    return f"{summary['mean']:.{digits}f} ± {summary['half_width']:.{digits}f}"


def fmt_record(rec: dict[str, Any] | None) -> str:
    """``W/D/L (win% / draw% / loss%)``."""
    if rec is None or rec["games"] == 0:
        return "-"
    return (f"{rec['wins']}/{rec['draws']}/{rec['losses']} "
            f"({100 * rec['win_rate']:.0f}% / {100 * rec['draw_rate']:.0f}% / {100 * rec['loss_rate']:.0f}%)")


def fmt_duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_count(x: float) -> str:
    return f"{x:,.0f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


# ---- the files -----------------------------------------------------------------------------------

def write_report(out: Path, results: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Path]:
    """Write every artefact into ``out``; returns name -> path."""
    out = Path(out)
    files = {"episodes": out / "episodes.csv", "results": out / "results.json", "runs": out / "runs.csv",
             "ratings": out / "ratings.csv", "curves": out / "curves.csv", "report": out / "report.md"}
    _write_csv(files["episodes"], ROW_FIELDS, rows)
    atomic_write_text(files["results"], json.dumps(results, indent=1, default=_json_default) + "\n")
    _write_csv(files["runs"], *_runs_table(results))
    _write_csv(files["ratings"], ["player", "rating", "se", "games", "score"], results["ratings"])
    curve_rows = _curve_rows(results)
    _write_csv(files["curves"], ["run", "variant", "seed", "step", "seat", "opponent", "episodes", "mean", "std",
                                 "ci_low", "ci_high"], curve_rows)
    files.update(_plots(out, results, bool(curve_rows)))
    atomic_write_text(files["report"], markdown(results, files))
    return files


def _json_default(x: Any) -> Any:
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def _runs_table(results: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    seats = results["seats"]
    fields = ["run", "variant", "seed", "steps", "episodes", "updates", "samples", "wall_time", "best_step",
              "best_score"]
    for seat in seats:
        fields += [f"vs_random_{seat}_mean", f"vs_random_{seat}_ci_low", f"vs_random_{seat}_ci_high",
                   f"vs_random_{seat}_episodes"]
    fields += ["vs_random_mean", "rating", "rating_se"]
    out = []
    for r in results["runs"]:
        row = {"run": r["name"], "variant": r["variant"], "seed": r["seed"], "steps": r["steps"],
               "episodes": r["episodes"], "updates": sum(r["updates"].values()), "samples": r["samples"],
               "wall_time": round(r["wall_time"], 3),
               "best_step": r["best"]["step"] if r["best"] else "", "best_score": r["best"]["score"] if r["best"] else "",
               "vs_random_mean": r["final"]["vs_random_mean"],
               "rating": r["final"]["rating"]["rating"] if r["final"]["rating"] else "",
               "rating_se": r["final"]["rating"]["se"] if r["final"]["rating"] else ""}
        for seat in seats:
            s = r["final"]["vs_random"][seat]
            row.update({f"vs_random_{seat}_mean": s["mean"], f"vs_random_{seat}_ci_low": s["ci_low"],
                        f"vs_random_{seat}_ci_high": s["ci_high"], f"vs_random_{seat}_episodes": s["n"]})
        out.append(row)
    return fields, out


def _curve_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in results["runs"]:
        path = Path(r["run_dir"]) / "eval.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            for e in csv.DictReader(f):
                rows.append({"run": r["name"], "variant": r["variant"], "seed": r["seed"], **e})
    return rows


def _plots(out: Path, results: dict[str, Any], have_eval: bool) -> dict[str, Path]:
    files = {}
    run_dirs = [Path(r["run_dir"]) for r in results["runs"]]
    title = f"{results['env']}: shared vs independent, {len(results['seeds'])} seeds"
    if have_eval:
        runs = [load_run(d, source="eval") for d in run_dirs if (d / "eval.csv").is_file()]
        if any(r.curves for r in runs):
            files["learning_curves"] = plot_learning_curves(
                [r for r in runs if r.curves], out / "learning_curves.png", window=1, band="minmax",
                title=title + " (periodic evaluation, epsilon %g)" % results["config"]["eval_ep"],
                ylabel=f"evaluation score vs {results['config']['eval_opponent']} (raw)")
    runs = [load_run(d) for d in run_dirs if (d / "episodes.csv").is_file()]
    if any(r.curves for r in runs):
        files["training_curves"] = plot_learning_curves([r for r in runs if r.curves], out / "training_curves.png",
                                                        title=title + " (training episodes)")
    return files


# ---- report.md -----------------------------------------------------------------------------------

def markdown(results: dict[str, Any], files: dict[str, Path]) -> str:
    r = results
    seats = r["seats"]
    conf = f"{100 * r['confidence']:.0f}%"
    two_sided = r["head_to_head"] is not None
    lines = [f"# {r['env']}: shared vs independent networks", "",
             f"madqn compare, {time.strftime('%Y-%m-%d %H:%M')}: {r['steps']:,} agent steps per run, seeds "
             f"{', '.join(map(str, r['seeds']))}, DQN3.0 config below. Evaluation at epsilon {r['epsilon']:g} on raw "
             f"scores: {r['episodes']} episodes per seat against random players"
             + (f", {_n(r['h2h_episodes'], 'episode')} per seat assignment in cross-play" if two_sided else "")
             + f" (episode seeds {r['eval_seed']}..{r['eval_seed'] + max(r['episodes'], r['h2h_episodes']) - 1}).",
             "", f"Values are mean ± half-width of the {conf} Student-t confidence interval; in the summary the "
             "replicates are the seeds (each run's mean over its episodes), elsewhere the episodes.", ""]

    # -- summary
    lines += ["## Summary", ""]
    header = ["variant", "seeds"] + [f"vs random: {s}" for s in seats]
    if len(seats) > 1:
        header.append("vs random: mean of seats")
    if two_sided:
        header += ["head-to-head points/game", "rating (Elo)"]
    header += ["wall time / run", "agent steps / run", "updates / run", "samples / run"]
    rows = []
    h2h = r["head_to_head"]
    for variant, v in r["variants"].items():
        row = [variant, str(v["seeds"])] + [fmt(v["vs_random"][s]) for s in seats]
        if len(seats) > 1:
            row.append(fmt(v["vs_random_mean"]))
        if two_sided:
            score = h2h["score"] if variant == "shared" else _mirror(h2h["score"])
            row += [fmt(score, 3), fmt(v["rating"], 0)]
        row += [fmt_duration(v["wall_time"]), fmt_count(v["steps"]), fmt_count(v["updates"]), fmt_count(v["samples"])]
        rows.append(row)
    base = ["random (baseline)", "-"] + [fmt(r["baseline"][s]) for s in seats]
    if len(seats) > 1:
        base.append("-")
    if two_sided:
        base += ["-", "0 (anchor)"]
    base += ["-"] * 4
    rows.append(base)
    lines += table(header, rows) + [""]
    lines += ["vs random: each trained seat against random players in every other seat (the multiplayer-ALE "
              "protocol); the baseline row is random in that seat too, on the same episodes. "
              "Samples: gradient updates x minibatch size.", ""]
    aggregates = {variant: v.get("aggregate") for variant, v in r["variants"].items()}
    if all(aggregates.values()):
        scale = ("normalised so that 0 is the random player in that seat on the same episodes and 1 that plus the "
                 "multiplayer-ALE paper's gain over random at 50M agent steps"
                 if all(a["normalized"] for a in aggregates.values()) else "raw scores (no published figures for this game)")
        lines += ["Aggregate: interquartile mean of the vs-random scores over seeds x seats, " + scale
                  + ", with a 95% stratified-bootstrap interval (seats as tasks, rliable's statistic): "
                  + "; ".join(f"{variant} {a['iqm']:.3g} [{a['low']:.3g}, {a['high']:.3g}]"
                              for variant, a in aggregates.items()) + ".", ""]

    # -- head to head
    if two_sided:
        rec = h2h["record"]
        lines += ["## Head-to-head: shared against independent", "",
                  f"Every shared run against every independent run, {_n(r['h2h_episodes'], 'episode')} per seat "
                  "assignment, seats swapped so that each network plays each seat equally often.", "",
                  f"- shared wins/draws/losses: {fmt_record(rec)} of {rec['games']} games",
                  f"- shared points per game (win 1, draw 1/2) over the {h2h['score']['n']} seed pairings: "
                  f"{fmt(h2h['score'], 3)}",
                  f"- shared score minus independent score per episode: {fmt(h2h['margin'])} "
                  f"({h2h['margin']['n']} episodes)",
                  f"- episode length: {fmt(h2h['length'], 1)} agent steps", ""]
        lines += table(["shared", "independent", "W/D/L (shared)", "points/game", "shared score", "independent score"],
                       [[p["shared"], p["independent"], fmt_record(p), f"{p['score']:.3f}",
                         f"{p['shared_mean']:.2f}", f"{p['independent_mean']:.2f}"] for p in h2h["pairs"]]) + [""]

    # -- per run
    lines += ["## Runs", ""]
    header = ["run", "agent steps", "updates", "wall time", "best eval (step: score)"] + \
             [f"vs random: {s}" for s in seats]
    header += ["episode length vs random"]
    if len(seats) > 1:
        header += ["W/D/L vs random (all seats)"]
    if two_sided:
        header += ["rating"]
    header += ["V / TD error (last validation)"]
    rows = []
    for run in r["runs"]:
        final = run["final"]
        best = "-" if run["best"] is None else f"{run['best']['step']:,}: {run['best']['score']:.2f}"
        row = [run["name"], fmt_count(run["steps"]), fmt_count(sum(run["updates"].values())),
               fmt_duration(run["wall_time"]), best] + [fmt(final["vs_random"][s]) for s in seats]
        row.append(fmt(final["vs_random_length"], 1))
        if len(seats) > 1:
            total = _sum_records([final["vs_random"][s]["record"] for s in seats])
            row.append(fmt_record(total))
        if two_sided:
            row.append(_fmt_rating(final["rating"]))
        row.append(", ".join(f"{k} {v['V']:.3g} / {v['td_error']:.3g}" for k, v in run["valid"].items()) or "-")
        rows.append(row)
        if run["best_player"] is not None:
            b = run["best_player"]
            brow = [f"{run['name']}@best (step {b['step']:,})", "", "", "", ""] + [fmt(b["vs_random"][s]) for s in seats]
            brow.append(fmt(b["vs_random_length"], 1))
            if len(seats) > 1:
                brow.append(fmt_record(_sum_records([b["vs_random"][s]["record"] for s in seats])))
            if two_sided:
                brow.append(_fmt_rating(b["rating"]))
            brow.append("")
            rows.append(brow)
    lines += table(header, rows) + [""]

    # -- ratings
    if two_sided:
        lines += ["## Ratings", "",
                  "Bradley-Terry maximum-likelihood ratings on the Elo scale (400 points = 10:1 odds) from every "
                  "two-sided game played above (against random and in the cross-play round robin), random "
                  "anchored at 0, one virtual draw per pair of players that met; ± is one standard error.", ""]
        lines += table(["player", "rating", "games", "points/game"],
                       [[x["player"], _fmt_rating(x), str(x["games"]), f"{x['score']:.3f}"] for x in r["ratings"]])
        lines += [""]

    # -- baseline
    lines += ["## Random baseline", "", f"Every seat random, the same {r['episodes']} episodes; "
              f"episode length {fmt(r['baseline_length'], 1)} agent steps.", ""]
    lines += table(["seat", "score", "std", "episodes"] + (["W/D/L"] if len(seats) > 1 else []),
                   [[s, fmt(r["baseline"][s]), f"{r['baseline'][s]['std']:.2f}", str(r["baseline"][s]["n"])]
                    + ([fmt_record(r["baseline"][s]["record"])] if len(seats) > 1 else []) for s in seats])
    lines += [""]

    # -- plots
    if "learning_curves" in files or "training_curves" in files:
        lines += ["## Learning curves", ""]
        if "learning_curves" in files:
            lines += [f"Periodic evaluation (every {r['config']['eval_freq']:,} agent steps, "
                      f"{r['config']['eval_steps']:,} agent steps at epsilon {r['config']['eval_ep']:g}, against "
                      f"{r['config']['eval_opponent']}): mean over seeds, min..max shaded.", "",
                      f"![periodic evaluation]({files['learning_curves'].name})", ""]
        if "training_curves" in files:
            lines += ["Training episodes (epsilon-greedy with the training schedule), 10-episode means:", "",
                      f"![training episodes]({files['training_curves'].name})", ""]

    # -- protocol and files
    lines += ["## Protocol", "",
              "- Training: DQN3.0 (madqn), both variants with the same config, seeds and agent-step budget; "
              "`shared` trains one network on every agent's experience with a one-hot agent indicator, "
              "`independent` one network per agent.",
              "- Evaluation: the final network of each run (and its best periodic-evaluation network, "
              "`@best`, when that is another one) acts epsilon-greedily with epsilon "
              f"{r['epsilon']:g}; episodes end as in training (`max_cycles` = {r['config']['max_cycles']:,}) "
              "but lost lives are not terminal; scores are raw, unclipped.",
              "- Outcomes: a side (the seats one player holds) wins an episode when its mean seat score is "
              "strictly higher than the other seats' mean, draws when equal.",
              "- Cross-play: for each seat, one player there and the other in every other seat, and the reverse; "
              "every setting plays the same episode seeds.",
              "- Raw per-episode rows: `episodes.csv` (one row per seat per episode); every number above is "
              "recomputed from it by `madqn.evaluation.protocol` / `madqn.evaluation.compare.build_results`.", "",
              "## Files", ""]
    for name, path in files.items():
        lines.append(f"- `{path.name}`: {_FILE_NOTES.get(name, name)}")
    lines += ["- `runs/<variant>-s<seed>/`: each training run (config.toml, episodes.csv, train.csv, eval.csv, "
              "valid.csv, checkpoints/latest.pt and best.pt, TensorBoard events)", "",
              "## Config", "", "```toml", *_config_lines(r["config"]), "```", "",
              f"Command: `{' '.join(shlex.quote(a) for a in ['madqn', *sys.argv[1:]])}`" if _is_cli() else "", ""]
    return "\n".join(lines)


_FILE_NOTES = {
    "episodes": "raw rows, one per seat per evaluation episode (match, setting, episode, seed, seat, player, side, "
                "score, length, steps, outcome, epsilon)",
    "results": "every number of this report, full precision",
    "runs": "one row per run: budget, cost, scores against random, rating",
    "ratings": "rating, standard error, games and points per game of every player",
    "curves": "the periodic evaluations of every run (eval.csv rows with the run's name)",
    "report": "this report",
    "learning_curves": "periodic-evaluation score vs agent steps, both variants, shaded across seeds",
    "training_curves": "training-episode score vs agent steps, both variants, shaded across seeds",
}


def _is_cli() -> bool:
    return Path(sys.argv[0]).name in ("madqn", "__main__.py")


def _config_lines(config: dict[str, Any]) -> list[str]:
    return [f"{k} = {_toml_value(v)}" for k, v in config.items() if k not in ("sharing", "seed")]


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _mirror(score: dict[str, Any]) -> dict[str, Any]:
    """The other side's points per game: 1 - x (same interval width)."""
    return {**score, "mean": 1.0 - score["mean"], "ci_low": 1.0 - score["ci_high"], "ci_high": 1.0 - score["ci_low"]}


def _sum_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    w, d, l = (sum(r[k] for r in records) for k in ("wins", "draws", "losses"))
    g = w + d + l
    return {"wins": w, "draws": d, "losses": l, "games": g, "win_rate": w / g if g else math.nan,
            "draw_rate": d / g if g else math.nan, "loss_rate": l / g if g else math.nan}


def _fmt_rating(x: dict[str, Any] | None) -> str:
    if x is None:
        return "-"
    return f"{x['rating']:.0f} ± {x['se']:.0f}" if x["se"] > 0 else f"{x['rating']:.0f}"
