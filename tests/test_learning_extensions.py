"""Every extension beyond DQN3.0 still learns envs/catch.py and envs/gridrace.py in both sharing modes,
with the pass rules of tests/test_learning.py, and rainbow_lite reaches them in fewer agent steps.

Each run trains with the env's config (configs/catch_small.toml, configs/gridrace.toml) plus the
switch, and stops at the first check (every 250 / 1000 agent steps) where the current networks pass
test_learning's rule, evaluated as its final evaluation is (20 episodes at epsilon eval_ep on the
final evaluation's seeds, against random agents on the same seeds; tests/steps_to_pass.py). A run
that never passes within the config's budget fails.

Measured (seed 1; agent steps at the first passing check, budget 4,000 on catch and 20,000 on gridrace):

| switch | catch shared | catch independent | gridrace shared | gridrace independent |
|---|---|---|---|---|
| none (DQN3.0) | 2,750 | | 13,000 | |
| double | 2,750 | 2,500 | 13,000 | 9,000 |
| dueling | 2,250 | 2,000 | 7,000 | 7,000 |
| n_step 3 | 1,500 | 1,750 | 6,000 | 6,000 |
| prioritized | 2,750 | 2,250 | 9,000 | 7,000 |
| adam (adam_eps 4.8e-3) | 1,500 | 1,250 | 4,000 | 3,000 |
| adam, adam_eps 1.5e-4 | 1,250 | 1,250 | 4,000 | 4,000 |
| all five (rainbow_lite's switches) | 1,000 | 1,000 | 3,000 | |

The default suite keeps one run (all five switches, independent networks, catch: ~25 s); the rest is slow.
"""

from pathlib import Path

import pytest

import madqn
from madqn.config import load_toml
from steps_to_pass import StepsToPass
from test_learning import MARGIN_OVER_RANDOM, THRESHOLD

ROOT = Path(__file__).resolve().parents[1]
SWITCH_KEYS = ("double", "dueling", "n_step", "prioritized", "priority_alpha", "priority_beta", "optimizer", "adam_eps")
# rainbow_lite's switches; its Atari budget and Adam's lr 6.25e-5 stay with Pong (the env configs keep their lr)
RAINBOW = {k: v for k, v in load_toml(ROOT / "configs" / "rainbow_lite.toml").items() if k in SWITCH_KEYS}
OPTIONS = {"double": {"double": True}, "dueling": {"dueling": True}, "n_step": {"n_step": 3},
           "prioritized": {"prioritized": True}, "adam": {"optimizer": "adam"}}


def catch_rule(trained, random):  # test_learning.check_learned
    return all(trained[a] >= THRESHOLD and trained[a] - random[a] >= MARGIN_OVER_RANDOM for a in trained)


def gridrace_rule(trained, random):  # test_learning.check_gridrace
    return all(trained[a] >= 0.4 and trained[a] - random[a] >= 0.75 for a in trained)


ENVS = {
    "catch": ("catch.py:make_small_env", "catch_small.toml", 250, catch_rule),
    "gridrace": ("gridrace.py:make_env", "gridrace.toml", 1000, gridrace_rule),
}


def train_until_pass(env, tmp_path, **overrides):
    """Train with the env's config and ``overrides`` until the pass rule holds; the agent steps it took."""
    spec, config, every, rule = ENVS[env]
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / spec))
    hook = StepsToPass(factory, every, rule)
    result = madqn.train(factory, ROOT / "configs" / config, run_dir=tmp_path / "run", hooks=[hook],
                         handle_signals=False, **overrides)
    print(f"{env} {overrides}: passed at {hook.passed_at} agent steps (random {hook.random}); checks {hook.history}")
    assert hook.passed_at is not None and result.steps == hook.passed_at, (hook.history, hook.random)
    assert rule(hook.history[-1][1], hook.random)
    return hook.passed_at


def test_rainbow_lite_learns_small_catch_independent(tmp_path):
    """Default suite: all five switches at once, one network per agent (~30 s of CPU)."""
    train_until_pass("catch", tmp_path, sharing="independent", **RAINBOW)


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["shared", "independent"])
@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_learns(tmp_path, option, env, sharing):
    train_until_pass(env, tmp_path, sharing=sharing, **OPTIONS[option])


@pytest.mark.slow
@pytest.mark.parametrize("env", list(ENVS))
def test_rainbow_lite_passes_in_fewer_steps_than_dqn3(tmp_path, env):
    dqn3 = train_until_pass(env, tmp_path / "dqn3", sharing="shared")
    rainbow = train_until_pass(env, tmp_path / "rainbow", sharing="shared", **RAINBOW)
    print(f"{env}: DQN3.0 passes at {dqn3} agent steps, rainbow_lite at {rainbow}")
    assert rainbow < dqn3
