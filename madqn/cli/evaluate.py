"""``madqn eval`` (a trained run against random players, itself or another run) and ``madqn compare``."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from madqn.cli.registry import command
from madqn.config import make_config, parse_overrides
from madqn.envs.adapters import make_env
from madqn.errors import CheckpointError, MadqnError
from madqn.evaluation import RandomPolicy
from madqn.evaluation.agents import Agents, load_agents, load_for_play
from madqn.evaluation.compare import CompareSettings, compare
from madqn.evaluation.protocol import (CROSS, Player, RANDOM, RANDOM_VS_RANDOM, ROW_FIELDS, SELF, VS_RANDOM, cross_play,
                                       cross_settings, length_summary, record, score_summary, self_play, vs_random)
from madqn.evaluation.report import _write_csv, fmt
from madqn.evaluation.video import check_video_path, record_episodes
from madqn.training.checkpoint import atomic_write_text, format_updates, updates_of
from madqn.training.progress import EvalProgress
from madqn.training.trainer import resolve_device


@command
def _eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="evaluate a trained run: against random players, itself, or another run",
        description="Play evaluation episodes with a trained run's networks at epsilon eval_ep (0.05) on raw scores "
                    "and report per-seat scores (mean, std, 95% confidence interval), episode lengths and "
                    "win/draw/loss rates. --opponent random: the trained agents in each seat against random "
                    "players (the multiplayer-ALE protocol), with the random-vs-random baseline on the same "
                    "episodes; self: the trained agents in every seat; RUN_DIR2 or a checkpoint: cross-play, "
                    "seats swapped so that seat advantage cancels. Per-episode rows go to a CSV file.")
    p.add_argument("run", metavar="RUN_DIR", help="run directory (its checkpoints/latest.pt) or a checkpoint file")
    p.add_argument("--episodes", type=int, default=30, help="episodes per seat assignment (default 30)")
    p.add_argument("--opponent", default="random", metavar="random|self|RUN_DIR2|CHECKPOINT",
                   help="who plays the other seats (default random)")
    p.add_argument("--seed", type=int, default=0, help="episode k uses env seed SEED + k (default 0)")
    p.add_argument("--eps", type=float, help="exploration epsilon (default: the run's eval_ep, 0.05)")
    add_checkpoint_option(p)
    p.add_argument("--env", help="env spec to play in (default: the run's env)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--out", help="CSV file of per-episode rows (default RUN_DIR/evals/<opponent>-s<seed>-n<episodes>.csv; "
                                 "a .json summary is written next to it)")
    p.add_argument("--video", metavar="OUT.mp4", help="also record episodes of the first seat assignment (.mp4 or .gif)")
    p.add_argument("--video-episodes", type=int, default=1, help="episodes to record with --video (default 1)")
    p.set_defaults(func=run_eval)


def add_checkpoint_option(p: argparse.ArgumentParser) -> None:
    """``--checkpoint latest|best``: which checkpoint of a run directory a command reads."""
    p.add_argument("--checkpoint", choices=["latest", "best"], default="latest",
                   help="for run directories: checkpoints/latest.pt (default) or the best periodic-evaluation "
                        "network checkpoints/best.pt")


def player_name(path: Path) -> str:
    """A player name for rows and tables: the run directory's name (file checkpoints: run/file)."""
    if path.parent.name == "checkpoints":
        name = path.parent.parent.name + ("" if path.name == "latest.pt" else "@" + path.stem)
    else:
        name = path.stem if path.is_file() else path.name
    return re.sub(r"[\s=+]", "_", name) or "trained"


def checkpoint_file(path: str | Path, which: str = "latest") -> Path:
    """A run directory's ``checkpoints/<which>.pt``, or the checkpoint file itself."""
    path = Path(path)
    if path.is_dir():
        file = path / "checkpoints" / f"{which}.pt"
        if not file.is_file():
            hint = " (best.pt is written by periodic evaluation: eval_freq > 0)" if which == "best" else ""
            raise CheckpointError(f"no checkpoint {file}{hint}")
        return file
    if not path.is_file():
        raise CheckpointError(f"run directory or checkpoint not found: {path}")
    return path


