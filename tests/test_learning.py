"""Learning: DQN3.0's conv stack learns envs/catch.py and the MLP learns envs/gridrace.py on a CPU,
clearly beating random agents.

Thresholds come from measured scores (5 balls per episode, score = catches - misses, in [-5, 5]):
- random agents: mean -2.5 per episode on the 36x36 catch (300 episodes, sd 1.9 per episode, so
  the sd of a 20-episode mean is ~0.45), -2.9 on the 84x84-preprocessed RGB catch;
- trained (configs/catch_small.toml, 4000 agent steps, shared): 4.8 / 4.5 (seed 1), 4.6 / 4.8
  (seed 2), 4.9 / 4.8 (seed 3); independent: 4.9 / 4.7; configs/catch.toml (84x84 RGB): 4.4 / 3.9.
Each agent must average >= 1.0 over 20 evaluation episodes (epsilon eval_ep = 0.05) — about 3
points below every trained run and 7 sds of a random mean above random — and beat random agents
on the same 20 episode seeds by >= 3.0.

envs/gridrace.py (3 runners, -0.05 per step, +1 at the flag; the best score is 1 - 0.05 * distance,
0.83 on average): random agents score -0.79 / -0.84 / -0.74 (200 episodes); configs/gridrace.toml
(20000 agent steps, shared MLP) reaches 0.82 / 0.83 / 0.68 as a parallel env and 0.81 / 0.83 / 0.67
played turn by turn as an AEC env (on the final evaluation's 20 seeds random agents average
-0.51 / -0.78 / -0.34; the late joiner loses less time). Each runner must average >= 0.4 and beat
random on the same seeds by >= 0.75.
"""

from pathlib import Path

import pytest

import madqn

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 1.0
MARGIN_OVER_RANDOM = 3.0


def check_learned(result, factory):
    random = madqn.evaluate(factory, "random", episodes=result.evaluation.episodes, seed=result_seed(result))
    trained, baseline = result.eval_scores, random.mean_scores()
    print(f"trained {trained} random {baseline} training {result.wall_time:.0f} s")
    assert result.evaluation.episodes == 20
    for agent in trained:
        assert trained[agent] >= THRESHOLD, (trained, baseline)
        assert trained[agent] - baseline[agent] >= MARGIN_OVER_RANDOM, (trained, baseline)


def result_seed(result):
    return madqn.make_config(result.run_dir / "config.toml").seed + 1_000_000  # final evaluation's episode seeds


def test_conv_stack_learns_small_catch(tmp_path):
    """Default suite: 36x36 frames straight into the conv net (preprocess = none), ~30 s of CPU."""
    result = madqn.train(_small(), ROOT / "configs" / "catch_small.toml", run_dir=tmp_path / "run")
    check_learned(result, _small())


@pytest.mark.slow
def test_conv_stack_learns_small_catch_independent(tmp_path):
    result = madqn.train(_small(), ROOT / "configs" / "catch_small.toml", run_dir=tmp_path / "run",
                         sharing="independent")
    check_learned(result, _small())


@pytest.mark.slow
def test_conv_stack_learns_catch_from_rgb_images(tmp_path):
    """RGB 48x66 images preprocessed to 84x84 luminance (DQN3.0's pipeline), a few CPU minutes."""
    result = madqn.train(_full(), ROOT / "configs" / "catch.toml", run_dir=tmp_path / "run")
    check_learned(result, _full())


def check_gridrace(result, factory):
    random = madqn.evaluate(factory, "random", episodes=result.evaluation.episodes, seed=result_seed(result))
    trained, baseline = result.eval_scores, random.mean_scores()
    print(f"trained {trained} random {baseline} training {result.wall_time:.0f} s")
    for agent in trained:
        assert trained[agent] >= 0.4 and trained[agent] - baseline[agent] >= 0.75, (trained, baseline)


def test_mlp_learns_gridrace_turn_by_turn(tmp_path):
    """Default suite: the AEC version (agents finish at different times, one joins late), ~20 s of CPU."""
    factory = madqn.env.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_aec_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run"), factory)


@pytest.mark.slow
def test_mlp_learns_gridrace_parallel_independent(tmp_path):
    factory = madqn.env.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                               sharing="independent"), factory)


def _small():
    return madqn.env.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_small_env")


def _full():
    return madqn.env.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_env")
