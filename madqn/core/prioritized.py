"""Proportional prioritized replay (Schaul et al. 2016): the sum-tree and the pure maths around it.

A transition i is drawn with probability P(i) = p_i / sum_k p_k, where p_i = (|clipped delta_i| +
eps) ** alpha after each of its updates, and new transitions get the largest priority seen so far.
The gradient of row i is scaled by its importance weight w_i = (N P(i)) ** -beta / max_j w_j
(max over the minibatch), beta annealed from beta_0 to 1 over the run. ``madqn.core.replay.ReplayMemory``
holds one :class:`SumTree` over all of its streams (one per learner).
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Priorities of ``n_leaves`` items in a complete binary tree stored in one float32 array.

    ``nodes[1]`` is the root, node k has children 2k and 2k+1, leaf i is ``nodes[size + i]`` with
    ``size`` the next power of two >= n_leaves (padding leaves stay 0). A parent is always RECOMPUTED
    as the sum of its two children (never incremented), so float32 rounding cannot accumulate over a
    run. Memory: 2 * size * 4 bytes, at most 16 bytes per leaf (8 when n_leaves is a power of two).
    Sampling (``find``) and updates (``set``) touch one root-to-leaf path per item: O(log n).
    """

    def __init__(self, n_leaves: int):
        if n_leaves < 1:
            raise ValueError(f"a sum-tree needs >= 1 leaf, got {n_leaves}")
        self.n_leaves = int(n_leaves)
        self.size = 1 << (self.n_leaves - 1).bit_length()
        self.depth = self.size.bit_length() - 1  # edges from the root to a leaf
        self.nodes = np.zeros(2 * self.size, dtype=np.float32)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, leaves) -> np.ndarray:
        return self.nodes[self.size + np.asarray(leaves, dtype=np.int64)]

    def set(self, leaves, values) -> None:
        """Set leaf priorities and recompute the sums on their paths to the root (level by level)."""
        idx = self.size + np.asarray(leaves, dtype=np.int64).ravel()
        self.nodes[idx] = np.asarray(values, dtype=np.float32).ravel()
        for _ in range(self.depth):
            # a node repeated in idx is written twice with the same sum of its (already final) children
            idx = idx >> 1
            self.nodes[idx] = self.nodes[2 * idx] + self.nodes[2 * idx + 1]

    def set_one(self, leaf: int, value: float) -> None:
        """``set`` for one leaf without numpy array overhead (called once per replay write)."""
        nodes = self.nodes
        k = self.size + int(leaf)
        nodes[k] = value
        k >>= 1
        while k:
            nodes[k] = nodes[2 * k] + nodes[2 * k + 1]
            k >>= 1

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target t in [0, total): the leaf i with prefix(i) <= t < prefix(i) + p_i, where
        prefix(i) is the sum of the leaves before i. Vectorised descent, O(len(targets) log n)."""
        t = np.asarray(targets, dtype=np.float64).copy()
        idx = np.ones(len(t), dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * idx
            left_sum = self.nodes[left]
            right = t >= left_sum
            t -= np.where(right, left_sum, 0.0)
            idx = left + right
        return idx - self.size

    def sample(self, batch_size: int, rng: np.random.Generator, stratified: bool = True) -> np.ndarray:
        """``batch_size`` leaves drawn proportionally to their priorities, with replacement.

        ``stratified`` (Schaul et al.): one uniform draw in each of ``batch_size`` equal slices of
        [0, total) — each draw, averaged over the slices, still has P(i) = p_i / total.
        """
        total = self.total
        u = rng.random(batch_size)
        if stratified:
            u = (np.arange(batch_size) + u) / batch_size
        return self.find(u * total)


def importance_weights(probabilities: np.ndarray, beta: float) -> np.ndarray:
    """w_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta over the minibatch; N cancels, leaving
    (P(i) / min_j P(j)) ** -beta. float32, in (0, 1], the largest weight 1 (the rarest row)."""
    p = np.asarray(probabilities, dtype=np.float64)
    return ((p / p.min()) ** -beta).astype(np.float32)


def annealed_beta(step: int, *, beta_start: float, learn_start: int, anneal_steps: int) -> float:
    """beta rises linearly from ``beta_start`` at learn_start to 1 ``anneal_steps`` later [agent steps]."""
    if anneal_steps <= 0:
        return 1.0
    frac = min(1.0, max(0, step - learn_start) / anneal_steps)
    return beta_start + (1.0 - beta_start) * frac


def priorities(deltas: np.ndarray, *, alpha: float, eps: float) -> np.ndarray:
    """Leaf values (|clipped delta| + eps) ** alpha."""
    return (np.abs(np.asarray(deltas, dtype=np.float64)) + eps) ** alpha
