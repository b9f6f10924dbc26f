"""Library entry point: ``madqn.train(env, config, run_dir=...)`` returns a :class:`RunResult`."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from madqn.checkpoint import atomic_save, trainer_state, replay_state
from madqn.config import Config, make_config
from madqn.errors import MadqnError
from madqn.evaluation import EvalResult, evaluate
from madqn.metrics import MetricsHook
from madqn.runner import Hook, Trainer, default_run_dir


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    episodes: int
    updates: dict[str, int]  # learner name -> gradient updates done
    wall_time: float  # seconds
    checkpoint: Path
    recent_scores: dict[str, float]  # agent -> mean raw score over its last (up to 20) training episodes
    eval_scores: dict[str, float] = field(default_factory=dict)  # agent -> mean raw score of the final evaluation
    evaluation: EvalResult | None = None  # the final evaluation's per-episode scores (None if final_eval_episodes = 0)


class CheckpointHook(Hook):
    """Saves ``checkpoints/latest.pt`` every ``save_freq`` agent steps and at the end of the run."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "checkpoints"

    def on_start(self, trainer: Trainer) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.next_save = (trainer.step // trainer.config.save_freq + 1) * trainer.config.save_freq

    def on_step(self, trainer: Trainer) -> None:
        if trainer.step >= self.next_save:
            self.save(trainer)
            self.next_save = (trainer.step // trainer.config.save_freq + 1) * trainer.config.save_freq

    def on_end(self, trainer: Trainer) -> None:
        self.save(trainer)

    def save(self, trainer: Trainer) -> None:
        if trainer.config.save_replay:
            atomic_save(replay_state(trainer), self.dir / "replay.pt")
        atomic_save(trainer_state(trainer), self.dir / "latest.pt")


def prepare_run_dir(run_dir: Path, force: bool) -> Path:
    run_dir = Path(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise MadqnError(f"run directory {run_dir} already exists; use --resume {run_dir} to continue it "
                             "or --force to overwrite it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def resolve_config(config: Config | str | Path | None, overrides: dict[str, Any]) -> Config:
    if isinstance(config, Config):
        return config.replace(**overrides) if overrides else config
    return make_config(config, overrides)


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
          force: bool = False, hooks: Iterable[Hook] = (), **overrides: Any) -> RunResult:
    """Train DQN3.0 agents.

    ``env``: a spec string (``pong_v3``, ``pkg.mod:fn``, ``file.py:fn``), a zero-argument callable
    returning a PettingZoo env, or a PettingZoo env; None uses ``config.env``. ``config``: a
    :class:`Config`, a TOML path or None (DQN3.0 defaults); keyword overrides set config fields.
    """
    cfg = resolve_config(config, overrides)
    if isinstance(env, str):
        cfg = cfg.replace(env=env)
        env = None
    elif env is not None:
        cfg = cfg.replace(env=env_name(env))
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    metrics = MetricsHook(run_dir)
    checkpoints = CheckpointHook(run_dir)
    trainer = Trainer(cfg, env, hooks=[metrics, checkpoints, *hooks])  # a bad env fails before the run dir is touched
    try:
        prepare_run_dir(run_dir, force)
    except BaseException:
        trainer.close()
        raise
    (run_dir / "config.toml").write_text(cfg.to_toml())
    start = time.time()
    try:
        trainer.run()
        wall_time = time.time() - start
        evaluation = final_evaluation(trainer, env if env is not None else cfg.env, run_dir)
    finally:
        trainer.close()
    return RunResult(
        run_dir=run_dir, steps=trainer.step, episodes=trainer.episodes,
        updates={g.name: g.updates for g in trainer.groups}, wall_time=wall_time,
        checkpoint=checkpoints.dir / "latest.pt",
        recent_scores={a: sum(d) / len(d) for a, d in metrics.recent.items() if d},
        eval_scores=evaluation.mean_scores() if evaluation is not None else {}, evaluation=evaluation)


def final_evaluation(trainer: Trainer, env: Any, run_dir: Path) -> EvalResult | None:
    """``final_eval_episodes`` episodes of the trained networks (epsilon ``eval_ep``, raw scores,
    within ``eval_steps`` agent steps) on a fresh env (or the given env instance), written to
    ``final_eval.csv``. Seeds differ from the training envs'."""
    from madqn.agents import Agents
    from madqn.metrics import CsvWriter

    cfg = trainer.config
    if cfg.final_eval_episodes == 0:
        return None
    agents = Agents.from_trainer(trainer, seed=cfg.seed)
    result = evaluate(env, agents, episodes=cfg.final_eval_episodes, epsilon=cfg.eval_ep,
                      seed=cfg.seed + 1_000_000, max_steps=cfg.eval_steps, config=cfg)
    writer = CsvWriter(Path(run_dir) / "final_eval.csv", ["episode", "agent", "score", "length", "epsilon", "step"])
    for k in range(result.episodes):
        for a in result.agents:
            writer.write({"episode": k + 1, "agent": a, "score": result.scores[a][k], "length": result.lengths[a][k],
                          "epsilon": cfg.eval_ep, "step": trainer.step})
    writer.close()
    return result
