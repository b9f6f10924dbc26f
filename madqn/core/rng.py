"""Numpy generators in checkpoints: the one way madqn saves and restores a ``np.random.Generator``.

A generator's state is saved as six int64 words (``generator_state``): PCG64's 128-bit state and
increment as 64-bit halves, then ``has_uint32`` and ``uinteger``, each word the int64 bit pattern of
its uint64 (uint64 travels badly through ``torch.save``; int64 arrays and tensors go anywhere a
checkpoint goes, ``np.savez`` included). ``set_generator_state`` restores those words, and also the
``bit_generator.state`` dicts that checkpoints before this format held for the learner set's and the
acting loop's generators.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MASK64 = (1 << 64) - 1


def generator_state(rng: np.random.Generator) -> np.ndarray:
    """``rng``'s state as six int64 words (see the module docstring); ``rng`` must be a PCG64 generator,
    as ``np.random.default_rng`` makes."""
    state = rng.bit_generator.state
    if state["bit_generator"] != "PCG64":
        raise ValueError(f"madqn saves PCG64 generators (np.random.default_rng), not {state['bit_generator']}")
    words = [state["state"]["state"], state["state"]["inc"]]
    halves = [w for x in words for w in (x >> 64, x & _MASK64)]
    return np.array([*halves, state["has_uint32"], state["uinteger"]], dtype=np.uint64).view(np.int64)


def set_generator_state(rng: np.random.Generator, saved: Any) -> None:
    """Put ``rng`` (PCG64) in the state ``saved``: ``generator_state``'s words (an array or a tensor), or a
    ``bit_generator.state`` dict (checkpoints written before the words). Raises ValueError otherwise."""
    if isinstance(saved, dict):
        rng.bit_generator.state = saved
        return
    words = np.array(saved.numpy() if hasattr(saved, "numpy") else saved, dtype=np.int64).reshape(-1)  # tensor/array
    if words.shape != (6,):
        raise ValueError(f"a saved generator state is 6 words, got shape {tuple(np.shape(saved))}")
    w = [int(x) for x in words.view(np.uint64)]
    rng.bit_generator.state = {"bit_generator": "PCG64",
                               "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                               "has_uint32": w[4], "uinteger": w[5]}
