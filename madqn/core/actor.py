"""Acting: DQN3.0's epsilon schedule, per-agent recent history, epsilon-greedy over legal actions.

The actor owns no replay and no optimizer: it turns observations into actions. With a shared
network several agents are batched into one forward pass; each agent keeps its own history.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def linear_epsilon(step: int, *, ep_start: float, ep_end: float, ep_endt: int, learn_start: int) -> float:
    """DQN3.0 training epsilon: ep_start until learn_start, linear to ep_end over ep_endt steps, then ep_end.

    ``ep_end + max(0, (ep_start - ep_end) * (ep_endt - max(0, step - learn_start)) / ep_endt)``.
    """
    return ep_end + max(0.0, (ep_start - ep_end) * (ep_endt - max(0, step - learn_start)) / ep_endt)


class RecentHistory:
    """The last ``hist_len`` observations of one agent, oldest first; starts (and restarts) as zeros.

    DQN3.0's "recent" memory: at an episode start the missing older frames are zero, not repeats.
    """

    def __init__(self, hist_len: int, frame_shape: tuple[int, ...], dtype=np.uint8):
        self.frames = np.zeros((hist_len, *frame_shape), dtype=dtype)

    def reset(self) -> None:
        self.frames[:] = 0

    def push(self, frame: np.ndarray) -> None:
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = frame

    def state(self) -> np.ndarray:
        return self.frames


def epsilon_greedy(
    q_fn: Callable[[np.ndarray], np.ndarray],
    batch_size: int,
    epsilon: float | np.ndarray,
    rng: np.random.Generator,
    n_actions: int,
    legal_masks: np.ndarray | None = None,
) -> np.ndarray:
    """Choose ``batch_size`` actions.

    With probability epsilon an action uniform over the legal ones, otherwise the greedy action with
    ties broken uniformly at random (DQN3.0). ``q_fn(rows)`` returns Q-values (len(rows), n_actions)
    for the given row indices; it is only called for the greedy rows, so fully random phases (before
    learn_start) cost no forward pass. Illegal actions (``legal_masks`` False) are never chosen.
    """
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (batch_size,))
    explore = rng.random(batch_size) < eps
    legal = np.ones((batch_size, n_actions), dtype=bool) if legal_masks is None else np.asarray(legal_masks, bool)
    if not legal.any(axis=1).all():
        raise ValueError("an agent has no legal action")
    # random scores break ties uniformly: the chosen action is the argmax of (is_candidate, noise)
    noise = rng.random((batch_size, n_actions))
    candidates = legal.copy()
    greedy_rows = np.flatnonzero(~explore)
    if greedy_rows.size:
        q = np.asarray(q_fn(greedy_rows), dtype=np.float64)
        q = np.where(legal[greedy_rows], q, -np.inf)
        candidates[greedy_rows] = q == q.max(axis=1, keepdims=True)
    return np.argmax(np.where(candidates, noise, -1.0), axis=1)
