"""Golden tables for the replay memory (DQN3.0 TransitionTable semantics, see madqn/core/replay.py).

Frames are filled with a value that encodes their entry (index + 1, so 0 means zero padding), so
every stacked state can be read back as a list of entry numbers and compared exactly. Randomised
fills are checked sample by sample against ``reference_transitions``, a plain per-index loop.
"""

from __future__ import annotations

import numpy as np
import pytest

from madqn.core.replay import ReplayMemory

T, U = "terminal", "truncated"  # how a hand-laid episode ends (None: still running)


def add_episode(mem, length, end, *, stream=0, start=None, value=lambda i: i + 1):
    """Add ``length`` entries to ``stream``; the last ends the episode as ``end`` (T, U) or not (None)."""
    start = int(mem.written[stream]) if start is None else start
    for n in range(length):
        i = start + n
        last = n == length - 1 and end is not None
        frame = np.full(mem.frame_shape, value(i), dtype=mem.frames.dtype)
        mem.add(stream, frame, 10 + i, 0.5 * i, last and end == T, last)


def values(stack):
    """Entry number encoded in each frame of a (hist_len, *frame_shape) stack (0 = padding)."""
    out = []
    for frame in stack:
        assert (frame == frame.flat[0]).all(), "a frame mixes entries"
        out.append(int(frame.flat[0]))
    return out


