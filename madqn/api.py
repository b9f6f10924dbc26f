"""Library entry point: ``madqn.train(env, config, run_dir=...)`` returns a :class:`RunResult`.

``madqn.train(resume=RUN_DIR)`` continues a run from ``RUN_DIR/checkpoints/latest.pt`` with the
config saved in it: step counters, schedules and metrics files go on without gaps or repeated rows.
With ``save_replay = true`` the replay memory is restored and learning continues at once; without
it the memory refills for ``learn_start`` agent steps (acting with the restored network, epsilon
following its schedule) before learning resumes. SIGINT/SIGTERM stop a run after the current step
with a checkpoint; a second signal exits at once, leaving the last complete checkpoint intact.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import torch

from madqn.commands import resume_command
from madqn.config import Config, _check_keys, load_toml, make_config
from madqn.core.learner import describe_precision
from madqn.envs.atari import is_atari_spec
from madqn.errors import CheckpointError, ConfigError, MadqnError, NonFiniteError
from madqn.evaluation import EvalResult, evaluate
from madqn.evaluation.agents import Agents
from madqn.evaluation.eval_hook import EvalHook
from madqn.evaluation.video import VideoHook
from madqn.training.checkpoint import (REPLAY, REPLAY_KIND, CheckpointHook, atomic_write_text,
                                       close_interrupted_episodes, load_run_checkpoint, restore_replay,
                                       restore_trainer, safe_load, truncate_csv)
from madqn.training.distributed import DistributedTrainer
from madqn.training.guard import NumericsGuard
from madqn.training.metrics import CsvWriter, MetricsHook
from madqn.training.progress import EvalProgress, ProgressHook
from madqn.training.signals import NoSignals, StopOnSignal
from madqn.training.tensorboard import TensorBoardHook
from madqn.training.trainer import Hook, Trainer, TrainerBase, default_run_dir, resolve_device

# Config keys a resumed run may change: they do not alter what was learned or how the saved state is read.
RESUME_SAFE_KEYS = ("steps", "device", "num_threads", "prog_freq", "save_freq", "save_replay", "final_eval_episodes",
                    "final_eval_seconds", "eval_freq", "eval_steps", "eval_ep", "eval_opponent")


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    episodes: int
    updates: dict[str, int]  # learner name -> gradient updates done
    wall_time: float  # seconds (this process)
    checkpoint: Path
    recent_scores: dict[str, float]  # agent -> mean raw score over its last (up to 20) training episodes
    stopped_by: str | None = None  # "SIGINT"/"SIGTERM" when a signal stopped the run before config.steps
    resumed_from: int | None = None  # step of the checkpoint this run continued from
    eval_scores: dict[str, float] = field(default_factory=dict)  # agent -> mean raw score of the final evaluation
    evaluation: EvalResult | None = None  # the final evaluation's per-episode scores (None if final_eval_episodes = 0)


def check_run_dir(run_dir: Path, force: bool) -> None:
    """Refuse a run directory that already holds something unless ``force``."""
    if run_dir.exists() and not run_dir.is_dir():
        raise MadqnError(f"run directory {run_dir} exists and is not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        raise MadqnError(f"run directory {run_dir} already exists; use --resume {run_dir} to continue it "
                         "or --force to overwrite it")


def prepare_run_dir(run_dir: Path, force: bool) -> Path:
    run_dir = Path(run_dir)
    check_run_dir(run_dir, force)
    try:
        if run_dir.is_dir() and any(run_dir.iterdir()):
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MadqnError(f"cannot create run directory {run_dir}: {e.strerror or e}") from None
    return run_dir


def resolve_config(config: Config | str | Path | None, overrides: dict[str, Any]) -> Config:
    if isinstance(config, Config):
        try:
            return config.replace(**overrides) if overrides else config
        except TypeError as e:
            raise ConfigError(str(e)) from None
    return make_config(config, overrides)


def resume_config(saved: dict[str, Any], config: Config | str | Path | None, overrides: dict[str, Any],
                  path: Path) -> Config:
    """The saved config with the requested changes, refusing changes that are not resume-safe."""
    try:
        base = Config(**saved)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}: the config saved in the checkpoint is not valid here ({e})") from None
    requested: dict[str, Any] = {}
    if isinstance(config, Config):
        requested.update(config.to_dict())
    elif config is not None:
        requested.update(load_toml(config))
    _check_keys(overrides, "overrides")
    requested.update(overrides)
    wanted = resolve_config(base, requested)
    changed = [f.name for f in fields(Config) if getattr(wanted, f.name) != getattr(base, f.name)]
    unsafe = [k for k in changed if k not in RESUME_SAFE_KEYS]
    if unsafe:
        k = unsafe[0]
        raise ConfigError(f"cannot change '{k}' when resuming (the run has {k} = {getattr(base, k)!r}, requested "
                          f"{getattr(wanted, k)!r}); only {', '.join(RESUME_SAFE_KEYS)} may change; "
                          "start a new run for other changes")
    return wanted


def env_name(env: Any) -> str:
    """What ``config.env`` records for an env given as an object: ``module:function`` when that is an
    importable spec, else the function's or the env's name."""
    module, qualname = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    if module and callable(env) and qualname.isidentifier() and not module.startswith(("madqn_user_env_", "__main__")):
        return f"{module}:{qualname}"
    if hasattr(env, "__name__"):
        return env.__name__
    return str(getattr(env, "metadata", {}).get("name") or type(env).__name__)


def train(env: Any = None, config: Config | str | Path | None = None, *, run_dir: str | Path | None = None,
          resume: str | Path | None = None, force: bool = False, hooks: Iterable[Hook] = (),
          handle_signals: bool = True, **overrides: Any) -> RunResult:
    """Train DQN3.0 agents, or continue a run with ``resume=RUN_DIR``.

    ``env``: a spec string (``pong_v3``, ``pkg.mod:fn``, ``file.py:fn``), a zero-argument callable
    returning a PettingZoo env, or a PettingZoo env; None uses ``config.env``. ``config``: a
    :class:`Config`, a TOML path or None (DQN3.0 defaults); keyword overrides set config fields.
    When resuming, the config comes from the checkpoint and only ``RESUME_SAFE_KEYS`` may change;
    pass ``env`` again when it is not a spec string. ``handle_signals``: SIGINT/SIGTERM stop the run
    gracefully (main thread only). Raises :class:`MadqnError` on bad input, on a diverged run
    (NaN/Inf) and on a failed checkpoint write.
    """
    if resume is not None:
        plan = plan_resume(env, config, overrides, Path(resume), run_dir, force)
    else:
        plan = plan_new_run(env, config, overrides, run_dir, force)
    device = resolve_device(plan.config.device)
    precision, precision_why = describe_precision(plan.config.precision, device)
    cfg = round_steps(plan.config).replace(precision=precision)  # config.toml and the checkpoints record what ran, not "auto"

    guard = NumericsGuard()
    metrics = MetricsHook(plan.run_dir)
    checkpoints = CheckpointHook(plan.run_dir, guard)
    # VideoHook first among the watchers: it checks the env renders; all after metrics (its reports)
    watch = [VideoHook(plan.run_dir), ProgressHook(), TensorBoardHook(plan.run_dir)]
    trainer = build_trainer(cfg, plan.env, [guard, metrics, checkpoints, EvalHook(plan.run_dir), *watch, *hooks])
    try:
        print(start_line(trainer, plan.run_dir, precision_why), flush=True)
        resumed_from = start_run_dir(trainer, plan, checkpoints, force)
        atomic_write_text(plan.run_dir / "config.toml", cfg.to_toml())
        start = time.time()
        with StopOnSignal(trainer) if handle_signals else NoSignals() as stop:
            trainer.run()
        wall_time = time.time() - start
        evaluation = None
        if trainer.step >= cfg.steps and guard.error is None and checkpoints.error is None:
            evaluation = final_evaluation(trainer, plan.env if plan.env is not None else cfg.env, plan.run_dir,
                                          wall_time=wall_time)
    finally:
        trainer.close()
    for error in (guard.error, checkpoints.error):
        if error is not None:
            raise type(error)(f"{error}; {_next_steps(checkpoints, plan.run_dir, error)}")
    return RunResult(
        run_dir=plan.run_dir, steps=trainer.step, episodes=trainer.episodes,
        updates={g.name: g.updates for g in trainer.groups}, wall_time=wall_time,
        checkpoint=checkpoints.path,
        recent_scores={a: sum(d) / len(d) for a, d in metrics.recent.items() if d},
        stopped_by=stop.received if trainer.step < cfg.steps else None,
        resumed_from=resumed_from,
        eval_scores=evaluation.mean_scores() if evaluation is not None else {}, evaluation=evaluation)


@dataclass
class RunPlan:
    """What ``train`` is about to do: the config, the env object (None: ``config.env`` is a spec), the run
    directory and, when resuming, the loaded checkpoint and its path."""

    config: Config
    env: Any
    run_dir: Path
    checkpoint: dict[str, Any] | None = None
    checkpoint_path: Path | None = None


def plan_new_run(env: Any, config: Config | str | Path | None, overrides: dict[str, Any], run_dir: str | Path | None,
                 force: bool) -> RunPlan:
    """A new run: the config with its overrides and env name; the run directory refused early if taken."""
    cfg = resolve_config(config, overrides)
    if isinstance(env, str):
        cfg = cfg.replace(env=env)
        env = None
    elif env is not None:
        cfg = cfg.replace(env=env_name(env))
    run_dir_path = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    check_run_dir(run_dir_path, force)  # refuse before building envs and networks
    return RunPlan(cfg, env, run_dir_path)


def plan_resume(env: Any, config: Config | str | Path | None, overrides: dict[str, Any], run_dir: Path,
                requested_dir: str | Path | None, force: bool) -> RunPlan:
    """Continuing ``run_dir``: its checkpoint, the saved config with the resume-safe changes, checked."""
    if force:
        raise MadqnError("--resume continues a run and --force overwrites one; pass only one of them")
    if requested_dir is not None and Path(requested_dir).resolve() != run_dir.resolve():
        raise MadqnError(f"--run-dir {requested_dir} differs from --resume {run_dir}; "
                         "a resumed run stays in its directory")
    state, ckpt_path = load_run_checkpoint(run_dir)
    if isinstance(env, str):
        overrides = {**overrides, "env": env}
        env = None
    cfg = resume_config(state["config"], config, overrides, ckpt_path)
    if env is None and ":" not in cfg.env and not is_atari_spec(cfg.env):
        raise MadqnError(f"run {run_dir} trained on an env object given in Python ({cfg.env}); "
                         "pass it again: madqn.train(env, resume=...)")
    if cfg.steps <= state["step"]:
        raise MadqnError(f"run {run_dir} already reached step {state['step']} of steps = {cfg.steps}; "
                         f"pass --steps N with N > {state['step']} to train longer")
    return RunPlan(cfg, env, run_dir, state, ckpt_path)


def round_steps(config: Config) -> Config:
    """The in-process trainer advances ``num_envs`` agent steps at a time (one step of every env copy): a
    ``steps`` that is not a multiple of it is rounded up once, with a line saying so, before anything starts
    (the run then ends where it says, and config.toml records what ran)."""
    n, steps = config.num_envs, config.steps
    if config.backend != "local" or steps % n == 0:
        return config
    rounded = -(-steps // n) * n
    print(f"madqn train: steps = {steps} is not a multiple of num_envs = {n} (one step of the {n} env copies is "
          f"{n} agent steps): rounded up to {rounded}", flush=True)
    return config.replace(steps=rounded)


def build_trainer(config: Config, env: Any, hooks: list[Hook]) -> TrainerBase:
    """The in-process trainer, or with ``backend = "process"`` / ``"ray"`` the learner fed by actor processes
    (madqn.training.distributed)."""
    if config.backend in ("process", "ray"):
        return DistributedTrainer(config, env, hooks=hooks, pool=config.backend)
    return Trainer(config, env, hooks=hooks)


def start_run_dir(trainer: TrainerBase, plan: RunPlan, checkpoints: CheckpointHook, force: bool) -> int | None:
    """Restore the checkpoint into ``trainer`` (returns its step), or prepare a new run directory (None)."""
    if plan.checkpoint is None:
        prepare_run_dir(plan.run_dir, force)
        return None
    _restore(trainer, plan.checkpoint, plan.checkpoint_path, plan.run_dir)
    plan.checkpoint = None  # the networks now live in the trainer
    checkpoints.saved_step = trainer.step
    return trainer.step


def start_line(trainer: Trainer, run_dir: Path, precision_why: str) -> str:
    """The run's first line: what trains where, on which device with how many torch threads (and why),
    and the learner's arithmetic (with what ``precision = "auto"`` chose and why)."""
    c = trainer.config
    threads = getattr(trainer, "torch_threads", torch.get_num_threads())
    why = getattr(trainer, "threads_reason", "num_threads" if c.num_threads else "torch's default")
    where = ""
    if c.backend != "local":
        where = f" | acting in {c.actors} {c.backend} actor{'s' if c.actors > 1 else ''}, learning in this process"
    return (f"madqn train: {c.env}, sharing {c.sharing}, seed {c.seed}, {c.steps:,} agent steps -> {run_dir} | "
            f"device {trainer.device}, torch threads {threads} ({why}), precision {c.precision} ({precision_why})"
            f"{', learner compiled (compile = true)' if c.compile else ''}{where}")




