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

envs/shared_catch.py (every agent sees the SAME screen and must find its own paddle, as in Pong; balls
move diagonally, so hist_len = 4): random agents -2.5 / -2.4 (300 episodes). configs/shared_catch.toml
(3000 agent steps, Adam at 5e-4) reached 4.8 / 4.4 shared (seed 1), 4.0 / 4.5 shared (seed 2) and
4.8 / 4.8 independent (seed 1); with DQN3.0's RMSProp (lr 1e-3) a shared run was only at 1.3 / -2.2 after
2500 steps. Same pass rule as catch.
The indicator diagnosis (states where no action is right for both catchers, 5-11% of all): trained shared
networks chose different greedy actions under the two indicators, each right for its agent, in 94-100% of
them (4 runs); partially trained ones (scores ~1) in 38-44%; with the indicator channels made equal, 0%.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

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


# The AEC version's 3 seats take turns, one round of turns per agent step: a third of the parallel run's
# agent steps is as many moves, and 3 updates per round one update per move.
AEC_GRIDRACE = dict(steps=7_000, learn_start=170, target_q=170, ep_endt=1_700, n_replay=3)


@pytest.mark.slow
def test_mlp_learns_gridrace_turn_by_turn(tmp_path):
    """The AEC version (agents finish at different times, one joins late), ~35 s of CPU. The default suite
    covers turn-based play through tests/test_classic.py and test_env_adapters.py."""
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_aec_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                               **AEC_GRIDRACE), factory)


@pytest.mark.slow
def test_mlp_learns_gridrace_parallel_independent(tmp_path):
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                               sharing="independent"), factory)


def _small():
    return madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_small_env")


def _full():
    return madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_env")


# ---- one shared screen: each agent must find its own paddle (envs/shared_catch.py) -------------------

def _shared_catch():
    return madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "shared_catch.py") + ":make_env")


@pytest.fixture(scope="module")
def shared_catch_run(tmp_path_factory):
    """configs/shared_catch.toml in shared mode (agent indicator on), trained once for the tests below."""
    return madqn.train(_shared_catch(), ROOT / "configs" / "shared_catch.toml",
                       run_dir=tmp_path_factory.mktemp("shared_catch") / "run")


def test_shared_network_learns_its_own_paddle_on_a_shared_screen(shared_catch_run):
    """Default suite: identical frames for both agents, hist_len 4, one network; ~31 s of CPU, like catch_small."""
    check_learned(shared_catch_run, _shared_catch())


@pytest.mark.slow
def test_independent_networks_learn_their_own_paddle_on_a_shared_screen(tmp_path):
    result = madqn.train(_shared_catch(), ROOT / "configs" / "shared_catch.toml", run_dir=tmp_path / "run",
                         sharing="independent")
    check_learned(result, _shared_catch())


def indicator_choices(agents, episodes=30, seed=123):
    """Play greedy episodes of shared catch with ``agents`` and, on every state where no action is right for
    both catchers (env.optimal_moves: the moves after which a catcher can still catch its ball), ask the
    shared network for its greedy action on the SAME 4-frame stack under each agent indicator.
    Returns (n_states, own_0, own_1, differ): how often the action under catcher_0's indicator is right for
    catcher_0, under catcher_1's right for catcher_1, and how often the two actions differ."""
    env = _shared_catch()()
    network = agents.networks["catcher_0"]
    assert agents.networks["catcher_1"] is network and network.n_agents == 2
    n_states = own_0 = own_1 = differ = 0
    for episode in range(episodes):
        observations, infos = env.reset(seed=seed + episode)
        agents.reset()
        while env.agents:
            right = {a: env.optimal_moves(a) for a in env.agents}
            actions = agents.act(observations, infos, 0.0)
            stack = agents.histories["catcher_0"].state()
            assert np.array_equal(stack, agents.histories["catcher_1"].state())  # one screen for both
            if not right["catcher_0"] & right["catcher_1"]:
                with torch.no_grad():
                    q = network(torch.as_tensor(np.stack([stack, stack])), torch.tensor([0, 1]))
                greedy_0, greedy_1 = (int(x) for x in q.argmax(dim=1))
                n_states += 1
                own_0 += greedy_0 in right["catcher_0"]
                own_1 += greedy_1 in right["catcher_1"]
                differ += greedy_0 != greedy_1
            observations, _, _, _, infos = env.step(actions)
    return n_states, own_0, own_1, differ


def test_swapping_the_agent_indicator_swaps_which_paddle_the_shared_network_moves(shared_catch_run):
    """The issue's diagnosis: does the shared network know which paddle is its own? On states where the two
    catchers need different moves, the greedy action must follow the indicator (and be right for that agent)."""
    agents = madqn.load_agents(shared_catch_run.run_dir, seed=0)
    n_states, own_0, own_1, differ = indicator_choices(agents)
    print(f"{n_states} states where the catchers need different moves: right for catcher_0 {own_0}, "
          f"for catcher_1 {own_1}, greedy actions differ {differ}")
    assert n_states >= 20
    assert differ >= 0.8 * n_states and own_0 >= 0.8 * n_states and own_1 >= 0.8 * n_states

    # control: the same network with both indicator channels made equal cannot tell the agents apart
    conv1 = agents.networks["catcher_0"].conv1.weight
    with torch.no_grad():
        conv1[:, -1] = conv1[:, -2]
    _, _, _, blind_differ = indicator_choices(agents)
    assert blind_differ == 0


# precision = "bf16": the same learning tests, the same pass rules (docs/dqn3.md, "Precision").
@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_conv_stack_learns_small_catch_bf16(tmp_path, sharing):
    result = madqn.train(_small(), ROOT / "configs" / "catch_small.toml", run_dir=tmp_path / "run",
                         sharing=sharing, precision="bf16")
    check_learned(result, _small())


@pytest.mark.slow
def test_conv_stack_learns_catch_from_rgb_images_bf16(tmp_path):
    result = madqn.train(_full(), ROOT / "configs" / "catch.toml", run_dir=tmp_path / "run", precision="bf16")
    check_learned(result, _full())


@pytest.mark.slow
def test_mlp_learns_gridrace_turn_by_turn_bf16(tmp_path):
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_aec_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                               precision="bf16", **AEC_GRIDRACE), factory)


@pytest.mark.slow
def test_mlp_learns_gridrace_parallel_independent_bf16(tmp_path):
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "gridrace.py") + ":make_env")
    check_gridrace(madqn.train(factory, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                               sharing="independent", precision="bf16"), factory)
