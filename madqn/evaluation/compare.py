"""``madqn compare``: shared against independent networks on the same seeds and budget, one protocol, one report.

Steps (each resumable; a rerun of the same command redoes only what is missing):

1. Training: for every variant (``shared``, ``independent``) and seed, ``OUT/runs/<variant>-s<seed>`` is
   trained for ``steps`` agent steps by a ``madqn train`` process (``jobs`` at a time), with periodic
   evaluation (``madqn.evaluation.eval_hook``). A run whose checkpoint reached ``steps`` is kept as it is; an
   unfinished one is resumed; one that never wrote a checkpoint is restarted.
2. Evaluation (``madqn.evaluation.protocol``, epsilon ``eval_ep``): every player (each run's final network and,
   with ``include_best``, its best periodic-evaluation network) in each seat against random others,
   ``episodes`` episodes per seat; the random-vs-random baseline on the same episode seeds; a round
   robin of cross-play among all players, ``h2h_episodes`` episodes per seat assignment (seats
   swapped). The rows of each finished match are cached in ``OUT/cache`` and reused by reruns.
3. Results (``build_results``): pure functions of the raw rows and the runs' files, written by
   ``madqn.evaluation.report`` as ``report.md``, ``results.json``, CSV files and PNG plots.

Statistics: a variant's score against random is the mean over seeds of each run's mean episode
score, with a Student-t 95% interval over seeds (seeds are the independent replicates; episodes of
one run share its network). Head-to-head: the points per game (win 1, draw 1/2) of shared against
independent in each seed pairing, mean and interval over pairings, and the pooled win/draw/loss
counts. Ratings: ``madqn.evaluation.rating.fit_ratings`` over every two-sided game played, random anchored at 0.
Aggregate: the interquartile mean over seeds x seats with a stratified-bootstrap interval (rliable's
statistic, ``madqn.evaluation.aggregate``), on the scale 0 = random vs random, 1 = the multiplayer-ALE
paper's 50M-step score where the game has published figures, else of raw scores.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from madqn.api import RESUME_SAFE_KEYS
from madqn.config import Config
from madqn.envs.adapters import make_env
from madqn.errors import CheckpointError, MadqnError
from madqn.evaluation.aggregate import game_aggregate
from madqn.evaluation.agents import load_agents
from madqn.evaluation.protocol import (CROSS, Player, RANDOM, RANDOM_VS_RANDOM, VS_RANDOM, cross_play, cross_settings,
                                       episode_scores, games, length_summary, random_baseline, record, score_summary,
                                       select, vs_random)
from madqn.evaluation.rating import fit_ratings
from madqn.evaluation.report import write_report
from madqn.evaluation.stats import Record, mean_confidence_interval
from madqn.training.checkpoint import atomic_write_text, load_run_checkpoint, safe_load
from madqn.training.learners import check_shared_spaces
from madqn.training.progress import EvalProgress
from madqn.training.trainer import resolve_threads

VARIANTS = ("shared", "independent")
FINAL, BEST = "final", "best"


@dataclass
class CompareSettings:
    config: Config  # base config: env, steps and every training/evaluation key (sharing and seed set per run)
    seeds: list[int]
    out: Path
    episodes: int = 30  # vs-random episodes per seat per player (and of the random baseline)
    h2h_episodes: int = 10  # cross-play episodes per seat assignment per pair of players
    eval_seed: int = 100_000  # episode k of every evaluation match resets the env with eval_seed + k
    include_best: bool = True  # also rate and evaluate each run's best periodic-evaluation network
    jobs: int = 1  # training processes at a time
    device: str = "cpu"  # where evaluation networks run
    confidence: float = 0.95

    @property
    def epsilon(self) -> float:
        return self.config.eval_ep


@dataclass
class RunPlan:
    variant: str
    seed: int
    run_dir: Path
    status: str = "new"  # new | resume | done | restart
    step: int = 0  # checkpoint step found

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


@dataclass
class PlayerSpec:
    name: str  # "<variant>-s<seed>" (final network) or "<variant>-s<seed>@best"
    variant: str
    seed: int
    kind: str  # final | best
    checkpoint: Path
    step: int


# ---- 1. training ---------------------------------------------------------------------------------

def run_config(settings: CompareSettings, variant: str, seed: int) -> Config:
    return settings.config.replace(sharing=variant, seed=seed)


def plan_runs(settings: CompareSettings) -> list[RunPlan]:
    """What each run needs, from its directory: nothing (done), a resume, a (re)start.

    Refuses a finished or unfinished run whose saved config differs from the requested one in a
    key a resume could not change, and a run already longer than ``steps``.
    """
    plans = []
    for variant in VARIANTS:
        for seed in settings.seeds:
            plan = RunPlan(variant, seed, settings.out / "runs" / f"{variant}-s{seed}")
            if (plan.run_dir / "checkpoints" / "latest.pt").is_file():
                try:
                    state, path = load_run_checkpoint(plan.run_dir)
                except CheckpointError as e:
                    raise MadqnError(f"{e}; delete {plan.run_dir} to retrain this run") from None
                want = run_config(settings, variant, seed).to_dict()
                for key, value in state["config"].items():
                    if key in want and key not in RESUME_SAFE_KEYS and want[key] != value:
                        raise MadqnError(f"{plan.run_dir} was trained with {key} = {value!r}, this comparison asks "
                                         f"for {want[key]!r}; use another --out or delete that run")
                plan.step = int(state["step"])
                if plan.step > settings.config.steps:
                    raise MadqnError(f"{plan.run_dir} already has {plan.step} agent steps, more than --steps "
                                     f"{settings.config.steps}; use another --out")
                plan.status = "done" if plan.step == settings.config.steps else "resume"
            elif plan.run_dir.exists() and any(plan.run_dir.iterdir()):
                plan.status = "restart"  # started, but stopped before its first checkpoint
            plans.append(plan)
    return plans


def _child_env() -> dict[str, str]:
    """Environment for ``madqn train`` children: the same madqn source as this process."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def train_command(settings: CompareSettings, plan: RunPlan, config_path: Path) -> list[str]:
    base = [sys.executable, "-m", "madqn", "train"]
    threads = []
    if settings.jobs > 1 and settings.config.num_threads == 0:
        threads = ["--set", f"num_threads={max(1, (os.cpu_count() or 1) // settings.jobs)}"]
    if plan.status == "resume":
        return [*base, "--resume", str(plan.run_dir), "--steps", str(settings.config.steps), *threads]
    force = ["--force"] if plan.status == "restart" else []
    return [*base, "--config", str(config_path), "--sharing", plan.variant, "--seed", str(plan.seed),
            "--run-dir", str(plan.run_dir), *force, *threads]