def _next_steps(checkpoints: CheckpointHook, run_dir: Path, error: MadqnError) -> str:
    if checkpoints.saved_step is None:
        return "no checkpoint was written"
    where = f"the last good checkpoint ({checkpoints.path}, step {checkpoints.saved_step}) is intact"
    if isinstance(error, NonFiniteError):
        return where
    return f"{where}; fix the cause, then resume with: {resume_command(run_dir)}"


def _restore(trainer: Trainer, state: dict[str, Any], ckpt_path: Path, run_dir: Path) -> None:
    """Load the checkpoint (and the replay memory when saved for the same step) into a fresh trainer."""
    step = int(state["step"])
    exact = restore_trainer(trainer, state, ckpt_path)
    replay_path = ckpt_path.parent / REPLAY
    note = ""
    if replay_path.is_file():
        replay = safe_load(replay_path, kind=REPLAY_KIND, mmap=True)
        if int(replay["step"]) == step:
            restore_replay(trainer, replay, replay_path)
            if not exact:
                close_interrupted_episodes(trainer, state)
        else:
            note = f" ({replay_path.name} is from step {replay['step']}, not {step})"
            replay = None
    else:
        replay = None
    if replay is None:
        trainer.learners.learn_from = step + trainer.config.learn_start
        memory = (f"replay memory not saved{note}: it refills for learn_start = {trainer.config.learn_start} "
                  f"steps, learning resumes after step {trainer.learners.learn_from}")
    else:
        memory = "replay memory restored"
    episodes = "episodes continue" if exact else "the env cannot save its state: fresh episodes start"
    truncate_csv(run_dir / "train.csv", "step", step)
    truncate_csv(run_dir / "episodes.csv", "episode", int(state["episodes"]))
    print(f"resuming {run_dir} at step {step}: {memory}; {episodes}", flush=True)


