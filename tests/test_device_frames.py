"""Replay frames on the learner's device (``replay_device = "learner"``, madqn.core.device_frames) against the
host replay as reference: the same minibatches bit for bit for the same seed (wrap-around, episode ends,
zero padding, n-step returns, prioritized draws, several streams), the same weights after updates, a resume
rebuilding the device copy, and the one-copy stager. On CPU the "device" is the CPU: the gather path is the
one a GPU runs; the CUDA cases run where a GPU is (skipped elsewhere)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from madqn.config import Config
from madqn.core.device_frames import STAGE_ROWS, DeviceFrames, Stager
from madqn.core.replay import ReplayMemory
from madqn.envs.adapters import make_env
from madqn.training.learners import LearnerSet

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _twins(device, **kw):
    """A host memory and an equal one (same seed) with its frames mirrored on ``device``."""
    host, mirrored = (ReplayMemory(seed=7, **kw) for _ in range(2))
    return host, mirrored, DeviceFrames(mirrored, torch.device(device))


def _fill(memories, frames, n, seed):
    """The same random entries into every memory (episode ends ~1 in 8, terminals among them), streams in turn;
    ``frames`` is told of each write to the second memory."""
    rng = np.random.default_rng(seed)
    mem = memories[0]
    for i in range(n):
        stream = i % mem.n_streams
        end = bool(rng.random() < 0.125)
        entry = (rng.integers(1, 256, mem.frame_shape, dtype=np.uint8), int(rng.integers(4)),
                 float(rng.integers(-1, 2)), end and bool(rng.random() < 0.5), end)
        for m in memories:
            m.add(stream, *entry)
        frames.written(stream)


def _assert_same_batch(host_batch, rows_batch, frames):
    states = frames.stacks(torch.from_numpy(rows_batch.state_rows).to(frames.device)).cpu().numpy()
    next_states = frames.stacks(torch.from_numpy(rows_batch.next_rows).to(frames.device)).cpu().numpy()
    np.testing.assert_array_equal(states, host_batch.states)
    np.testing.assert_array_equal(next_states, host_batch.next_states)
    for field in ("actions", "rewards", "terminals", "streams", "indices", "entries", "discounts", "weights"):
        want, got = getattr(host_batch, field), getattr(rows_batch, field)
        assert (want is None) == (got is None), field
        if want is not None:
            np.testing.assert_array_equal(got, want, err_msg=field)
            assert got.dtype == want.dtype, field


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_step, prioritized", [(1, False), (3, False), (1, True), (3, True)])
def test_device_gathered_batches_equal_the_host_replays_for_the_same_seed(device, n_step, prioritized):
    # 3 streams of 40 entries, 300 written: every stream wrapped around several times; hist_len 4 pads
    kw = dict(capacity=40, frame_shape=(6, 5), hist_len=4, n_streams=3, n_step=n_step, discount=0.9,
              prioritized=prioritized)
    host, mirrored, frames = _twins(device, **kw)
    _fill([host, mirrored], frames, 300, seed=n_step)
    frames.flush()
    padded = 0
    for _ in range(20):
        a, b = host.sample(32, beta=0.5), mirrored.sample(32, beta=0.5, frames=False)
        assert a.state_rows is None and b.states is None
        _assert_same_batch(a, b, frames)
        padded += int((b.state_rows == frames.zero_row).sum())
        if prioritized:  # the same priority updates keep the two trees equal
            deltas = np.linspace(-1, 1, 32)
            host.update_priorities(a.streams, a.indices, deltas, entries=a.entries)
            mirrored.update_priorities(b.streams, b.indices, deltas, entries=b.entries)
    assert padded > 0  # the padding rows were exercised
    # more writes, some positions written twice before the next flush (capacity 40 < 130 new entries)
    _fill([host, mirrored], frames, 130, seed=99)
    for _ in range(5):
        a, b = host.sample(32), mirrored.sample(32, frames=False)
        frames.flush()
        _assert_same_batch(a, b, frames)


def test_the_device_copy_holds_every_stored_frame_and_a_zero_row_after_staging_overflows():
    host, mirrored, frames = _twins("cpu", capacity=STAGE_ROWS + 100, frame_shape=(3,), hist_len=2, n_streams=2)
    _fill([host, mirrored], frames, 2 * STAGE_ROWS + 150, seed=3)  # the staging buffer fills and flushes twice
    frames.flush()
    np.testing.assert_array_equal(frames.frames[:-1].numpy(), mirrored.frames.reshape(-1, 3))
    assert not frames.frames[-1].any()


def _learner_set(replay_device, **kw):
    cfg = Config(env=CATCH, replay_memory=400, learn_start=0, hist_len=2, mlp_hidden=[16], device="cpu", seed=4,
                 replay_device=replay_device, **kw)
    env = make_env(cfg.env, cfg, seed=cfg.seed)
    torch.manual_seed(0)
    learners = LearnerSet(cfg, env, 1, False, [11, 12], torch.device("cpu"))
    return learners, env


@pytest.mark.parametrize("changes", [dict(), dict(sharing="independent", n_step=3, double=True),
                                     dict(prioritized=True, optimizer="adam")])
def test_learners_with_frames_on_the_device_train_to_the_same_weights(changes):
    """The learner set's whole path (store, sample, gather, update, priorities): the same weights after 50
    updates as with the host replay, and a replay restored from a checkpoint comes back on the device."""
    host, env = _learner_set("host", **changes)
    device, _ = _learner_set("learner", **changes)
    device.stage = Stager(torch.device("cpu"), pack=True)  # the batch packed into one buffer, as on a GPU
    rng = np.random.default_rng(0)
    space = env.observation_space(env.possible_agents[0])
    for t in range(300):
        for agent in env.possible_agents:
            end = bool(t % 17 == 16)
            entry = (agent, 0, rng.integers(0, 256, space.shape).astype(space.dtype), int(rng.integers(3)),
                     float(rng.integers(-1, 2)), end, end)
            host.add(*entry)
            device.add(*entry)
    for _ in range(50):
        host.learn(step=1000)
        device.learn(step=1000)
    for a, b in zip(host.online_networks, device.online_networks):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), name
    assert all(g.updates == 50 for g in device.groups)
    # resume: a fresh learner set loads the replay; its device copy is the loaded frames
    restored, _ = _learner_set("learner", **changes)
    restored.load_replay_state_dict(device.replay_state_dict())
    for g in restored.groups:
        np.testing.assert_array_equal(g.device_frames.frames[:-1].numpy(),
                                      g.replay.frames.reshape(-1, *g.replay.frame_shape))
    env.close()


@pytest.mark.parametrize("device, pack", [("cpu", False), ("cpu", True)] + [("cuda", None)] * ("cuda" in DEVICES))
def test_the_stager_hands_back_each_array_with_its_dtype_and_shape(device, pack):
    """One buffer, each array at an 8-byte aligned offset, handed back as views of its dtype and shape (packed
    as on a GPU, also on the CPU with pack=True), reused call after call."""
    stage = Stager(torch.device(device), pack)
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 255, (32, 5, 84, 84), dtype=np.uint8), rng.integers(0, 6, 32),
              rng.random(32).astype(np.float32), None, rng.random((32, 6)) < 0.5, np.arange(3, dtype=np.int32)]
    for _ in range(3):  # the pinned buffer is reused
        out = stage(arrays)
        for a, t in zip(arrays, out):
            if a is None:
                assert t is None
                continue
            assert t.device.type == device and tuple(t.shape) == a.shape
            assert t.dtype == torch.from_numpy(a[:0]).dtype
            np.testing.assert_array_equal(t.cpu().numpy(), a)
        arrays[2] = arrays[2] + 1
