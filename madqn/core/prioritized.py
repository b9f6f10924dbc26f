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

    Writes are deferred: ``set`` / ``set_one`` store the leaves at once and remember them; the sums on
    their paths are recomputed, bottom-up and each shared ancestor once, when a sum is next read
    (``total``, ``find``, ``sample``, ``nodes``, ``flush``). The replay writes two leaves per ``add`` and
    reads sums only when it samples, so an ``add`` costs two array stores instead of two root-to-leaf
    walks. Each sum is recomputed from its children after they are final, so the tree is bit for bit
    the one an immediate walk per write gives (and one built from scratch from the same leaves).
    """

    # at most this many pending leaves are propagated by a plain loop over their distinct ancestors;
    # more go level by level through numpy (a few array operations per level, whatever their number)
    _LOOP_MAX = 16

    def __init__(self, n_leaves: int):
        if n_leaves < 1:
            raise ValueError(f"a sum-tree needs >= 1 leaf, got {n_leaves}")
        self.n_leaves = int(n_leaves)
        self.size = 1 << (self.n_leaves - 1).bit_length()
        self.depth = self.size.bit_length() - 1  # edges from the root to a leaf
        self._nodes = np.zeros(2 * self.size, dtype=np.float32)
        self._pending: set[int] = set()  # node numbers of leaves written since the sums were last recomputed

    @property
    def nodes(self) -> np.ndarray:
        """The whole tree (sums up to date): node k at ``nodes[k]``, leaves from ``nodes[size]``."""
        self.flush()
        return self._nodes

    @property
    def total(self) -> float:
        self.flush()
        return float(self._nodes[1])

    def get(self, leaves) -> np.ndarray:
        return self._nodes[self.size + np.asarray(leaves, dtype=np.int64)]

    def set(self, leaves, values) -> None:
        """Set leaf priorities (the sums above them follow on the next read)."""
        idx = self.size + np.asarray(leaves, dtype=np.int64).ravel()
        self._nodes[idx] = np.asarray(values, dtype=np.float32).ravel()
        self._pending.update(idx.tolist())

    def set_one(self, leaf: int, value: float) -> None:
        """``set`` for one leaf without numpy array overhead (called twice per replay write)."""
        k = self.size + int(leaf)
        self._nodes[k] = value
        self._pending.add(k)

    def flush(self) -> None:
        """Recompute the sums above the leaves written since the last flush, each from its two children."""
        pending = self._pending
        if not pending:
            return
        self._pending = set()
        nodes = self._nodes
        if len(pending) <= self._LOOP_MAX:
            # Python floats through a memoryview: a float32 sum rounded from double equals numpy's float32 sum
            view = memoryview(nodes)
            level = pending
            for _ in range(self.depth):
                level = {k >> 1 for k in level}
                for k in level:
                    view[k] = view[2 * k] + view[2 * k + 1]
            return
        idx = np.fromiter(pending, dtype=np.int64, count=len(pending))
        width = self.size  # number of nodes on idx's level
        while width > 1:
            width >>= 1  # the parent level: nodes width .. 2 * width - 1
            if width <= 4 * len(idx):
                break  # this level and those above are small: recompute them whole (below)
            # a node repeated in idx is written twice with the same sum of its (already final) children
            idx >>= 1
            left = idx << 1
            nodes[idx] = nodes[left] + nodes[left | 1]
        else:
            return
        while width >= 1:
            nodes[width:2 * width] = nodes[2 * width:4 * width:2] + nodes[2 * width + 1:4 * width:2]
            width >>= 1

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target t in [0, total): the leaf i with prefix(i) <= t < prefix(i) + p_i, where
        prefix(i) is the sum of the leaves before i. Vectorised descent, O(len(targets) log n)."""
        self.flush()
        t = np.asarray(targets, dtype=np.float64).copy()
        idx = np.ones(len(t), dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * idx
            left_sum = self._nodes[left]
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