def sampled_table(mem, n=2000, batch_size=50):
    """index -> (s values, s2 values, action, reward, term), checking repeated samples agree."""
    table = {}
    for _ in range(n // batch_size):
        b = mem.sample(batch_size)
        for i in range(batch_size):
            row = (values(b.states[i]), values(b.next_states[i]), int(b.actions[i]), float(b.rewards[i]),
                   float(b.terminals[i]))
            assert table.setdefault(int(b.indices[i]), row) == row
    return table


# ---------------------------------------------------------------- independent slow reference


class Log:
    """Unbounded record of everything added to a memory, per stream (the reference's ground truth)."""

    def __init__(self, mem):
        self.mem = mem
        self.entries = [[] for _ in range(mem.n_streams)]

    def add(self, stream, frame, action, reward, terminal, episode_end, mask=None):
        self.mem.add(stream, frame, action, reward, terminal, episode_end, action_mask=mask)
        self.entries[stream].append(dict(frame=np.array(frame), action=action, reward=np.float32(reward),
                                         terminal=terminal, end=episode_end, mask=mask))


def reference_stack(entries, end, oldest, hist_len):
    """Frames end-hist_len+1..end, zero-padded; None when a needed frame is no longer stored."""
    frames = [entries[end]["frame"]]
    padding = False
    for k in range(end - 1, end - hist_len, -1):
        if not padding:
            if k < 0:  # before the first entry of the stream: an episode start
                padding = True
            elif k < oldest:  # overwritten, and no stored episode end says it would be padding
                return None
            elif entries[k]["end"]:
                padding = True
        frames.insert(0, np.zeros_like(frames[-1]) if padding else entries[k]["frame"])
    return np.stack(frames)


def reference_transitions(log):
    """(stream, position) -> expected transition, by a straightforward loop over stored indices."""
    mem = log.mem
    out = {}
    for stream, entries in enumerate(log.entries):
        oldest = max(0, len(entries) - mem.capacity)
        for j in range(oldest, len(entries) - 1):  # j + 1 must exist
            if entries[j]["end"]:
                continue
            s = reference_stack(entries, j, oldest, mem.hist_len)
            s2 = reference_stack(entries, j + 1, oldest, mem.hist_len)
            if s is None or s2 is None:
                continue
            mask = entries[j + 1]["mask"]
            out[stream, j % mem.capacity] = dict(
                s=s, s2=s2, a=entries[j]["action"], r=entries[j]["reward"],
                term=float(entries[j + 1]["terminal"]),
                mask=None if mask is None else np.asarray(mask, bool))
    return out


def check_against_reference(log, n_samples):
    mem = log.mem
    ref = reference_transitions(log)
    assert mem.num_valid() == len(ref)
    valid_streams, valid_positions = mem.valid_indices()
    assert set(zip(valid_streams.tolist(), valid_positions.tolist())) == set(ref)
    seen = {}
    batch_size = 100
    for _ in range(n_samples // batch_size):
        b = mem.sample(batch_size)
        assert b.states.dtype == mem.frames.dtype and b.next_states.dtype == mem.frames.dtype
        assert b.actions.dtype == np.int64 and b.streams.dtype == np.int64 and b.indices.dtype == np.int64
        assert b.rewards.dtype == np.float32 and b.terminals.dtype == np.float32
        for i in range(batch_size):
            key = (int(b.streams[i]), int(b.indices[i]))
            assert key in ref, f"sampled invalid transition {key}"
            want = ref[key]
            np.testing.assert_array_equal(b.states[i], want["s"])
            np.testing.assert_array_equal(b.next_states[i], want["s2"])
            assert b.actions[i] == want["a"] and b.rewards[i] == want["r"] and b.terminals[i] == want["term"]
            if want["mask"] is None:
                assert b.next_action_masks is None
            else:
                np.testing.assert_array_equal(b.next_action_masks[i], want["mask"])
            seen[key] = seen.get(key, 0) + 1
    return ref, seen


# ---------------------------------------------------------------- golden tables


def test_stacks_padding_terminal_and_truncation_golden():
    mem = ReplayMemory(20, (2, 2), 3, seed=0)
    add_episode(mem, 4, T)  # entries 0..3, 3 terminal
    add_episode(mem, 3, U)  # entries 4..6, 6 truncated
    add_episode(mem, 2, None)  # entries 7, 8 (8 just written)
    # index: (s, s2, action, reward, term), values = entry + 1
    expected = {
        0: ([0, 0, 1], [0, 1, 2], 10, 0.0, 0.0),  # stream start is zero-padded
        1: ([0, 1, 2], [1, 2, 3], 11, 0.5, 0.0),
        2: ([1, 2, 3], [2, 3, 4], 12, 1.0, 1.0),  # s2 holds the terminal frame, term = 1
        4: ([0, 0, 5], [0, 5, 6], 14, 2.0, 0.0),  # after a terminal: padding, not entry 3
        5: ([0, 5, 6], [5, 6, 7], 15, 2.5, 0.0),  # s2 = true last frame of a truncated episode, term 0
        7: ([0, 0, 8], [0, 8, 9], 17, 3.5, 0.0),  # after a truncation: padding, not entry 6
    }
    # 3 and 6 (episode ends) are never s's newest frame; 8 (no successor yet) is never sampled
    assert sampled_table(mem) == expected
    assert mem.num_valid() == 6 and len(mem) == 9


def test_stream_start_zero_padding_hist4():
    mem = ReplayMemory(10, (2, 2), 4, seed=1)
    add_episode(mem, 3, None)
    assert sampled_table(mem, n=200) == {
        0: ([0, 0, 0, 1], [0, 0, 1, 2], 10, 0.0, 0.0),
        1: ([0, 0, 1, 2], [0, 1, 2, 3], 11, 0.5, 0.0),
    }


def test_wraparound_never_reads_overwritten_history():
    # capacity 7, hist 3: episode A = 0..2 (terminal), episode B = 3..10 still running.
    # Entries 0..3 are overwritten (position p holds entry p + 7 for p < 4), oldest stored = 4.
    mem = ReplayMemory(7, (2, 2), 3, seed=2)
    add_episode(mem, 3, T)
    add_episode(mem, 8, None)
    assert [values(mem.frames[0, p : p + 1])[0] for p in range(7)] == [8, 9, 10, 11, 5, 6, 7]
    # entries 4 and 5 (positions 4, 5) would need entry 3, which is gone: DQN3.0 would stack
    # entry 10 (position 3) under them. Entry 10 has no successor.
    assert sampled_table(mem, n=1000) == {
        6: ([5, 6, 7], [6, 7, 8], 16, 3.0, 0.0),  # entry 6
        0: ([6, 7, 8], [7, 8, 9], 17, 3.5, 0.0),  # entry 7
        1: ([7, 8, 9], [8, 9, 10], 18, 4.0, 0.0),  # entry 8
        2: ([8, 9, 10], [9, 10, 11], 19, 4.5, 0.0),  # entry 9
    }
    streams, positions = mem.valid_indices()
    assert positions.tolist() == [0, 1, 2, 6] and streams.tolist() == [0, 0, 0, 0]


def test_wraparound_with_episode_ends_golden():
    # capacity 7, hist 3: A = 0..2 (2 terminal), B = 3..5 (5 truncated), C = 6..10 (10 terminal), D = 11.
    # Stored: entries 5..11; position 4 holds entry 11, position 5 entry 5.
    mem = ReplayMemory(7, (2, 2), 3, seed=3)
    add_episode(mem, 3, T)
    add_episode(mem, 3, U)
    add_episode(mem, 5, T)
    add_episode(mem, 1, None)
    assert sampled_table(mem, n=1000) == {
        # entry 6: history reaches overwritten entry 4, but stored episode_end_5 makes it padding
        6: ([0, 0, 7], [0, 7, 8], 16, 3.0, 0.0),
        0: ([0, 7, 8], [7, 8, 9], 17, 3.5, 0.0),
        1: ([7, 8, 9], [8, 9, 10], 18, 4.0, 0.0),
        2: ([8, 9, 10], [9, 10, 11], 19, 4.5, 1.0),
    }
    assert mem.valid_indices()[1].tolist() == [0, 1, 2, 6]


def test_streams_never_mix():
    mem = ReplayMemory(16, (3,), 4, n_streams=3, seed=4)
    log = Log(mem)
    rng = np.random.default_rng(0)
    counts = [0, 0, 0]
    for _ in range(90):
        stream = int(rng.integers(3))
        i = counts[stream]
        counts[stream] += 1
        end = bool(rng.random() < 0.15)
        log.add(stream, np.full(3, 60 * stream + i % 59 + 1, np.uint8), int(rng.integers(4)), 0.0,
                end and bool(rng.random() < 0.5), end)
    check_against_reference(log, 1000)
    b = mem.sample(1000)
    for stack in (b.states, b.next_states):
        pixels = stack.reshape(1000, -1).astype(int)
        owner = np.where(pixels > 0, (pixels - 1) // 60, b.streams[:, None])
        assert (owner == b.streams[:, None]).all()


def test_random_fill_matches_reference_with_masks():
    # stream 0 wraps many times, stream 1 a few, stream 2 never (10 entries < capacity 13)
    mem = ReplayMemory(13, (2,), 4, n_streams=3, frame_dtype=np.int32, n_actions=5, store_action_masks=True,
                       seed=5)
    log = Log(mem)
    rng = np.random.default_rng(1)
    counts = [0, 0, 0]
    weights = np.array([0.6, 0.3, 0.1])
    for checkpoint in (6, 25, 60, 140):
        while sum(counts) < checkpoint:
            stream = int(rng.choice(3, p=weights))
            if stream == 2 and counts[2] >= 10:
                continue
            i = counts[stream]
            counts[stream] += 1
            end = bool(rng.random() < 0.2)
            mask = rng.random(5) < 0.6
            log.add(stream, np.array([10_000 * stream + i + 1, -i], np.int32), int(rng.integers(5)),
                    float(rng.uniform(-1, 1)), end and bool(rng.random() < 0.5), end, mask)
        ref, seen = check_against_reference(log, 2000 if checkpoint == 140 else 300)
    assert mem.written.tolist() == counts and counts[0] > 5 * 13 and counts[1] > 13 and 4 < counts[2] <= 10
    # every valid transition shows up, roughly uniformly (2000 draws over len(ref) pairs)
    assert set(seen) == set(ref)
    expected = 2000 / len(ref)
    assert all(0.4 * expected < c < 1.8 * expected for c in seen.values())


def test_masks_come_back_for_s2():
    mem = ReplayMemory(10, (1,), 2, n_actions=3, store_action_masks=True, seed=6)
    masks = [[1, 0, 0], [0, 1, 0], None, [1, 1, 0]]  # None stores "all legal"
    for i, m in enumerate(masks):
        mem.add(0, [i + 1], i, 0.0, False, False, action_mask=None if m is None else np.array(m, bool))
    b = mem.sample(300)
    want = {0: [0, 1, 0], 1: [1, 1, 1], 2: [1, 1, 0]}
    assert set(b.indices.tolist()) == set(want)
    for j, m in zip(b.indices, b.next_action_masks):
        assert m.dtype == bool and m.tolist() == [bool(x) for x in want[int(j)]]
    assert ReplayMemory(10, (1,), 2, seed=0).state_dict().get("action_masks") is None
    plain = ReplayMemory(10, (1,), 2)
    plain.add(0, [1], 0, 0.0, False, False)
    plain.add(0, [2], 0, 0.0, False, False)
    assert plain.sample(4).next_action_masks is None


def test_vector_observations_hist1():
    mem = ReplayMemory(8, (3,), 1, frame_dtype=np.float32, seed=7)
    log = Log(mem)
    for i, end in enumerate([False, False, True, False, False, False, True, False, False, False, False]):
        log.add(0, np.array([i, i + 0.5, -i], np.float32), i % 3, 0.25 * i, end and i == 2, end)
    ref, _ = check_against_reference(log, 500)
    b = mem.sample(64)
    assert b.states.shape == (64, 1, 3) and b.next_states.shape == (64, 1, 3) and b.states.dtype == np.float32
    np.testing.assert_array_equal(b.next_states[:, 0, 0], b.states[:, 0, 0] + 1)  # s2 is the next entry
    # stored entries 3..10; 6 is an episode end and 10 has no successor
    assert sorted(ref) == sorted((0, p % 8) for p in (3, 4, 5, 7, 8, 9))


# ---------------------------------------------------------------- memory, reproducibility, errors


@pytest.mark.parametrize(
    "capacity, frame_shape, dtype, n_streams, n_actions, masks",
    [(1000, (84, 84), np.uint8, 1, None, False), (50, (84, 84), np.uint8, 4, 6, True),
     (30, (7,), np.float32, 2, 3, False)],
)
def test_nbytes_formula(capacity, frame_shape, dtype, n_streams, n_actions, masks):
    mem = ReplayMemory(capacity, frame_shape, 4, n_streams=n_streams, frame_dtype=dtype, n_actions=n_actions,
                       store_action_masks=masks)
    per_entry = int(np.prod(frame_shape)) * np.dtype(dtype).itemsize + 4 + 4 + 1 + 1 + (n_actions if masks else 0)
    assert mem.nbytes == n_streams * capacity * per_entry + 8 * n_streams  # + per-stream write counters


def test_atari_bytes_per_entry():
    mem = ReplayMemory(1000, (84, 84), 4)
    assert mem.nbytes <= 7.2e3 * 1000
    assert mem.frames.dtype == np.uint8


def fill_random(mem, n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        end = bool(rng.random() < 0.1)
        mem.add(0, rng.integers(0, 256, mem.frame_shape, dtype=np.uint8), int(rng.integers(4)), 1.0, end, end)


def test_same_seed_same_batches_and_state_dict_roundtrip(tmp_path):
    a, b, c = (ReplayMemory(50, (4, 4), 4, seed=s) for s in (11, 11, 12))
    for mem in (a, b, c):
        fill_random(mem, 80, seed=0)
    for _ in range(3):
        x, y = a.sample(32), b.sample(32)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.states, y.states)
    assert not np.array_equal(a.sample(32).indices, c.sample(32).indices)
    # checkpoint: plain arrays, savable without pickle; the restored memory continues identically
    np.savez(tmp_path / "replay.npz", **a.state_dict())
    restored = ReplayMemory(50, (4, 4), 4, seed=999)
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as saved:
        restored.load_state_dict(dict(saved))
    assert len(restored) == len(a) and restored.num_valid() == a.num_valid()
    for _ in range(3):
        x, y = a.sample(32), restored.sample(32)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.next_states, y.next_states)
    with pytest.raises(ValueError, match="capacity"):
        ReplayMemory(60, (4, 4), 4).load_state_dict(a.state_dict())


def test_errors():
    mem = ReplayMemory(10, (2, 2), 2)
    with pytest.raises(ValueError, match="empty"):
        mem.sample(1)
    add_episode(mem, 1, T)
    add_episode(mem, 1, U)
    add_episode(mem, 1, None)  # nothing valid: two one-frame episodes and an entry with no successor
    with pytest.raises(ValueError, match="no valid transition"):
        mem.sample(4)
    with pytest.raises(ValueError, match="episode_end"):
        mem.add(0, np.zeros((2, 2), np.uint8), 0, 0.0, True, False)
    with pytest.raises(ValueError, match="shape"):
        mem.add(0, np.zeros((3, 2), np.uint8), 0, 0.0, False, False)
    with pytest.raises(ValueError, match="dtype"):
        mem.add(0, np.zeros((2, 2), np.float32), 0, 0.0, False, False)
    with pytest.raises(ValueError, match="stream"):
        mem.add(1, np.zeros((2, 2), np.uint8), 0, 0.0, False, False)


def test_rare_valid_index_is_still_found():
    # one valid transition among 500 stored entries: rejection rarely hits it, the exact fallback does
    mem = ReplayMemory(500, (1,), 1, frame_dtype=np.int32, seed=8)
    for i in range(500):
        mem.add(0, [i], 0, 0.0, False, i != 250)  # one-frame episodes, except that 250 -> 251 is one
    assert mem.num_valid() == 1
    b = mem.sample(64)
    assert b.indices.tolist() == [250] * 64 and b.next_states[:, 0, 0].tolist() == [251] * 64


def test_allocated_bytes_match_formula():
    """What the memory really allocates (numpy reports its buffers to tracemalloc), not just .nbytes:
    84*84 frame bytes + 10 bytes of action, reward and flags per entry, i.e. 7,066 B per transition
    per agent stream, and nothing proportional to the capacity beyond that."""
    import tracemalloc

    ReplayMemory(100, (84, 84), 4, n_streams=2, seed=0)  # first use imports numpy's rng modules
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mem = ReplayMemory(20_000, (84, 84), 4, n_streams=2, seed=0)
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    formula = 2 * 20_000 * (84 * 84 + 4 + 4 + 1 + 1) + 8 * 2
    assert mem.nbytes == formula
    assert formula <= allocated <= formula + 16_384  # + the object, its rng and small bookkeeping
    assert formula / (2 * 20_000) <= 7.2e3


@pytest.mark.parametrize("masks, prioritized, frame_shape, dtype", [
    (False, False, (5, 4), np.uint8), (True, False, (3,), np.float32), (True, True, (6, 6), np.uint8)])
def test_replay_nbytes_equals_the_arrays_of_a_full_memory(masks, prioritized, frame_shape, dtype):
    """The byte estimate made before allocating equals what a full memory really holds, counted here
    array by array (every entry of every stream written, the write counters, masks, the sum-tree)."""
    from madqn.core.replay import replay_nbytes

    mem = ReplayMemory(7, frame_shape, 2, n_streams=3, frame_dtype=dtype, n_actions=4,
                       store_action_masks=masks, prioritized=prioritized)
    for stream in range(3):
        for k in range(9):  # past the wrap-around
            mem.add(stream, np.full(frame_shape, k, dtype), k % 4, 0.5, False, k % 4 == 3,
                    **({"action_mask": np.ones(4, bool)} if masks else {}))
    arrays = [mem.frames, mem.actions, mem.rewards, mem.terminal, mem.episode_end, mem.written]
    arrays += [mem.action_masks] if masks else []
    arrays += [mem.tree.nodes] if prioritized else []
    held = sum(a.nbytes for a in arrays)
    per_entry = int(np.prod(frame_shape)) * np.dtype(dtype).itemsize + 4 + 4 + 1 + 1 + (4 if masks else 0)
    tree = 2 * 32 * 4 if prioritized else 0  # 21 leaves -> 32 -> 64 float32 nodes
    assert held == 3 * 7 * per_entry + 3 * 8 + tree
    assert replay_nbytes(7, 3, frame_shape, dtype, n_actions=4, store_action_masks=masks,
                         prioritized=prioritized) == held


def test_stream_capacity_splits_an_agents_budget():
    from madqn.core.replay import stream_capacity

    assert [stream_capacity(1_000_000, n) for n in (1, 8, 16)] == [1_000_000, 125_000, 62_500]
    assert stream_capacity(1_000, 3) == 333  # the remainder (1 entry) is not allocated


def test_entries_give_a_streams_stored_entries_oldest_first_and_rebuild_it_elsewhere():
    """After the wrap-around only the newest ``capacity`` entries are stored: ``entries`` yields those, oldest
    first, with masks; adding them to another memory (here a prioritized one) gives the same entries."""
    mem = ReplayMemory(10, (2, 2), 2, n_streams=2, n_actions=3, store_action_masks=True, seed=0)
    rng = np.random.default_rng(1)
    for n in range(25):
        end = n % 7 == 6
        mem.add(1, np.full((2, 2), n, np.uint8), n % 3, float(n), end and n % 2 == 0, end,
                action_mask=rng.random(3) < 0.7)
    mem.add(0, np.zeros((2, 2), np.uint8), 0, 0.0, False, False)
    entries = list(mem.entries(1))
    assert [int(e[0][0, 0]) for e in entries] == list(range(15, 25))
    frame, action, reward, terminal, episode_end, mask = entries[-2]  # entry 23
    assert (action, reward, terminal, episode_end) == (23 % 3, 23.0, False, False) and mask.dtype == bool
    assert entries[5][3:5] == (True, True) and entries[5][0][0, 0] == 20  # 20: a terminal episode end
    assert len(list(mem.entries(0))) == 1
    other = ReplayMemory(10, (2, 2), 2, n_streams=2, n_actions=3, store_action_masks=True, prioritized=True)
    for stream in range(2):
        for entry in mem.entries(stream):
            other.add(stream, *entry)
    for stream in range(2):
        for a, b in zip(mem.entries(stream), other.entries(stream), strict=True):
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # one transition more in the copy: the oldest entry's history starts fresh there (zero padding) while the
    # wrapped memory cannot know whether the overwritten entry before it ended an episode
    assert other.num_valid() == mem.num_valid() + 1 and mem.num_valid() > 0
