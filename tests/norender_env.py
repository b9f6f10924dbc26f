"""The small catch of envs/catch.py without ``render()``: PettingZoo's ``ParallelEnv.render`` raises
NotImplementedError, as for any env that does not define one. Its observations are images."""

import importlib.util
from pathlib import Path

from pettingzoo import ParallelEnv

_spec = importlib.util.spec_from_file_location("_catch_without_render",
                                               Path(__file__).resolve().parents[1] / "envs" / "catch.py")
catch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catch)


class NoRenderCatch(catch.CatchEnv):
    render = ParallelEnv.render


def make_env() -> NoRenderCatch:
    """Two catchers on 36x36 single-channel frames (gray levels 0, 80, 110, 255), as make_small_env."""
    return NoRenderCatch(width=4, height=9, cell=4, rgb=False)