def run_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise MadqnError(f"--episodes must be >= 1, got {args.episodes}")
    if args.video:
        check_video_path(args.video)
        if args.video_episodes < 1:
            raise MadqnError(f"--video-episodes must be >= 1, got {args.video_episodes}")
    file = checkpoint_file(args.run, args.checkpoint)
    state, config, epsilon = load_for_play(file, args.eps)
    device = resolve_device(args.device)
    env_spec = args.env or config.env
    env_config = config.replace(terminal_on_life_loss=False)
    try:
        env = make_env(env_spec, env_config, seed=args.seed, convert=False)
    except MadqnError as e:
        raise MadqnError(f"{e} (the run's env is '{config.env}'; pass --env SPEC to choose the env to play in)") from None
    try:
        agents = list(env.possible_agents)
        a = Player(player_name(file), Agents.from_state(state, device=device, seed=args.seed, source=str(file)))
        a.policy.check_env(env, str(file))
        kind = args.opponent
        if kind not in ("random", "self"):
            other = checkpoint_file(args.opponent, args.checkpoint)
            b_name = player_name(other)
            if b_name == a.name:
                a.name, b_name = f"A_{a.name}", f"B_{b_name}"
            b = Player(b_name, load_agents(other, device=str(device), seed=args.seed))
            b.policy.check_env(env, str(other))
            kind = "cross"
        n_settings = {"random": len(agents) + 1, "self": 1}.get(kind) or len(cross_settings(agents, "a", "b"))
        desc = {"random": "eval vs random", "self": "eval self-play", "cross": "eval cross-play"}[kind]
        progress = EvalProgress(desc, episodes=n_settings * args.episodes)
        kw = dict(episodes=args.episodes, epsilon=epsilon, seed=args.seed, config=env_config, on_episode=progress)
        start = time.time()
        if kind == "random":
            rows = vs_random(env, a, **kw)
        elif kind == "self":
            rows = self_play(env, a, **kw)
        else:
            rows = cross_play(env, a, b, **kw)
        progress.close()
        elapsed = time.time() - start
        if args.video:
            _record(args, env, rows, {a.name: a} | ({b.name: b} if kind == "cross" else {}), epsilon,
                    config.video_length)
    finally:
        env.close()
    summary = summarize_eval(rows, kind, a.name, b.name if kind == "cross" else None, agents)
    updates = updates_of(state)
    summary.update({"checkpoint": str(file), "step": int(state["step"]), "updates": updates, "env": env_spec,
                    "epsilon": epsilon,
                    "episodes": args.episodes, "seed": args.seed, "opponent": args.opponent})
    out = Path(args.out) if args.out else _default_out(file, kind, args)
    _write(out, rows, summary)
    print(f"{env_spec}: {a.name} (step {state['step']:,}, {format_updates(updates)}) vs {args.opponent}, epsilon {epsilon:g}, "
          f"{args.episodes} episodes per setting, seeds {args.seed}..{args.seed + args.episodes - 1}, {elapsed:.1f} s")
    print(format_eval(summary))
    print(f"rows: {out}; summary: {out.with_suffix('.json')}")
    return 0


def _default_out(file: Path, kind: str, args: argparse.Namespace) -> Path:
    run_dir = file.parent.parent if file.parent.name == "checkpoints" else file.parent
    tag = {"random": "random", "self": "self"}.get(kind) or "cross-" + player_name(checkpoint_file(args.opponent,
                                                                                                    args.checkpoint))
    which = "" if args.checkpoint == "latest" else f"-{args.checkpoint}"
    return run_dir / "evals" / f"{tag}{which}-s{args.seed}-n{args.episodes}.csv"


def _write(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_csv(out, ROW_FIELDS, rows)
        atomic_write_text(out.with_suffix(".json"), json.dumps(summary, indent=1) + "\n")
    except OSError as e:
        raise MadqnError(f"cannot write {out}: {e.strerror or e}") from None


def summarize_eval(rows: list[dict[str, Any]], kind: str, a: str, b: str | None, agents: list[str]) -> dict[str, Any]:
    """The numbers ``madqn eval`` prints, from the rows: one entry per (player, seat) and per player."""
    def entry(player: str, **where: Any) -> dict[str, Any]:
        rec = record(rows, player, **where)
        players_rows = [r for r in rows if all(str(r[k]) == str(v) for k, v in where.items()) and r["player"] == player]
        return {"player": player, **{k: str(v) for k, v in where.items() if k == "seat"},
                **score_summary(rows, player, **where).to_dict(),
                "length": length_summary(players_rows).to_dict(),
                "record": {"wins": rec.wins, "draws": rec.draws, "losses": rec.losses, **rec.rates()}}

    lines = []
    if kind == "random":
        for seat in agents:
            lines.append(entry(a, match=VS_RANDOM, seat=seat))
            lines.append({**entry(RANDOM, match=RANDOM_VS_RANDOM, seat=seat), "baseline": True})
    elif kind == "self":
        lines = [entry(a, match=SELF, seat=seat) for seat in agents]
    else:
        for player in (a, b):
            lines += [entry(player, match=CROSS, seat=seat) for seat in agents]
            lines.append({**entry(player, match=CROSS), "seat": "all"})
    return {"kind": kind, "players": [a] + ([b] if b else []), "two_sided": len(agents) > 1, "lines": lines}


def format_eval(summary: dict[str, Any]) -> str:
    header = ["seat", "player", "episodes", "score (95% CI)", "std", "length"]
    if summary["two_sided"]:
        header.append("win / draw / loss")
    table = [header]
    for e in summary["lines"]:
        player = e["player"] + (" (baseline)" if e.get("baseline") else "")
        one = e["n"] < 2  # no spread from one episode: n/a
        row = [e.get("seat", "all"), player, str(e["n"]), fmt(e) + (" ± n/a" if one and e["n"] else ""),
               "n/a" if one else f"{e['std']:.2f}", fmt(e["length"], 1)]
        if summary["two_sided"]:
            r = e["record"]
            row.append(f"{r['wins']}/{r['draws']}/{r['losses']} ({100 * r['win']:.0f}%/{100 * r['draw']:.0f}%/"
                       f"{100 * r['loss']:.0f}%)")
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in table]
    if summary["kind"] == "cross":
        out.append("  'all': the player's mean seat score per episode over every seat assignment (seats swapped)")
    if summary["two_sided"]:
        out.append("  win: the seat's score (its side's mean) strictly above the other seats' mean")
    return "\n".join(out)