def train_runs(settings: CompareSettings, plans: list[RunPlan], out: TextIO = sys.stdout) -> None:
    """Train every run that is not done, ``settings.jobs`` processes at a time.

    With one job the child's progress goes to this terminal; with several each child writes
    ``OUT/logs/<run>.log``. SIGINT/SIGTERM reach the children (they checkpoint and stop); the
    comparison then stops and a rerun continues it.
    """
    todo = [p for p in plans if p.status != "done"]
    for p in plans:
        if p.status == "done":
            print(f"compare: {p.name} finished earlier ({p.step} agent steps): kept", file=out, flush=True)
    if not todo:
        return
    config_path = settings.out / "config.toml"
    logs = settings.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    received: list[int] = []
    running: dict[subprocess.Popen, tuple[RunPlan, Any]] = {}

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failed: list[str] = []
    try:
        queue = list(todo)
        while queue or running:
            while queue and len(running) < settings.jobs and not received:
                plan = queue.pop(0)
                what = {"new": "training", "restart": "restarting (no checkpoint yet)",
                        "resume": f"resuming from step {plan.step}"}[plan.status]
                log = open(logs / f"{plan.name}.log", "a") if settings.jobs > 1 else None
                print(f"compare: {what} {plan.name} -> {plan.run_dir}" +
                      (f" (log {logs / (plan.name + '.log')})" if log else ""), file=out, flush=True)
                # a session of its own: a terminal's Ctrl-C reaches this process only, which forwards it
                # once (a child getting it twice would exit without its checkpoint)
                proc = subprocess.Popen(train_command(settings, plan, config_path), env=_child_env(),
                                        stdout=log, stderr=subprocess.STDOUT if log else None,
                                        start_new_session=True)
                running[proc] = (plan, log)
            if received and not running:
                break
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                plan, log = running.pop(proc)
                if log is not None:
                    log.close()
                if proc.returncode != 0:
                    failed.append(f"{plan.name} (exit {proc.returncode}" +
                                  (f", see {logs / (plan.name + '.log')})" if log else ")"))
                elif not received:
                    print(f"compare: {plan.name} trained", file=out, flush=True)
            if failed and not running:
                break
    finally:
        for proc, (plan, log) in running.items():  # only after an error here: never leave a child behind
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # it checkpoints and stops
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if log is not None:
                log.close()
        for s, h in previous.items():
            signal.signal(s, h)
    if received:
        name = signal.Signals(received[0]).name
        raise MadqnError(f"compare stopped by {name}; the runs saved checkpoints: rerun the same command to continue")
    if failed:
        raise MadqnError(f"training failed for {', '.join(failed)}; fix the cause and rerun the same command "
                         "(finished runs are kept)")


