"""DQN3.0's periodic evaluation and validation statistics, as a training hook.

Every ``eval_freq`` agent steps the current online networks play ``eval_steps`` agent steps at
epsilon ``eval_ep`` in their own env copy (no life-loss terminals), on raw scores, dropping the
episode the budget cuts short (DQN3.0 ``train_agent``). With ``eval_opponent = "random"`` (the
multiplayer-ALE protocol, ``madqn.evaluation.protocol.vs_random``) the budget is split between the seats: each
seat in turn is played by the trained agents against random others; with ``"self"`` the trained
agents play every seat. The evaluation's score is the mean over seats of each seat's mean episode
score; the network with the best score so far is kept as ``checkpoints/best.pt`` (a full checkpoint
with a ``best`` entry: step and score), written atomically. (In zero-sum self-play the seats' scores
cancel, so ``"self"`` does not rank networks there; ``"random"`` does.)

Validation (DQN3.0 ``NeuralQLearner:compute_validation_statistics``): ``valid_size`` transitions
are drawn once from each learner's replay memory when learning starts; after each evaluation
V = mean max_a Q_target(s2, a) and the mean |clipped delta| over them are reported (``Learner.td_error``: the
learner's own computation, Double DQN and precision included), with two signs of a
network that has stopped reading its input (``network_health``): the spread of Q across the states, and the
smallest fraction of a ReLU layer's units active on any of them (a warning is printed when a layer is dead).

Files: ``eval.csv`` (one row per seat per evaluation: episodes, mean, std, 95% CI, mean length),
``eval_episodes.csv`` (the raw rows of ``madqn.evaluation.protocol`` with the step), ``valid.csv`` (one row
per learner per evaluation). Scalars: ``eval/score``, ``eval/score/<seat>``, ``valid/V/<learner>``,
``valid/td_error/<learner>``, ``valid/q_state_std/<learner>``, ``valid/active/<learner>/<layer>``.
Training is unchanged by evaluating: the env copy, the policies' and the validation draw's random
generators are their own (seeded from ``seed``), networks run under ``no_grad``. A resumed run drops rows
written after its checkpoint and redraws the validation set.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from madqn.core.learner import Learner
from madqn.envs.adapters import is_pettingzoo_env, make_env
from madqn.errors import CheckpointError
from madqn.evaluation.agents import Agents
from madqn.evaluation.protocol import (Player, ROW_FIELDS, SELF, VS_RANDOM, length_summary, score_summary, self_play,
                                       vs_random)
from madqn.training.checkpoint import atomic_save, safe_load, trainer_state, truncate_csv
from madqn.training.guard import find_non_finite
from madqn.training.metrics import CsvWriter
from madqn.training.progress import EvalProgress
from madqn.training.trainer import Hook, Trainer

BEST = "best.pt"
EVAL_FIELDS = ["step", "seat", "opponent", "episodes", "mean", "std", "ci_low", "ci_high", "length_mean", "epsilon",
               "wall_time"]
VALID_FIELDS = ["step", "learner", "V", "td_error", "size", "q_state_std", "min_active"]
EVAL_SEED_OFFSET = 2_000_000  # evaluation episodes use seeds seed + 2e6 + k (the training envs use seed + 1000 i)
VALID_SEED_OFFSET = 3_000_017


@dataclass
class ValidationSet:
    """Held-out transitions of one learner, as tensors on its device."""

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    terminals: torch.Tensor
    agent_ids: torch.Tensor
    next_action_masks: torch.Tensor | None

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def draw_validation_set(group: Any, size: int, rng: np.random.Generator, device: torch.device) -> ValidationSet:
    """``size`` transitions from ``group.replay`` drawn with ``rng`` (the training sampler's generator is untouched)."""
    batch = group.replay.sample(size, rng=rng, dqn3=True)  # uniform 1-step transitions, whatever the options

    def t(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.array(x), device=device)

    return ValidationSet(t(batch.states), t(batch.actions), t(batch.rewards), t(batch.next_states), t(batch.terminals),
                         t(group.stream_agent_ids[batch.streams]),
                         None if batch.next_action_masks is None else t(batch.next_action_masks))


def validation_statistics(learner: Learner, valid: ValidationSet, chunk: int = 256) -> tuple[float, float]:
    """(V, TD error): mean bootstrap value q2_max and mean |clipped delta| over ``valid`` (DQN3.0's v_avg, tderr_avg).

    Both are the learner's own (``Learner.td_error``: what ``update`` computes, with its target network,
    Double DQN, precision, discount, clipping and reward scaling), without a gradient.
    """
    q2_sum, delta_sum = 0.0, 0.0
    for lo in range(0, len(valid), chunk):
        sl = slice(lo, lo + chunk)
        delta, q2_max = learner.td_error(
            valid.states[sl], valid.actions[sl], valid.rewards[sl], valid.next_states[sl], valid.terminals[sl],
            agent_ids=valid.agent_ids[sl],
            next_action_masks=None if valid.next_action_masks is None else valid.next_action_masks[sl])
        q2_sum += float(q2_max.double().sum())
        delta_sum += float(delta.abs().double().sum())
    return q2_sum / len(valid), delta_sum / len(valid)


def q_state_spread(q: torch.Tensor, agent_ids: torch.Tensor | None) -> float:
    """Standard deviation of Q(s, a) (rows: states) over the states, averaged over the actions; with
    ``agent_ids``, within each agent's rows, averaged over the agents with two or more rows, weighted by
    their rows. NaN when no group has two rows."""
    groups = [q] if agent_ids is None else [q[agent_ids == k] for k in torch.unique(agent_ids)]
    groups = [g for g in groups if len(g) > 1]
    if not groups:
        return math.nan
    return float(sum(len(g) * g.std(dim=0).mean() for g in groups) / sum(len(g) for g in groups))


def network_health(learner: Learner, valid: ValidationSet, chunk: int = 256) -> tuple[float, dict[str, float]]:
    """(Q spread across states, unit activity) of the online network on ``valid``'s states.

    The spread is the standard deviation of Q(s, a) over the states, averaged over the actions: 0 when the
    network's output no longer depends on its input. A shared network's spread is taken within each agent's
    states and averaged over the agents (weighted by their states): the gap between the agents' values,
    which the agent indicator alone can produce, is not a response to the frames. The activity (conv
    networks; {} otherwise) is, per ReLU layer, the fraction of units active on at least one state
    (``DQN3ConvNet.unit_activity``).
    """
    net = learner.online_network
    ids = valid.agent_ids if learner.uses_agent_ids else None
    with torch.no_grad():
        q = torch.cat([net(valid.states[lo:lo + chunk], None if ids is None else ids[lo:lo + chunk]).double()
                       for lo in range(0, len(valid), chunk)])
    spread = q_state_spread(q, ids)
    return spread, (net.unit_activity(valid.states, ids) if hasattr(net, "unit_activity") else {})


class EvalHook(Hook):
    """Periodic evaluation, validation statistics and the best-network checkpoint (see the module docstring)."""

    def __init__(self, run_dir: Path, out: Any = None):
        self.run_dir = Path(run_dir)
        self.out = out
        self.env = None
        self.valid: dict[str, ValidationSet] = {}
        self.best_score = -math.inf
        self.best_step: int | None = None
        self.history: list[tuple[int, float]] = []  # (step, score) of the evaluations of this process
        self.writers: dict[str, CsvWriter] = {}

    # ---- lifecycle ----------------------------------------------------------------------------
    def on_start(self, trainer: Trainer) -> None:
        c = trainer.config
        if c.eval_freq == 0:
            return
        if is_pettingzoo_env(trainer.env_spec):
            self._print("madqn: eval_freq is ignored: periodic evaluation needs the env as a spec string or a "
                        "factory (a function returning the env), not an env instance")
            return
        self.env = make_env(trainer.env_spec, c.replace(terminal_on_life_loss=False),
                            seed=c.seed + EVAL_SEED_OFFSET, convert=False)
        for name, key in (("eval.csv", "step"), ("eval_episodes.csv", "step"), ("valid.csv", "step")):
            truncate_csv(self.run_dir / name, key, trainer.step)
        self.writers = {"eval": CsvWriter(self.run_dir / "eval.csv", EVAL_FIELDS),
                        "episodes": CsvWriter(self.run_dir / "eval_episodes.csv", ["step", *ROW_FIELDS]),
                        "valid": CsvWriter(self.run_dir / "valid.csv", VALID_FIELDS)}
        best = self.run_dir / "checkpoints" / BEST
        if best.is_file():
            try:
                meta = safe_load(best, mmap=True).get("best", {})
                self.best_score, self.best_step = float(meta["score"]), int(meta["step"])
            except (CheckpointError, KeyError, TypeError, ValueError):
                self._print(f"madqn: {best} is unreadable; the next evaluation replaces it")
        self.valid_rng = np.random.default_rng(c.seed + VALID_SEED_OFFSET)
        self.next_eval = (trainer.step // c.eval_freq + 1) * c.eval_freq

    def on_step(self, trainer: Trainer) -> None:
        if self.env is None:
            return
        c = trainer.config
        if c.valid_size > 0 and not self.valid and trainer.step > trainer.learners.learn_from:
            try:
                self.valid = {g.name: draw_validation_set(g, c.valid_size, self.valid_rng, trainer.device)
                              for g in trainer.groups}
            except ValueError:  # no valid transition stored yet
                self.valid = {}
        if trainer.step >= self.next_eval:
            self.evaluate(trainer)
            self.next_eval = (trainer.step // c.eval_freq + 1) * c.eval_freq

    def on_end(self, trainer: Trainer) -> None:
        for w in self.writers.values():
            w.close()
        self.writers = {}
        if self.env is not None:
            self.env.close()
            self.env = None

    # ---- one evaluation -----------------------------------------------------------------------
    def evaluate(self, trainer: Trainer) -> float:
        """Evaluate now; returns the score (NaN when a seat completed no episode within the budget)."""
        c = trainer.config
        seed = c.seed + EVAL_SEED_OFFSET
        seats = list(trainer.agents)
        player = Player("trained", Agents.from_trainer(trainer, seed=seed))
        networks = [g.learner.online_network for g in trainer.groups]
        modes = [n.training for n in networks]
        for n in networks:
            n.eval()
        budget = max(1, c.eval_steps // len(seats)) if c.eval_opponent == "random" else c.eval_steps
        progress = EvalProgress(f"eval step {trainer.step} ({c.eval_opponent})",
                                max_steps=budget * (len(seats) if c.eval_opponent == "random" else 1),
                                out=self.out, interval_s=10.0)
        try:
            if c.eval_opponent == "random":
                rows = vs_random(self.env, player, episodes=budget, epsilon=c.eval_ep, seed=seed, baseline=False,
                                 max_steps=budget, config=c, on_episode=progress)
                match = VS_RANDOM
            else:
                rows = self_play(self.env, player, episodes=c.eval_steps, epsilon=c.eval_ep, seed=seed,
                                 max_steps=c.eval_steps, config=c, on_episode=progress)
                match = SELF
        finally:
            for n, mode in zip(networks, modes):
                n.train(mode)
        progress.close()
        wall = round(time.time() - trainer.start_time, 3)
        for r in rows:
            self.writers["episodes"].write({"step": trainer.step, **r})
        means = {}
        for seat in seats:
            where = {"match": match, "seat": seat}
            s = score_summary(rows, "trained", **where)
            means[seat] = s.mean
            self.writers["eval"].write({"step": trainer.step, "seat": seat, "opponent": c.eval_opponent,
                                        "episodes": s.n, "mean": s.mean, "std": s.std, "ci_low": s.ci_low,
                                        "ci_high": s.ci_high, "length_mean": length_summary(rows, **where).mean,
                                        "epsilon": c.eval_ep, "wall_time": wall})
        score = float(np.mean(list(means.values()))) if all(math.isfinite(m) for m in means.values()) else math.nan
        scalars = {f"eval/score/{seat}": m for seat, m in means.items()}
        scalars["eval/score"] = score
        parts = [f"eval step {trainer.step} ({c.eval_opponent}): " +
                 ", ".join(f"{seat} {m:.3g}" for seat, m in means.items())]
        for g in trainer.groups:
            if g.name in self.valid:
                v, td = validation_statistics(g.learner, self.valid[g.name])
                spread, active = network_health(g.learner, self.valid[g.name])
                self.writers["valid"].write({"step": trainer.step, "learner": g.name, "V": v, "td_error": td,
                                             "size": len(self.valid[g.name]), "q_state_std": spread,
                                             "min_active": min(active.values()) if active else ""})
                scalars[f"valid/V/{g.name}"], scalars[f"valid/td_error/{g.name}"] = v, td
                scalars[f"valid/q_state_std/{g.name}"] = spread
                scalars.update({f"valid/active/{g.name}/{layer}": frac for layer, frac in active.items()})
                parts.append(f"{g.name}: V {v:.4g} td_error {td:.4g}")
                dead = [layer for layer, frac in active.items() if frac == 0.0]
                if dead:
                    n = len(self.valid[g.name])
                    self._print(f"madqn: warning: learner {g.name}: no unit of {', '.join(dead)} is active on any of the "
                                f"{n} validation states, so its Q-values no longer depend on the state and no gradient "
                                "reaches the layers below (dying ReLUs): this network cannot learn any more; "
                                "docs/results.md shows how this happens and what prevents it")
        if math.isfinite(score) and score > self.best_score and self._save_best(trainer, score):
            parts.append(f"new best {score:.3g} -> {self.run_dir / 'checkpoints' / BEST}")
        self.history.append((trainer.step, score))
        trainer.log_scalars(scalars)
        self._print(" | ".join(parts))
        return score

    def _save_best(self, trainer: Trainer, score: float) -> bool:
        if find_non_finite(trainer) is not None:  # the guard stops the run; never keep such weights
            return False
        state = trainer_state(trainer)
        state["best"] = {"step": int(trainer.step), "score": float(score)}
        directory = self.run_dir / "checkpoints"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomic_save(state, directory / BEST)
        except OSError as e:
            self._print(f"madqn: cannot write {directory / BEST} ({e.strerror or e}); the previous best is kept")
            return False
        self.best_score, self.best_step = score, int(trainer.step)
        return True

    def _print(self, line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=self.out if self.out is not None else sys.stdout)