def _record(args: argparse.Namespace, env: Any, rows: list[dict[str, Any]], players: dict[str, Any],
            epsilon: float, video_length: int) -> None:
    """Video of the first seat assignment that was evaluated, each episode cut at ``video_length`` agent steps."""
    path = check_video_path(args.video)
    first = str(rows[0]["setting"]) if rows else ""
    seats = dict(part.split("=", 1) for part in first.split(" ")) if first else {}
    random = RandomPolicy({a: int(env.action_space(a).n) for a in env.possible_agents}, seed=args.seed)
    policies = {seat: players[name].policy if name in players else random for seat, name in seats.items()}

    def act(observations: dict, infos: dict) -> dict[str, int]:
        actions: dict[str, int] = {}
        for policy in {id(p): p for p in policies.values()}.values():
            mine = {a: o for a, o in observations.items() if policies[a] is policy}
            if mine:
                actions.update(policy.act(mine, {a: infos.get(a, {}) for a in mine}, epsilon=epsilon))
        return actions

    def reset() -> None:
        for policy in {id(p): p for p in policies.values()}.values():
            policy.reset()

    recording = record_episodes(env, act, path, args.video_episodes, max_steps=video_length, reset_fn=reset,
                                note=first.replace(" ", ", "))
    print(f"video: {path} ({recording.frames} frames, {args.video_episodes} episode(s) of {first})")


# ---- madqn pool --------------------------------------------------------------------------------------

@command
def _pool(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pool", help="rate the opponent pool of a run: Elo of each snapshot and of the networks between them",
        description="Fit Elo-scale ratings (Bradley-Terry, madqn.evaluation.rating) to the training games a run "
                    "with an opponent pool (pool_every > 0) played against its snapshots: each snapshot, and the "
                    "networks between two snapshots, is one player named by its agent step; the earliest is "
                    "anchored at 0. Prints the table and writes RUN_DIR/pool_ratings.csv.")
    p.add_argument("run_dir", help="a run directory trained with pool_every > 0")
    p.set_defaults(func=run_pool)


def run_pool(args: argparse.Namespace) -> int:
    from madqn.evaluation.rating import fit_ratings, pool_games
    from madqn.training.metrics import read_rows

    run = Path(args.run_dir)
    if not (run / "config.toml").is_file():
        raise MadqnError(f"{run} is not a run directory (no config.toml)")
    config = make_config(run / "config.toml")
    if config.pool_every <= 0:
        raise MadqnError(f"{run} was trained without an opponent pool (pool_every = 0): nothing to rate")
    games = pool_games(read_rows(run / "episodes.csv"), config.pool_every)
    if not games:
        raise MadqnError(f"{run}: no episode against a pool snapshot yet (episodes.csv has no snapshot_step)")
    steps = sorted({int(p.split()[1]) for g in games for p in g[:2]})
    ratings = fit_ratings(games, anchor=f"step {steps[0]}")
    rows = [{"step": int(r.player.split()[1]), "rating": round(r.rating, 1), "se": round(r.se, 1), "games": r.games,
             "score": round(r.score, 3)} for r in ratings.values()]
    rows.sort(key=lambda r: r["step"])
    _write_csv(run / "pool_ratings.csv", ["step", "rating", "se", "games", "score"], rows)
    print(f"{run}: {len(games)} games against the pool, Elo relative to step {steps[0]:,} (± 1 s.e.)")
    for r in rows:
        print(f"  step {r['step']:>10,}  {r['rating']:>8.1f} ± {r['se']:<6.1f}  {r['games']:>5} games, "
              f"{r['score']:.2f} points per game")
    print(f"table: {run / 'pool_ratings.csv'}")
    return 0


