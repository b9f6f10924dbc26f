"""An opponent pool for self-play: past versions of the networks that some seats play against.

Self-play against only the current network can lock into one matchup: in boxing_v2 the shared network's
second seat learned to pin the first, and the first seat, which lost every self-play game, never learned
(docs/results.md). The pool is the league idea of AlphaStar and OpenAI Five reduced to what DQN needs:

- every ``pool_every`` agent steps the acting networks' weights are copied into the pool (at most
  ``pool_size`` snapshots; the oldest is dropped);
- at each episode start of an env copy, with probability ``pool_prob``, one seat drawn uniformly is played
  by a snapshot for the whole episode, greedy up to ``eval_ep`` (the evaluation epsilon: a snapshot is a
  fixed opponent, not a learner exploring);
- the snapshot is drawn uniformly (``pool_sampling = "uniform"``) or by prioritized fictitious self-play
  (``"pfsp"``, AlphaStar): with weight ``(1 - p)^2``, ``p`` the current networks' points per game against
  that snapshot so far (win 1, draw 1/2; a snapshot not yet played counts as ``p = 1/2``), so the
  opponents the networks beat least are met most.

With actor processes (``backend = "process"`` or ``"ray"``) the learner's pool is the run's: it takes the
snapshots from the learner's online networks, counts the results from the episodes the actors report, and
sends each actor what it lacks with its next call (:meth:`OpponentPool.changes`, :meth:`OpponentPool.apply`):
the snapshots it does not hold yet (once each), which ones are kept, and the current statistics, so that
every actor draws from the same snapshots with the same probabilities and a checkpoint holds them all.

The snapshot seat's transitions are stored in the replay like every other seat's, as those of a seat playing
at random (``random_opponent``) are: Q-learning learns off-policy, the frames and rewards of that seat are
real experience of the game, and the replay ratio (samples per agent step) stays that of a run without the
pool. Its episode scores are not the networks' (``episodes.csv``'s ``snapshot_step`` column names the
snapshot; recent scores, plots and TensorBoard leave those seats out).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

SAMPLINGS = ("uniform", "pfsp")


@dataclass
class Snapshot:
    step: int  # the agent step the weights were copied at
    weights: list[dict[str, torch.Tensor]]  # one state dict per learner (CPU)
    games: int = 0  # episodes it played against the current networks
    points: float = 0.0  # the current networks' points in those games (win 1, draw 1/2)
    networks: list[torch.nn.Module] = field(default_factory=list, repr=False)  # built on first use

    def win_rate(self) -> float:
        """The current networks' points per game against this snapshot, with one drawn game added (so 1/2
        before it has played, and never exactly 0 or 1)."""
        return (self.points + 0.5) / (self.games + 1)


class OpponentPool:
    def __init__(self, every: int, size: int, sampling: str = "uniform"):
        if sampling not in SAMPLINGS:
            raise ValueError(f"pool_sampling must be one of {SAMPLINGS}, got {sampling!r}")
        self.every, self.size, self.sampling = int(every), int(size), sampling
        self.snapshots: list[Snapshot] = []

    def __len__(self) -> int:
        return len(self.snapshots)

    # ---- schedule ---------------------------------------------------------------------------------
    def due(self, prev: int, step: int) -> bool:
        """Whether the agent step count crossed a multiple of ``every`` going from ``prev`` to ``step``."""
        return self.every > 0 and step // self.every > prev // self.every

    def add(self, step: int, networks: Sequence[torch.nn.Module]) -> None:
        """Copy the networks' weights (to the CPU) as the snapshot of ``step``; drop the oldest beyond ``size``."""
        weights = [{k: v.detach().to("cpu", copy=True) for k, v in n.state_dict().items()} for n in networks]
        self.snapshots.append(Snapshot(int(step), weights))
        del self.snapshots[:-self.size]

    # ---- drawing an opponent ----------------------------------------------------------------------
    def probabilities(self) -> np.ndarray:
        if not self.snapshots:
            return np.zeros(0)
        if self.sampling == "uniform":
            w = np.ones(len(self.snapshots))
        else:
            w = np.array([(1.0 - s.win_rate()) ** 2 for s in self.snapshots])
            if w.sum() <= 0:  # the networks beat every snapshot every time: all equally likely
                w = np.ones(len(self.snapshots))
        return w / w.sum()

    def draw(self, rng: np.random.Generator) -> int:
        """The step of a snapshot drawn with :meth:`probabilities`."""
        return self.snapshots[int(rng.choice(len(self.snapshots), p=self.probabilities()))].step

    def get(self, step: int) -> Snapshot | None:
        return next((s for s in self.snapshots if s.step == step), None)

    def networks(self, step: int, like: Sequence[torch.nn.Module]) -> list[torch.nn.Module] | None:
        """The snapshot's networks (copies of ``like`` with its weights, in eval mode); None once dropped."""
        snap = self.get(step)
        if snap is None:
            return None
        if not snap.networks:
            for net, weights in zip(like, snap.weights):
                clone = copy.deepcopy(net).to("cpu").float()
                clone.load_state_dict(weights)
                snap.networks.append(clone.eval().requires_grad_(False))
        return snap.networks

    def record(self, scores: dict[str, float], snapshot_seats: dict[str, int], other_seats: Sequence[str] = ()) -> None:
        """An episode ended with these ``scores``: when snapshots played some seats (``snapshot_seats``: seat ->
        snapshot step), the current networks' points against that snapshot (win 1, draw 1/2, loss 0: their mean
        score against the snapshot seats' mean) go to its statistics. ``other_seats`` (random players) count
        for neither side."""
        if not snapshot_seats:
            return
        ours = [s for a, s in scores.items() if a not in snapshot_seats and a not in other_seats]
        if not ours:
            return
        theirs = float(np.mean([scores[a] for a in snapshot_seats]))
        mine = float(np.mean(ours))
        self.result(next(iter(snapshot_seats.values())), 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0)

    def result(self, step: int, points: float) -> None:
        """An episode against snapshot ``step`` ended with the current networks earning ``points`` (1, 1/2, 0)."""
        snap = self.get(step)
        if snap is not None:  # it may have been dropped while the episode ran
            snap.games += 1
            snap.points += float(points)

    # ---- the learner's pool, sent to actor processes -------------------------------------------------
    def steps(self) -> tuple[int, ...]:
        return tuple(s.step for s in self.snapshots)

    def changes(self, held: Sequence[int]) -> dict[str, Any]:
        """What an actor pool holding the snapshots ``held`` (steps) needs to equal this one: the weights of
        the snapshots it lacks, the steps kept, and every snapshot's statistics."""
        held = set(held)
        return {"keep": list(self.steps()),
                "new": [{"step": s.step, "weights": s.weights} for s in self.snapshots if s.step not in held],
                "stats": [(s.step, s.games, s.points) for s in self.snapshots]}

    def apply(self, changes: dict[str, Any]) -> None:
        """Take :meth:`changes` of the learner's pool: drop what it dropped, add what it sent, take its
        statistics. A kept snapshot neither held nor sent (a call sent before a restart) stays out until a
        later call brings it."""
        new = {n["step"]: n["weights"] for n in changes["new"]}
        held = {s.step: s for s in self.snapshots}
        self.snapshots = [held[step] if step in held else Snapshot(int(step), new[step])
                          for step in changes["keep"] if step in held or step in new]
        stats = {step: (games, points) for step, games, points in changes["stats"]}
        for s in self.snapshots:
            s.games, s.points = int(stats[s.step][0]), float(stats[s.step][1])

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"snapshots": [{"step": s.step, "weights": s.weights, "games": s.games, "points": s.points}
                              for s in self.snapshots]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.snapshots = [Snapshot(int(s["step"]), [{k: torch.as_tensor(v) for k, v in w.items()} for w in s["weights"]],
                                   int(s["games"]), float(s["points"])) for s in state["snapshots"]]
