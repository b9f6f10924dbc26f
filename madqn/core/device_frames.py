"""Replay frames on the learner's device, and one host-to-device copy per minibatch.

A DQN3.0 replay memory (madqn.core.replay) keeps every frame once, on the host. Each update then gathers
(B, hist_len + 1) frames there and copies them to the device: on a GPU that copy, with the 4-6 small arrays
of the batch, is most of the host work of an update. With ``replay_device = "learner"``:

- :class:`DeviceFrames` keeps a copy of a memory's frames on the device, one row per replay position plus
  one zero row (what a zero-padded history frame reads). New frames are staged on the host and reach the
  device in one copy when the next batch needs them (:meth:`DeviceFrames.flush`);
- the memory draws the minibatch as before (same generator, same validity rule) but returns the frame rows
  of its stacks instead of the stacks (``ReplayMemory.sample(frames=False)``); the device gathers them
  (:meth:`DeviceFrames.stacks`): the same stacks, bit for bit (tests/test_device_frames.py);
- :class:`Stager` packs a batch's small arrays (rows, actions, rewards, terminals, agent ids, discounts,
  weights, masks) into one pinned host buffer and copies it to the device at once.

The host memory stays the one that checkpoints, validation and ``madqn bench`` read; the device copy is
rebuilt from it after a resume (:meth:`DeviceFrames.load`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from madqn.core.replay import ReplayMemory

# frames staged on the host before they are copied to the device in one go (a flush also happens before
# every batch is gathered)
STAGE_ROWS = 1024


class DeviceFrames:
    """A copy of ``replay``'s frames on ``device``: ``(n_streams * capacity + 1, *frame_shape)``, the last
    row zeros."""

    def __init__(self, replay: ReplayMemory, device: torch.device):
        self.replay = replay
        self.device = torch.device(device)
        self.zero_row = replay.n_streams * replay.capacity
        dtype = torch.from_numpy(replay.frames[:0, :0]).dtype
        self.frames = torch.zeros((self.zero_row + 1, *replay.frame_shape), dtype=dtype, device=self.device)
        pin = self.device.type == "cuda"
        self._staged = torch.empty((STAGE_ROWS, *replay.frame_shape), dtype=dtype, pin_memory=pin)
        self._rows = np.empty(STAGE_ROWS, dtype=np.int64)
        self._n = 0
        self._copied: torch.cuda.Event | None = None  # CUDA: the last flush's copy has read the staging buffer

    @staticmethod
    def nbytes(replay: ReplayMemory) -> int:
        """Device memory the copy of ``replay``'s frames takes."""
        return (replay.n_streams * replay.capacity + 1) * int(np.prod(replay.frame_shape)) * replay.frames.itemsize

    def written(self, stream: int) -> None:
        """The memory just wrote its newest entry of ``stream``: stage that frame for the device."""
        r = self.replay
        pos = int((r.written[stream] - 1) % r.capacity)
        if self._n == STAGE_ROWS:
            self.flush()
        if self._n == 0 and self._copied is not None:  # refill only what the last copy has read (no wait in practice)
            self._copied.synchronize()
            self._copied = None
        self._staged[self._n].numpy()[...] = r.frames[stream, pos]
        self._rows[self._n] = stream * r.capacity + pos
        self._n += 1

    def flush(self) -> None:
        """Copy the staged frames to their rows on the device (a row staged twice: its latest frame)."""
        if not self._n:
            return
        rows = self._rows[: self._n]
        last = len(rows) - 1 - np.unique(rows[::-1], return_index=True)[1]  # each row's latest staging
        last.sort()
        src = self._staged[: self._n] if len(last) == self._n else self._staged[torch.from_numpy(last)]
        index = torch.from_numpy(rows[last]).to(self.device, non_blocking=True)
        self.frames.index_copy_(0, index, src.to(self.device, non_blocking=True))
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        self._n = 0

    def load(self) -> None:
        """Copy all of the memory's frames (after it was loaded from a checkpoint)."""
        self._n = 0
        flat = torch.from_numpy(self.replay.frames.reshape(-1, *self.replay.frame_shape))
        self.frames[: self.zero_row].copy_(flat)
        self.frames[self.zero_row].zero_()

    def stacks(self, rows: torch.Tensor) -> torch.Tensor:
        """The frames of ``rows`` ((B, hist_len) on the device): (B, hist_len, *frame_shape) stacks."""
        return self.frames[rows]


class Stager:
    """Several small host arrays to the device in one copy: packed into one pinned byte buffer (each array
    at an 8-byte aligned offset), copied once, handed back as device views of their dtypes and shapes.

    On CPU nothing is copied: the arrays come back as tensors sharing their memory (``pack = True`` packs
    them all the same, into an unpinned buffer that the next call reuses: what the tests check the layout with)."""

    def __init__(self, device: torch.device, pack: bool | None = None):
        self.device = torch.device(device)
        self.pack = self.device.type == "cuda" if pack is None else pack
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[torch.Tensor | None]:
        if not self.pack:
            return [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        cuda = self.device.type == "cuda"
        arrays = [None if a is None else np.ascontiguousarray(a) for a in arrays]
        offsets, size = [], 0
        for a in arrays:
            offsets.append(size)
            if a is not None:
                size += -(-a.nbytes // 8) * 8
        if self._host is None or self._host.numel() < size:
            self._host = torch.empty(max(size, 4096), dtype=torch.uint8, pin_memory=cuda)
        elif self._event is not None:
            self._event.synchronize()  # the previous batch's copy has left the buffer
        host = self._host.numpy()
        for a, off in zip(arrays, offsets):
            if a is not None:
                host[off: off + a.nbytes] = a.view(np.uint8).reshape(-1)
        device = self._host[:size].to(self.device, non_blocking=True)
        if cuda:
            self._event = torch.cuda.Event()
            self._event.record()
        out: list[torch.Tensor | None] = []
        for a, off in zip(arrays, offsets):
            if a is None:
                out.append(None)
                continue
            dtype = torch.from_numpy(a[:0]).dtype
            out.append(device[off: off + a.nbytes].view(dtype).view(a.shape))
        return out