# ---- madqn compare -------------------------------------------------------------------------------

@command
def _compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="shared vs independent networks: same seeds and budget, evaluated, one report",
        description="Train the shared and the independent variant for --steps agent steps on each of --seeds "
                    "seeds (runs in OUT/runs/<variant>-s<seed>, with periodic evaluation), evaluate every run "
                    "against random players and the random baseline, play shared against independent with seats "
                    "swapped, rate every network, and write OUT/report.md with tables, learning curves (PNG) and "
                    "the raw numbers (CSV, JSON). Rerunning the same command keeps finished runs, resumes "
                    "unfinished ones and reuses finished evaluations.")
    p.add_argument("--env", help="PettingZoo Atari name (pong_v3), 'package.module:callable' or 'file.py:callable' "
                                 "(default: the config's env)")
    p.add_argument("--steps", type=int, help="training length of every run, in agent steps (default: the config's)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per variant: SEED, SEED+1, ... (default 3)")
    p.add_argument("--seed", type=int, help="first seed (default: the config's, 1)")
    p.add_argument("--config", help="TOML config file (defaults are DQN3.0's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key (TOML value syntax), repeatable")
    p.add_argument("--out", help="report directory (default runs/compare-<env>-<steps>)")
    p.add_argument("--episodes", type=int, default=30, help="evaluation episodes per seat against random (default 30)")
    p.add_argument("--h2h-episodes", type=int, default=10,
                   help="cross-play episodes per seat assignment and pair of networks (default 10; 0 = none)")
    p.add_argument("--eval-seed", type=int, default=100_000, help="episode k of every evaluation uses env seed "
                                                                 "EVAL_SEED + k (default 100000)")
    p.add_argument("--no-best", action="store_true", help="evaluate only each run's final network, not also its "
                                                          "best periodic-evaluation network")
    p.add_argument("--jobs", type=int, default=1, help="training processes at a time (default 1)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N for training and evaluation (default: the config's)")
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    overrides = parse_overrides(args.overrides)
    for key in ("env", "steps", "seed", "device"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    for key in ("sharing",):
        if key in overrides:
            raise MadqnError(f"madqn compare trains both sharing modes; do not set '{key}'")
    config = make_config(args.config, overrides)
    if args.seeds < 1:
        raise MadqnError(f"--seeds must be >= 1, got {args.seeds}")
    env_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", config.env.rsplit("/", 1)[-1].replace(".py:", "-"))
    out = Path(args.out) if args.out else Path("runs") / f"compare-{env_name}-{config.steps}"
    settings = CompareSettings(config=config, seeds=[config.seed + i for i in range(args.seeds)], out=out,
                               episodes=args.episodes, h2h_episodes=args.h2h_episodes, eval_seed=args.eval_seed,
                               include_best=not args.no_best, jobs=args.jobs,
                               device=str(resolve_device(config.device)))
    result = compare(settings)
    print(_summary_lines(result.results))
    print(f"report: {result.files['report']} (raw rows {result.files['episodes']}, numbers {result.files['results']})")
    return 0


def _summary_lines(results: dict[str, Any]) -> str:
    seats = results["seats"]
    lines = [f"{results['env']}, {results['steps']:,} agent steps, seeds {results['seeds']}: score vs random "
             "(mean ± 95% CI over seeds)"]
    for variant, v in results["variants"].items():
        parts = [f"{s} {fmt(v['vs_random'][s])}" for s in seats]
        lines.append(f"  {variant:<12} " + ", ".join(parts))
    lines.append(f"  {'random':<12} " + ", ".join(f"{s} {fmt(results['baseline'][s])}" for s in seats))
    aggregates = {variant: v["aggregate"] for variant, v in results["variants"].items()}
    scale = ("normalised: 0 = random in that seat on the same episodes, 1 = that plus Terry et al. 2020's gain at 50M agent steps"
             if all(a["normalized"] for a in aggregates.values()) else "raw scores; no published figures for this game")
    lines.append(f"  aggregate, IQM over seeds x seats ({scale}; 95% stratified bootstrap CI): "
                 + ", ".join(f"{variant} {a['iqm']:.3g} [{a['low']:.3g}, {a['high']:.3g}]"
                             for variant, a in aggregates.items()))
    h2h = results["head_to_head"]
    if h2h is not None:
        rec = h2h["record"]
        lines.append(f"  head-to-head: shared {rec['wins']}/{rec['draws']}/{rec['losses']} (W/D/L) against "
                     f"independent, points/game {fmt(h2h['score'], 3)}")
    return "\n".join(lines)