# ---- 2. evaluation -------------------------------------------------------------------------------

def collect_players(settings: CompareSettings, plans: list[RunPlan]) -> list[PlayerSpec]:
    """Each run's final network and (``include_best``) its best one when it differs from the final."""
    players = []
    for plan in plans:
        latest = plan.run_dir / "checkpoints" / "latest.pt"
        step = int(safe_load(latest, mmap=True)["step"])
        players.append(PlayerSpec(plan.name, plan.variant, plan.seed, FINAL, latest, step))
        best = plan.run_dir / "checkpoints" / "best.pt"
        if settings.include_best and best.is_file():
            best_step = int(safe_load(best, mmap=True)["best"]["step"])
            if best_step != step:
                players.append(PlayerSpec(f"{plan.name}@best", plan.variant, plan.seed, BEST, best, best_step))
    return players


def _fingerprint(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def match_jobs(settings: CompareSettings, players: list[PlayerSpec], agents: list[str]) -> list[dict[str, Any]]:
    """Every evaluation match to play, each with the key that identifies its cached rows."""
    c = settings.config
    common = {"env": c.env, "epsilon": settings.epsilon, "seed": settings.eval_seed, "max_cycles": c.max_cycles,
              "random_starts": c.random_starts, "agents": agents}
    jobs = [{"kind": "baseline", "players": [], "episodes": settings.episodes}]
    jobs += [{"kind": "vs_random", "players": [p.name], "episodes": settings.episodes} for p in players]
    if len(agents) > 1:
        jobs += [{"kind": "cross", "players": [a.name, b.name], "episodes": settings.h2h_episodes}
                 for i, a in enumerate(players) for b in players[i + 1:]]
    by_name = {p.name: p for p in players}
    for job in jobs:
        job["key"] = {**common, "kind": job["kind"], "episodes": job["episodes"],
                      "checkpoints": [_fingerprint(by_name[n].checkpoint) for n in job["players"]],
                      "names": job["players"]}
    return [j for j in jobs if j["episodes"] > 0]


def _cached_rows(path: Path, key: dict[str, Any]) -> list[dict] | None:
    """The rows of a finished evaluation match from the cache, or None (absent, unreadable or another key)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved["rows"] if isinstance(saved, dict) and saved.get("key") == key else None


def _cache_path(settings: CompareSettings, key: dict[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return settings.out / "cache" / f"{key['kind']}-{digest}.json"


def evaluate_players(settings: CompareSettings, players: list[PlayerSpec], out: TextIO = sys.stdout) -> list[dict]:
    """Play (or read from the cache) every match of ``match_jobs``; returns all raw rows."""
    c = settings.config
    torch.set_num_threads(resolve_threads(c.num_threads)[0])
    env = make_env(c.env, c.replace(terminal_on_life_loss=False), seed=settings.eval_seed, convert=False)
    try:
        agents = list(env.possible_agents)
        jobs = match_jobs(settings, players, agents)
        loaded: dict[str, Player] = {}
        by_name = {p.name: p for p in players}

        def player(name: str) -> Player:
            if name not in loaded:
                loaded[name] = Player(name, load_agents(by_name[name].checkpoint, device=settings.device,
                                                        seed=settings.eval_seed))
                loaded[name].policy.check_env(env, str(by_name[name].checkpoint))
            return loaded[name]

        settings_per_kind = {"baseline": 1, "vs_random": len(agents), "cross": len(cross_settings(agents, "a", "b"))}
        episodes = sum(j["episodes"] * settings_per_kind[j["kind"]] for j in jobs)
        print(f"compare: {len(players)} networks and random; {len(jobs)} evaluation matches, {episodes} episodes "
              f"at epsilon {settings.epsilon:g}", file=out, flush=True)
        rows: list[dict] = []
        saved_rows = [_cached_rows(_cache_path(settings, job["key"]), job["key"]) for job in jobs]
        cached = sum(r is not None for r in saved_rows)
        to_play = sum(j["episodes"] * settings_per_kind[j["kind"]] for j, r in zip(jobs, saved_rows) if r is None)
        progress = EvalProgress("compare: evaluation", episodes=to_play, out=out)
        for job, job_rows in zip(jobs, saved_rows):
            path = _cache_path(settings, job["key"])
            if job_rows is None:
                kw = dict(episodes=job["episodes"], seed=settings.eval_seed, config=c, on_episode=progress)
                if job["kind"] == "baseline":
                    job_rows = random_baseline(env, **kw)
                elif job["kind"] == "vs_random":
                    job_rows = vs_random(env, player(job["players"][0]), epsilon=settings.epsilon, baseline=False, **kw)
                else:
                    job_rows = cross_play(env, player(job["players"][0]), player(job["players"][1]),
                                          epsilon=settings.epsilon, **kw)
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps({"key": job["key"], "rows": job_rows}))
            rows += job_rows
        progress.close()
        if cached:
            print(f"compare: {cached} of {len(jobs)} evaluation matches read from {settings.out / 'cache'}",
                  file=out, flush=True)
        return rows
    finally:
        env.close()


# ---- 3. results ----------------------------------------------------------------------------------

def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_facts(plan: RunPlan) -> dict[str, Any]:
    """Budget and cost of one run from its checkpoint and metrics files."""
    state = safe_load(plan.run_dir / "checkpoints" / "latest.pt", mmap=True)
    updates = {name: int(g["updates"]) for name, g in state["groups"].items()}
    batch = int(state["config"]["minibatch_size"])
    valid_rows = _read_csv(plan.run_dir / "valid.csv")
    last_valid = {}
    if valid_rows:
        last = max(int(r["step"]) for r in valid_rows)
        last_valid = {r["learner"]: {"step": last, "V": float(r["V"]), "td_error": float(r["td_error"])}
                      for r in valid_rows if int(r["step"]) == last}
    best = plan.run_dir / "checkpoints" / "best.pt"
    best_meta = safe_load(best, mmap=True)["best"] if best.is_file() else None
    return {"name": plan.name, "variant": plan.variant, "seed": plan.seed, "run_dir": str(plan.run_dir),
            "steps": int(state["step"]), "episodes": int(state["episodes"]), "updates": updates,
            "samples": sum(updates.values()) * batch, "wall_time": float(state["wall_time"]),
            "best": None if best_meta is None else {"step": int(best_meta["step"]), "score": float(best_meta["score"])},
            "valid": last_valid}


def pair_rows(rows: list[dict], a: str, b: str) -> list[dict]:
    """Cross-play rows of the settings in which exactly ``a`` and ``b`` played."""
    return [r for r in rows if r["match"] == "cross" and
            {part.split("=", 1)[1] for part in str(r["setting"]).split(" ")} == {a, b}]


def build_results(settings: CompareSettings, plans: list[RunPlan], players: list[PlayerSpec],
                  rows: list[dict]) -> dict[str, Any]:
    """Every number of the report, from the rows and the runs' files (see the module docstring)."""
    conf = settings.confidence
    seats = list(dict.fromkeys(r["seat"] for r in rows))
    two_sided = len(seats) > 1

    def record_dict(rec: Record) -> dict[str, Any]:
        return {"wins": rec.wins, "draws": rec.draws, "losses": rec.losses, "games": rec.games, "score": rec.score,
                **{f"{k}_rate": v for k, v in rec.rates().items()}}

    baseline = {seat: {**score_summary(rows, RANDOM, conf, match=RANDOM_VS_RANDOM, seat=seat).to_dict(),
                       "record": record_dict(record(rows, RANDOM, match=RANDOM_VS_RANDOM, seat=seat))}
                for seat in seats}
    baseline_length = length_summary(rows, match=RANDOM_VS_RANDOM).to_dict()

    ratings = {}
    if two_sided:
        ratings = {name: {"rating": r.rating, "se": r.se, "games": r.games, "score": r.score}
                   for name, r in fit_ratings(games(rows), anchor=RANDOM).items()}

    def player_results(p: PlayerSpec) -> dict[str, Any]:
        vs = {}
        for seat in seats:
            where = {"match": VS_RANDOM, "seat": seat}
            vs[seat] = {**score_summary(rows, p.name, conf, **where).to_dict(),
                        "record": record_dict(record(rows, p.name, **where))}
        seat_means = [vs[s]["mean"] for s in seats]
        return {"name": p.name, "kind": p.kind, "step": p.step, "vs_random": vs,
                "vs_random_mean": float(np.mean(seat_means)),
                "vs_random_length": length_summary(select(rows, match=VS_RANDOM, player=p.name)).to_dict(),
                "rating": ratings.get(p.name)}

    by_run = {p.name: p for p in players if p.kind == FINAL}
    best_of = {p.name.split("@")[0]: p for p in players if p.kind == BEST}
    runs = []
    for plan in plans:
        facts = run_facts(plan)
        facts["final"] = player_results(by_run[plan.name])
        facts["best_player"] = player_results(best_of[plan.name]) if plan.name in best_of else None
        runs.append(facts)

    c = settings.config
    variants: dict[str, Any] = {}
    for variant in VARIANTS:
        members = [r for r in runs if r["variant"] == variant]
        def interval(values: list[float]) -> dict[str, float]:
            return mean_confidence_interval(values, conf).to_dict()

        per_seat = {seat: interval([r["final"]["vs_random"][seat]["mean"] for r in members]) for seat in seats}
        variants[variant] = {
            "seeds": len(members),
            "vs_random": per_seat,
            "vs_random_mean": interval([r["final"]["vs_random_mean"] for r in members]),
            "rating": interval([r["final"]["rating"]["rating"] for r in members]) if ratings else None,
            "wall_time": float(np.mean([r["wall_time"] for r in members])),
            "wall_time_total": float(np.sum([r["wall_time"] for r in members])),
            "steps": int(np.mean([r["steps"] for r in members])),
            "updates": float(np.mean([sum(r["updates"].values()) for r in members])),
            "samples": float(np.mean([r["samples"] for r in members])),
            # IQM over seeds x seats with a stratified bootstrap (tasks = seats), normalised where the game has
            # published figures (madqn.evaluation.aggregate)
            "aggregate": game_aggregate(str(c.env), {s: [r["final"]["vs_random"][s]["mean"] for r in members]
                                                     for s in seats},
                                        {s: baseline[s]["mean"] for s in seats}, confidence=conf).to_dict(),
        }

    head_to_head = None
    if two_sided:
        shared = [p.name for p in players if p.kind == FINAL and p.variant == "shared"]
        independent = [p.name for p in players if p.kind == FINAL and p.variant == "independent"]
        total, pair_scores, margins, pairs = Record(), [], [], []
        for a in shared:
            for b in independent:
                sub = pair_rows(rows, a, b)
                rec = record(sub, a, match=CROSS)
                total = total + rec
                pair_scores.append(rec.score)
                margins += list(np.subtract(episode_scores(sub, a, match=CROSS), episode_scores(sub, b, match=CROSS)))
                pairs.append({"shared": a, "independent": b, **record_dict(rec),
                              "shared_mean": score_summary(sub, a, conf, match=CROSS).mean,
                              "independent_mean": score_summary(sub, b, conf, match=CROSS).mean})
        head_to_head = {"record": record_dict(total), "score": mean_confidence_interval(pair_scores, conf).to_dict(),
                        "margin": mean_confidence_interval(margins, conf).to_dict(), "pairs": pairs,
                        "length": length_summary([r for p in pairs for r in pair_rows(rows, p["shared"],
                                                                                      p["independent"])]).to_dict()}

    return {
        "env": c.env, "steps": c.steps, "seeds": list(settings.seeds), "variants_order": list(VARIANTS),
        "seats": seats, "epsilon": settings.epsilon, "episodes": settings.episodes,
        "h2h_episodes": settings.h2h_episodes, "eval_seed": settings.eval_seed, "confidence": conf,
        "config": c.to_dict(), "baseline": baseline, "baseline_length": baseline_length, "runs": runs,
        "variants": variants, "head_to_head": head_to_head,
        "ratings": [{"player": k, **v} for k, v in ratings.items()],
    }


# ---- everything ----------------------------------------------------------------------------------

@dataclass
class CompareResult:
    out: Path
    results: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)


