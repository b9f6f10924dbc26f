"""Replay memory: DQN3.0's TransitionTable, one independent stream per (env copy, agent).

Reproduced from TransitionTable: each entry stores ONE frame (uint8 for images) with the action
taken at it, the reward that followed and whether it is terminal; stacked states of ``hist_len``
frames are rebuilt at sample time, history frames from before an episode start are ZERO-padded
(not repeated), an index whose newest state frame is terminal is rejected, and minibatches are
drawn uniformly with replacement.

Where we differ:
- the write cursor is respected: TransitionTable can stack frames across the overwrite seam
  (stale and fresh data in one history, or s2 from the other end of the buffer); such indices
  are rejected here.
- ``terminal`` (stop bootstrapping) and ``episode_end`` (terminal OR truncated) are stored
  separately: a truncated final frame is bootstrapped from (term=0 in the transition leading to
  it) but, like a terminal one, is never the newest frame of s and never stacked with the next
  episode.
- several streams live in one object and never mix; optional per-entry legal-action masks.

Beyond DQN3.0 (each off by default):
- ``n_step`` > 1: n-step returns assembled at sample time from the same frame-once table (no
  frame stored twice), see ``_n_step_returns``;
- ``prioritized``: proportional prioritized replay (madqn.core.prioritized) with one sum-tree over
  all streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from madqn.core.prioritized import SumTree, importance_weights, priorities
from madqn.core.rng import generator_state, set_generator_state

# Candidate rounds before sample() falls back to enumerating the valid indices exactly.
_MAX_DRAW_ROUNDS = 64


def stream_capacity(replay_memory: int, copies: int) -> int:
    """Entries per replay stream when one agent's budget of ``replay_memory`` transitions is split over
    its ``copies`` streams (env copies x actors): DQN3.0's replay window whatever the parallelism.
    The ``replay_memory % copies`` entries left over are not allocated."""
    return int(replay_memory) // int(copies)


def replay_nbytes(capacity: int, n_streams: int, frame_shape: tuple[int, ...], frame_dtype=np.uint8, *,
                  n_actions: int | None = None, store_action_masks: bool = False, prioritized: bool = False) -> int:
    """Bytes a :class:`ReplayMemory` with these arguments holds once full (its ``nbytes``), computed
    before anything is allocated: frames, actions, rewards, terminal and episode-end flags, write
    counters, legal-action masks if stored, the priority sum-tree if prioritized."""
    entries = int(n_streams) * int(capacity)
    per_entry = int(np.prod(frame_shape, dtype=np.int64)) * np.dtype(frame_dtype).itemsize \
        + np.dtype(np.int32).itemsize + np.dtype(np.float32).itemsize + 2 * np.dtype(bool).itemsize
    if store_action_masks:
        per_entry += int(n_actions) * np.dtype(bool).itemsize
    total = entries * per_entry + int(n_streams) * np.dtype(np.int64).itemsize
    if prioritized:
        total += 2 * (1 << (entries - 1).bit_length()) * np.dtype(np.float32).itemsize  # SumTree nodes
    return total


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable, else psutil), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


@dataclass
class Batch:
    """A minibatch of transitions; B = batch size, stacks are (B, hist_len, *frame_shape).

    ``states`` and ``next_states`` are overlapping views of one (B, hist_len + 1, ...) array (half
    the copying): treat them as read-only or copy before writing into them.
    """

    states: np.ndarray  # (B, hist_len, *frame_shape), frame dtype
    actions: np.ndarray  # (B,) int64
    rewards: np.ndarray  # (B,) float32, as stored (clipped by the caller)
    next_states: np.ndarray  # (B, hist_len, *frame_shape), frame dtype
    terminals: np.ndarray  # (B,) float32, 1.0 when s2 is terminal (no bootstrap)
    streams: np.ndarray  # (B,) int64, stream each sample came from
    next_action_masks: np.ndarray | None  # (B, n_actions) bool legal actions at s2, None if not stored
    indices: np.ndarray  # (B,) int64, position j (newest frame of s) inside its stream
    entries: np.ndarray  # (B,) int64, which entry of its stream j is (its write count): names the transition
    # after its position is reused
    discounts: np.ndarray | None = None  # (B,) float32 discount**k of an n-step return (0 after a terminal); None: 1-step
    weights: np.ndarray | None = None  # (B,) float32 importance weights (prioritized replay), None: uniform
    # ``sample(frames=False)``: no stacks (states, next_states None) but where their frames are, for a copy of the
    # frames elsewhere (madqn.core.device_frames): (B, hist_len) int64 rows of frames.reshape(-1, *frame_shape),
    # a zero-padded frame given as row n_streams * capacity (one past the last: that copy's zero row)
    state_rows: np.ndarray | None = None
    next_rows: np.ndarray | None = None


class ReplayMemory:
    """``n_streams`` circular tables of ``capacity`` entries each (DQN3.0 TransitionTable).

    Entry k of a stream = (frame_k, action_k taken at frame_k, reward_k that followed,
    terminal_k: frame_k is terminal, episode_end_k: frame_k is the last frame of its episode,
    terminal or truncated). A final frame is its own entry (its action/reward are ignored).
    The transition at index j is s = frames j-h+1..j, a = action_j, r = reward_j,
    s2 = frames j-h+2..j+1, term = terminal_{j+1}, next mask = mask_{j+1} (h = hist_len).

    Zero padding: in the stack ending at j, a history frame k < j is zeroed when episode_end is
    set at any index in [k, j-1] (for s2, ending at j+1: any index in [k, j]). Positions before
    the first entry of a stream count as episode ends, so a fresh stream starts zero-padded.

    Validity rule: j is sampleable iff
      1. entry j+1 exists and is newer than j (the transition does not cross the write cursor);
      2. episode_end_j is False (the newest frame of s is neither terminal, as in DQN3.0, nor a
         truncated final frame, which has no successor in its episode);
      3. every history frame of s and s2 that is not zero-padded is still stored. After the
         wrap-around, a history reaching past the oldest stored entry is rejected unless a
         STORED episode_end flag zeroes that part (flags of overwritten entries are unknown).
    So no stack holds overwritten data, frames of another episode or frames of another stream.
    Sampling is uniform over the valid (stream, j) pairs, with replacement.

    n-step returns (``n_step`` = N > 1): the transition at j becomes s = stack ending at j, a_j,
    R = r_j + g r_{j+1} + ... + g^(k-1) r_{j+k-1}, s2 = stack ending at j+k, discount g^k (0 when
    frame j+k is terminal), with k <= N the largest count such that entries j+1..j+k-1 are not
    episode ends and j+k is stored (k stops at a terminal or a truncated final frame, which is
    bootstrapped from, and at the newest entry: the write cursor is never crossed). The validity
    rule is the 1-step one: the longer return only reads entries of the same stream and episode.

    Prioritized (``prioritized``): one SumTree leaf per entry (stream * capacity + position) holds
    the priority of the transition at that entry: 0 until its successor is written (and forever for
    a final frame), then the largest priority so far, then (|clipped delta| + eps) ** alpha after
    each update (``update_priorities``, given the batch's ``entries``: a transition whose position was
    written again since the draw keeps its own priority). ``sample`` draws leaves proportionally (stratified), still
    rejecting indices that break the validity rule (their leaf is set to 0: after the wrap-around a
    history can only lose more of its frames, never regain them).
    """

    def __init__(
        self,
        capacity: int,
        frame_shape: tuple[int, ...],
        hist_len: int,
        *,
        n_streams: int = 1,
        frame_dtype=np.uint8,
        n_actions: int | None = None,
        store_action_masks: bool = False,
        seed: int | None = None,
        n_step: int = 1,
        discount: float = 0.99,
        prioritized: bool = False,
        priority_alpha: float = 0.6,
        priority_eps: float = 1e-6,
    ):
        if capacity < 2:
            raise ValueError(f"replay capacity must be >= 2 entries per stream, got {capacity}")
        if hist_len < 1:
            raise ValueError(f"hist_len must be >= 1, got {hist_len}")
        if n_streams < 1:
            raise ValueError(f"n_streams must be >= 1, got {n_streams}")
        if store_action_masks and (n_actions is None or n_actions < 1):
            raise ValueError("store_action_masks=True needs n_actions >= 1")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.capacity = int(capacity)
        self.frame_shape = tuple(int(n) for n in frame_shape)
        self.hist_len = int(hist_len)
        self.n_streams = int(n_streams)
        self.n_actions = None if n_actions is None else int(n_actions)
        self.store_action_masks = bool(store_action_masks)
        self.rng = np.random.default_rng(seed)

        # np.zeros: untouched pages are not resident, so a 1M-entry table costs what is filled.
        shape = (self.n_streams, self.capacity)
        self.frames = np.zeros((*shape, *self.frame_shape), dtype=frame_dtype)
        self.actions = np.zeros(shape, dtype=np.int32)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminal = np.zeros(shape, dtype=bool)
        self.episode_end = np.zeros(shape, dtype=bool)
        self.action_masks = np.zeros((*shape, self.n_actions), dtype=bool) if self.store_action_masks else None
        # entries ever written per stream; entry n lives at position n % capacity
        self.written = np.zeros(self.n_streams, dtype=np.int64)
        self.n_step = int(n_step)
        self.discount = float(discount)
        self.priority_alpha = float(priority_alpha)
        self.priority_eps = float(priority_eps)
        self.tree = SumTree(self.n_streams * self.capacity) if prioritized else None
        self.max_priority = 1.0  # the largest |clipped delta| + eps so far: what new transitions get
        self._sampleable = False  # some stored transition is valid (see can_sample)

    # ------------------------------------------------------------------ writing

    def add(
        self,
        stream: int,
        frame,
        action: int,
        reward: float,
        terminal: bool,
        episode_end: bool,
        action_mask=None,
    ) -> None:
        """Append entry (frame, action taken at it, reward that followed, flags) to ``stream``.

        ``terminal`` implies ``episode_end``. ``action_mask`` (n_actions bool, legal actions at
        this frame) is stored when the memory keeps masks; None there means all actions legal.
        """
        if not 0 <= stream < self.n_streams:
            raise ValueError(f"stream {stream} out of range [0, {self.n_streams})")
        if terminal and not episode_end:
            raise ValueError("a terminal frame ends its episode: pass episode_end=True with terminal=True")
        frame = np.asarray(frame)
        if frame.shape != self.frame_shape:
            raise ValueError(f"frame shape {frame.shape} != replay frame_shape {self.frame_shape}")
        if frame.dtype.kind in "fc" and self.frames.dtype.kind not in "fc":
            # e.g. a [0, 1] float image into uint8 storage would silently truncate to zeros
            raise ValueError(f"frame dtype {frame.dtype} cannot be stored as {self.frames.dtype}")
        pos = int(self.written[stream] % self.capacity)
        if self.tree is not None:
            base = stream * self.capacity
            self.tree.set_one(base + pos, 0.0)  # no successor yet
            prev = (pos - 1) % self.capacity
            if self.written[stream] > 0 and not self.episode_end[stream, prev]:
                # the transition at prev is complete now: it enters with the largest priority so far
                self.tree.set_one(base + prev, self.max_priority ** self.priority_alpha)
        self.frames[stream, pos] = frame
        self.actions[stream, pos] = action
        self.rewards[stream, pos] = reward
        self.terminal[stream, pos] = terminal
        self.episode_end[stream, pos] = episode_end
        if self.action_masks is not None:
            self.action_masks[stream, pos] = True if action_mask is None else action_mask
        self.written[stream] += 1

    # ------------------------------------------------------------------ reading

    def entries(self, stream: int):
        """The stored entries of ``stream``, oldest first, as ``add``'s arguments after the stream:
        ``(frame, action, reward, terminal, episode_end, action_mask)`` (mask None when not stored).
        ``other.add(stream, *entry)`` for each rebuilds the stream in another memory (where the oldest entry
        starts a fresh history, zero-padded, if this memory had wrapped around)."""
        written = int(self.written[stream])
        for n in range(max(0, written - self.capacity), written):
            pos = n % self.capacity
            mask = None if self.action_masks is None else self.action_masks[stream, pos].copy()
            yield (self.frames[stream, pos].copy(), int(self.actions[stream, pos]), float(self.rewards[stream, pos]),
                   bool(self.terminal[stream, pos]), bool(self.episode_end[stream, pos]), mask)


    def __len__(self) -> int:
        return int(np.minimum(self.written, self.capacity).sum())

    @property
    def nbytes(self) -> int:
        arrays = [self.frames, self.actions, self.rewards, self.terminal, self.episode_end, self.written]
        if self.action_masks is not None:
            arrays.append(self.action_masks)
        if self.tree is not None:
            arrays.append(self.tree.nodes)
        return sum(a.nbytes for a in arrays)

    def _check(self, streams: np.ndarray, positions: np.ndarray):
        """Vectorised validity rule for candidate (stream, position) pairs of stored entries.

        Returns (valid (n,) bool, logical index of j (n,), zeroed (n, hist_len - 1) bool) where
        zeroed[:, c] tells whether history frame j-h+1+c is padding (meaningful where valid).
        """
        cap, h = self.capacity, self.hist_len
        written = self.written[streams]
        oldest = np.maximum(written - cap, 0)  # logical index of the oldest stored entry
        logical = oldest + (positions - oldest) % cap
        valid = (logical <= written - 2) & ~self.episode_end[streams, positions]
        zeroed = np.empty((len(positions), h - 1), dtype=bool)
        run = np.zeros(len(positions), dtype=bool)  # an episode end lies in [k, j-1]
        for d in range(1, h):
            k = logical - d
            stored = k >= oldest
            # unknown (overwritten) flags count as False; before the stream start counts as an end
            run |= np.where(stored, self.episode_end[streams, k % cap], k < 0)
            valid &= run | stored
            zeroed[:, h - 1 - d] = run
        return valid, logical, zeroed

    def _all_stored(self) -> tuple[np.ndarray, np.ndarray]:
        counts = np.minimum(self.written, self.capacity)
        streams = np.repeat(np.arange(self.n_streams, dtype=np.int64), counts)
        positions = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
        return streams, positions

    def valid_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """All sampleable (streams, positions), sorted by stream then position. O(len(self))."""
        streams, positions = self._all_stored()
        valid = self._check(streams, positions)[0]
        return streams[valid], positions[valid]

    def num_valid(self) -> int:
        """Number of sampleable (stream, j) pairs. O(len(self))."""
        return len(self.valid_indices()[0])

    def can_sample(self) -> bool:
        """Whether ``sample`` can draw a minibatch: some stored transition is valid. Counted while false
        (early on, while the table is small), then remembered: a filled table keeps valid transitions."""
        if not self._sampleable:
            self._sampleable = self.num_valid() > 0
        return self._sampleable

    def sample(self, batch_size: int, rng: np.random.Generator | None = None, *, beta: float = 1.0,
               dqn3: bool = False, frames: bool = True) -> Batch:
        """A minibatch of ``batch_size`` transitions, uniform over the valid indices (with replacement),
        or proportional to the priorities when the memory is prioritized (then ``weights`` holds the
        importance weights for exponent ``beta``).

        ``rng``: draw with this generator instead of the memory's own (e.g. a held-out validation
        set that must not change the training minibatches). ``dqn3``: DQN3.0's transitions whatever
        the memory's options: uniform and 1-step. ``frames=False``: the same draw, with the stacks' frame rows
        (``Batch.state_rows``, ``next_rows``) instead of the stacks."""
        rng = self.rng if rng is None else rng
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.tree is not None and not dqn3:
            return self._sample_prioritized(batch_size, rng, beta, frames)
        counts = np.minimum(self.written, self.capacity)
        n_stored = int(counts.sum())
        if n_stored == 0:
            raise ValueError("cannot sample from an empty replay memory")
        ends = np.cumsum(counts)
        starts = ends - counts
        streams = np.empty(batch_size, dtype=np.int64)
        logical = np.empty(batch_size, dtype=np.int64)
        zeroed = np.empty((batch_size, self.hist_len - 1), dtype=bool)
        filled = 0
        for _ in range(_MAX_DRAW_ROUNDS):
            # a flat index over all stored entries: stream weighted by its count, j uniform in it;
            # oversample so that one round usually fills the batch
            missing = batch_size - filled
            flat = rng.integers(0, n_stored, size=missing + missing // 4 + 8)
            if self.n_streams == 1:
                cand_streams = np.zeros(len(flat), dtype=np.int64)
                cand_positions = flat
            else:
                cand_streams = np.searchsorted(ends, flat, side="right")
                cand_positions = flat - starts[cand_streams]
            ok, cand_logical, cand_zeroed = self._check(cand_streams, cand_positions)
            take = np.flatnonzero(ok)[:missing]
            stop = filled + len(take)
            streams[filled:stop] = cand_streams[take]
            logical[filled:stop] = cand_logical[take]
            zeroed[filled:stop] = cand_zeroed[take]
            filled = stop
            if filled == batch_size:
                break
        else:
            # valid indices are rare (or absent): draw from their exact list
            all_streams, all_positions = self.valid_indices()
            if len(all_streams) == 0:
                raise ValueError(
                    f"no valid transition to sample among {n_stored} stored entries (a transition needs "
                    "a stored successor in the same episode and a history that is stored or zero-padded)"
                )
            pick = rng.integers(0, len(all_streams), size=batch_size - filled)
            _, pick_logical, pick_zeroed = self._check(all_streams[pick], all_positions[pick])
            streams[filled:] = all_streams[pick]
            logical[filled:] = pick_logical
            zeroed[filled:] = pick_zeroed
        return self._gather(streams, logical, zeroed, 1 if dqn3 else self.n_step, frames)

    def _sample_prioritized(self, batch_size: int, rng: np.random.Generator, beta: float, frames: bool = True) -> Batch:
        """Proportional draws from the sum-tree: O(batch_size log N), invalid leaves rejected and zeroed."""
        tree, cap = self.tree, self.capacity
        leaves = np.empty(batch_size, dtype=np.int64)
        logical = np.empty(batch_size, dtype=np.int64)
        zeroed = np.empty((batch_size, self.hist_len - 1), dtype=bool)
        filled = 0
        for attempt in range(_MAX_DRAW_ROUNDS):
            if tree.total <= 0:
                break
            missing = batch_size - filled
            # first round stratified over the whole batch; refills (rare) plain proportional
            cand = tree.sample(missing, rng, stratified=attempt == 0)
            positive = tree.get(np.minimum(cand, tree.size - 1)) > 0  # float rounding may reach a 0 or padding leaf
            cand = cand[positive]
            streams, positions = np.divmod(cand, cap)
            ok, cand_logical, cand_zeroed = self._check(streams, positions)
            if not ok.all():
                tree.set(cand[~ok], 0.0)
            take = np.flatnonzero(ok)[:missing]
            stop = filled + len(take)
            leaves[filled:stop] = cand[take]
            logical[filled:stop] = cand_logical[take]
            zeroed[filled:stop] = cand_zeroed[take]
            filled = stop
            if filled == batch_size:
                break
        if filled != batch_size:
            raise ValueError(f"no valid transition with a positive priority among {len(self)} stored entries")
        batch = self._gather(leaves // cap, logical, zeroed, self.n_step, frames)
        batch.weights = importance_weights(tree.get(leaves) / tree.total, beta)
        return batch

    def update_priorities(self, streams: np.ndarray, indices: np.ndarray, deltas: np.ndarray,
                          entries: np.ndarray | None = None) -> None:
        """After an update: the sampled transitions' priorities become (|clipped delta| + eps) ** alpha.

        ``entries`` (the batch's ``entries``): a transition whose position was written again since it was
        drawn (overlap mode: the acting thread writes while the learner computes the deltas) is someone
        else's now and keeps its priority. Without ``entries`` that cannot be told apart; then only a leaf
        that is 0 by now (no successor yet) stays 0."""
        streams = np.asarray(streams, dtype=np.int64)
        leaves = streams * self.capacity + np.asarray(indices, dtype=np.int64)
        keep = self.tree.get(leaves) > 0
        if entries is not None:
            keep &= np.asarray(entries, dtype=np.int64) >= self.written[streams] - self.capacity  # still stored
        p = np.abs(np.asarray(deltas, dtype=np.float64)) + self.priority_eps
        self.max_priority = max(self.max_priority, float(p.max()))
        values = priorities(deltas, alpha=self.priority_alpha, eps=self.priority_eps)
        self.tree.set(leaves[keep], values[keep])

    def _gather(self, streams: np.ndarray, logical: np.ndarray, zeroed: np.ndarray, n_step: int = 1,
                frames: bool = True) -> Batch:
        if not frames:
            return self._gather_rows(streams, logical, zeroed, n_step)
        if n_step > 1:
            return self._gather_n_step(streams, logical, zeroed, n_step)
        h, cap = self.hist_len, self.capacity
        # rows of frames j-h+1 .. j+1 in the (n_streams * capacity, *frame_shape) view: ONE gather
        # copies just the minibatch; s is the first h frames, s2 the last h
        rows = streams[:, None] * cap + (logical[:, None] + np.arange(-h + 1, 2)) % cap
        stacks = self.frames.reshape(-1, *self.frame_shape)[rows]
        if h > 1:
            # episode_end_j is False, so s2 pads exactly the frames of s that are padded (bar the oldest)
            stacks[:, : h - 1][zeroed] = 0
        j, j_next = rows[:, h - 1] - streams * cap, rows[:, h] - streams * cap
        masks = None if self.action_masks is None else self.action_masks[streams, j_next]
        return Batch(
            states=stacks[:, :h],
            actions=self.actions[streams, j].astype(np.int64),
            rewards=self.rewards[streams, j],
            next_states=stacks[:, 1:],
            terminals=self.terminal[streams, j_next].astype(np.float32),
            streams=streams,
            next_action_masks=masks,
            indices=j,
            entries=logical,
        )

    def _n_step_returns(self, streams: np.ndarray, logical: np.ndarray, n_step: int):
        """(k, R, terminal) per row: the count of rewards summed (1..n_step), their discounted sum
        r_j + g r_{j+1} + ... + g^(k-1) r_{j+k-1}, and whether frame j+k is terminal. The sum stops
        after reward j+i when entry j+i+1 ends its episode or is the newest entry of its stream."""
        cap, g = self.capacity, self.discount
        newest = self.written[streams] - 1
        k = np.zeros(len(streams), dtype=np.int64)
        ret = np.zeros(len(streams), dtype=np.float64)
        open_ = np.ones(len(streams), dtype=bool)
        for i in range(n_step):
            reward = self.rewards[streams, (logical + i) % cap].astype(np.float64)
            ret += np.where(open_, g ** i * reward, 0.0)
            k += open_
            nxt = logical + i + 1
            open_ &= ~self.episode_end[streams, nxt % cap] & (nxt < newest)
        end = (logical + k) % cap
        return k, ret, self.terminal[streams, end]

    def _gather_n_step(self, streams: np.ndarray, logical: np.ndarray, zeroed: np.ndarray, n_step: int) -> Batch:
        """Like ``_gather``, with s2 = the stack ending at j+k and the n-step return (``_n_step_returns``).

        s2's history reaches back at most to frame j-h+1+k; a frame at or before j-1 is padded exactly
        when it is padded in s (no episode end lies in j..j+k-1), later frames never are."""
        h, cap = self.hist_len, self.capacity
        k, ret, terminal = self._n_step_returns(streams, logical, n_step)
        offsets = np.arange(-h + 1, 1)
        flat = self.frames.reshape(-1, *self.frame_shape)
        states = flat[streams[:, None] * cap + (logical[:, None] + offsets) % cap]
        next_states = flat[streams[:, None] * cap + ((logical + k)[:, None] + offsets) % cap]
        if h > 1:
            states[:, : h - 1][zeroed] = 0
            column = k[:, None] + np.arange(h)  # s2 frame c is frame j-h+1+k+c = s's column k+c
            padded = np.take_along_axis(zeroed, np.minimum(column, h - 2), axis=1) & (column <= h - 2)
            next_states[padded] = 0
        j, j_next = logical % cap, (logical + k) % cap
        masks = None if self.action_masks is None else self.action_masks[streams, j_next]
        discounts = np.where(terminal, 0.0, self.discount ** k).astype(np.float32)
        return Batch(
            states=states,
            actions=self.actions[streams, j].astype(np.int64),
            rewards=ret.astype(np.float32),
            next_states=next_states,
            terminals=terminal.astype(np.float32),
            streams=streams,
            next_action_masks=masks,
            indices=j,
            entries=logical,
            discounts=discounts,
        )

    def _gather_rows(self, streams: np.ndarray, logical: np.ndarray, zeroed: np.ndarray, n_step: int) -> Batch:
        """``_gather`` / ``_gather_n_step`` without the frames: every other field the same, and the rows the
        stacks' frames come from (a padded frame: row ``n_streams * capacity``, a copy's zero row)."""
        h, cap = self.hist_len, self.capacity
        if n_step > 1:
            k, ret, terminal = self._n_step_returns(streams, logical, n_step)
            rewards, discounts = ret.astype(np.float32), np.where(terminal, 0.0, self.discount ** k).astype(np.float32)
        else:
            k = np.ones(len(streams), dtype=np.int64)
            rewards, discounts = self.rewards[streams, logical % cap], None
            terminal = self.terminal[streams, (logical + 1) % cap]
        offsets = np.arange(-h + 1, 1)
        state_rows = streams[:, None] * cap + (logical[:, None] + offsets) % cap
        next_rows = streams[:, None] * cap + ((logical + k)[:, None] + offsets) % cap
        if h > 1:  # the padding rule of _gather_n_step (with k = 1 that of _gather)
            zero_row = self.n_streams * cap
            state_rows[:, : h - 1][zeroed] = zero_row
            column = k[:, None] + np.arange(h)
            next_rows[np.take_along_axis(zeroed, np.minimum(column, h - 2), axis=1) & (column <= h - 2)] = zero_row
        j, j_next = logical % cap, (logical + k) % cap
        return Batch(
            states=None,
            actions=self.actions[streams, j].astype(np.int64),
            rewards=rewards,
            next_states=None,
            terminals=terminal.astype(np.float32),
            streams=streams,
            next_action_masks=None if self.action_masks is None else self.action_masks[streams, j_next],
            indices=j,
            entries=logical,
            discounts=discounts,
            state_rows=state_rows,
            next_rows=next_rows,
        )

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, np.ndarray | int]:
        """Plain numpy arrays and ints (savable with ``np.savez``, no pickle).

        The large arrays are the live buffers, not copies: save them before the next ``add``.
        """
        d: dict[str, np.ndarray | int] = {
            "capacity": self.capacity,
            "hist_len": self.hist_len,
            "n_streams": self.n_streams,
            "frames": self.frames,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminal": self.terminal,
            "episode_end": self.episode_end,
            "written": self.written.copy(),
        }
        if self.action_masks is not None:
            d["action_masks"] = self.action_masks
        if self.tree is not None:
            d["priority_tree"] = self.tree.nodes
            d["max_priority"] = np.array([self.max_priority], dtype=np.float64)
        d["rng_pcg64"] = generator_state(self.rng)  # the sampler, as six int64 words (madqn.core.rng)
        return d

    def load_state_dict(self, d) -> None:
        """Restore from ``state_dict()`` output (or the ``np.load`` of its ``np.savez``)."""
        for key in ("capacity", "hist_len", "n_streams"):
            if int(d[key]) != getattr(self, key):
                raise ValueError(f"replay state has {key}={int(d[key])}, this memory has {getattr(self, key)}")
        if ("action_masks" in d) != (self.action_masks is not None):
            raise ValueError("replay state and this memory disagree on storing action masks")
        if ("priority_tree" in d) != (self.tree is not None):
            raise ValueError("replay state and this memory disagree on prioritized replay")
        names = ["frames", "actions", "rewards", "terminal", "episode_end", "written"]
        if self.action_masks is not None:
            names.append("action_masks")
        targets = {name: getattr(self, name) for name in names}
        if self.tree is not None:
            names.append("priority_tree")
            targets["priority_tree"] = self.tree.nodes
        for name in names:
            src, dst = np.asarray(d[name]), targets[name]
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(
                    f"replay state {name!r} is {src.dtype}{list(src.shape)}, expected {dst.dtype}{list(dst.shape)}"
                )
        for name in names:
            np.copyto(targets[name], np.asarray(d[name]))
        if self.tree is not None:
            self.max_priority = float(np.asarray(d["max_priority"]).reshape(-1)[0])
        if "rng_pcg64" in d:
            set_generator_state(self.rng, d["rng_pcg64"])