def final_eval_budget(config: Config, wall_time: float) -> float:
    """Seconds the final evaluation may take: ``final_eval_seconds``, or by default max(60 s, 10% of
    the training wall time), so that a short run is not followed by minutes of evaluation."""
    return config.final_eval_seconds if config.final_eval_seconds > 0 else max(60.0, 0.1 * wall_time)


def final_evaluation(trainer: Trainer, env: Any, run_dir: Path, wall_time: float = 0.0) -> EvalResult | None:
    """``final_eval_episodes`` episodes of the trained networks (epsilon ``eval_ep``, raw scores,
    within ``eval_steps`` agent steps and ``final_eval_budget`` seconds; the episode a budget cuts
    short is dropped), in every seat, on a fresh env (or the given env instance), with a progress
    line per episode, written to ``final_eval.csv``. Seeds differ from the training envs'."""
    cfg = trainer.config
    if cfg.final_eval_episodes == 0:
        return None
    agents = Agents.from_trainer(trainer, seed=cfg.seed)
    seconds = final_eval_budget(cfg, wall_time)
    progress = EvalProgress("final evaluation", episodes=cfg.final_eval_episodes, max_steps=cfg.eval_steps,
                            max_seconds=seconds)
    result = evaluate(env, agents, episodes=cfg.final_eval_episodes, epsilon=cfg.eval_ep,
                      seed=cfg.seed + 1_000_000, max_steps=cfg.eval_steps, max_seconds=seconds, config=cfg,
                      on_episode=progress)
    progress.close()
    if result.stopped_by is not None:
        limit = f"{seconds:.0f} s (final_eval_seconds)" if result.stopped_by == "time" else \
            f"{cfg.eval_steps} agent steps (eval_steps)"
        print(f"final evaluation: {result.episodes} of {cfg.final_eval_episodes} episodes completed within "
              f"{limit}; the cut episode is dropped", flush=True)
    # every seat is played by the trained networks (self-play): the opponent of a seat is the same networks
    writer = CsvWriter(Path(run_dir) / "final_eval.csv",
                       ["episode", "agent", "seat", "opponent", "score", "length", "epsilon", "step"])
    for k in range(result.episodes):
        for a in result.agents:
            writer.write({"episode": k + 1, "agent": a, "seat": a, "opponent": "self", "score": result.scores[a][k],
                          "length": result.lengths[a][k], "epsilon": cfg.eval_ep, "step": trainer.step})
    writer.close()
    return result