def compare(settings: CompareSettings, out: TextIO = sys.stdout) -> CompareResult:
    """Train (or resume) every run, evaluate every player, write the report directory."""
    c = settings.config
    env = make_env(c.env, c, seed=c.seed)  # a bad env spec, or one a shared network cannot play: one line, now
    try:
        check_shared_spaces(env)
    except MadqnError as e:
        raise MadqnError(f"{str(e).replace('; use --sharing independent', '')}: madqn compare trains both variants "
                         "and a shared network cannot play this env") from None
    finally:
        env.close()
    if len(set(settings.seeds)) != len(settings.seeds) or not settings.seeds:
        raise MadqnError(f"seeds must be distinct and at least one, got {settings.seeds}")
    for name in ("episodes", "h2h_episodes"):
        if getattr(settings, name) < 0:
            raise MadqnError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(settings, name)}")
    if settings.episodes < 2:
        raise MadqnError(f"--episodes must be >= 2 (a confidence interval needs two episodes), got {settings.episodes}")
    if settings.jobs < 1:
        raise MadqnError(f"--jobs must be >= 1, got {settings.jobs}")
    plans = plan_runs(settings)  # refuses runs trained with another config before anything is written
    try:
        settings.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MadqnError(f"cannot create {settings.out}: {e.strerror or e}") from None
    atomic_write_text(settings.out / "config.toml", c.to_toml())
    start = time.time()
    train_runs(settings, plans, out)
    players = collect_players(settings, plans)
    rows = evaluate_players(settings, players, out)
    results = build_results(settings, plans, players, rows)
    results["compare_wall_time"] = time.time() - start
    files = write_report(settings.out, results, rows)
    return CompareResult(settings.out, results, files)

