"""madqn.load_agents / Agents.act and madqn.evaluate, on real envs and real checkpoints."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pettingzoo.classic import tictactoe_v3

import madqn
from madqn.evaluation.agents import Agents
from madqn.training.checkpoint import atomic_save, safe_load
from madqn.errors import CheckpointError, MadqnError
from madqn.evaluation import RandomPolicy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "envs"))

import catch  # noqa: E402
import gridrace  # noqa: E402

SHORT = {"steps": 300, "learn_start": 100, "update_freq": 2, "target_q": 50, "replay_memory": 2_000,
         "final_eval_episodes": 0, "prog_freq": 1_000, "save_freq": 10_000, "num_threads": 1}


@pytest.fixture(scope="module")
def catch_run(tmp_path_factory):
    """A short shared run on catch with hist_len 2 (so the recent history matters)."""
    run_dir = tmp_path_factory.mktemp("catch") / "run"
    return madqn.train(catch.make_env, ROOT / "configs" / "catch.toml", run_dir=run_dir, hist_len=2, **SHORT)


def test_load_agents_acts_greedily_on_its_history(catch_run):
    agents = madqn.load_agents(catch_run.run_dir)
    state = safe_load(catch_run.checkpoint)
    network = agents.networks["catcher_0"]
    assert network is agents.networks["catcher_1"]  # shared
    for name, tensor in network.state_dict().items():
        assert torch.equal(tensor, state["groups"]["shared"]["learner"]["online"][name])

    env = catch.make_env()
    obs, _ = env.reset(seed=4)
    agents.reset()
    spec = agents.specs["catcher_1"]
    history = np.zeros((2, 84, 84), np.uint8)  # DQN3.0's recent memory starts as zeros
    for t in range(6):
        history = np.concatenate([history[1:], spec.convert(obs["catcher_1"])[None]])
        with torch.no_grad():
            q = network(torch.as_tensor(history[None]), torch.tensor([1])).numpy()[0]
        actions = agents.act(obs)
        assert actions["catcher_1"] in np.flatnonzero(q == q.max())
        np.testing.assert_array_equal(agents.q_values("catcher_1"), q)  # the Q-values of the history it acted on
        obs, *_ = env.step(actions)


def test_loaded_agents_match_the_trainers_networks(catch_run):
    by_dir = madqn.load_agents(catch_run.run_dir)
    by_file = madqn.load_agents(catch_run.checkpoint, seed=0)
    by_folder = madqn.load_agents(catch_run.checkpoint.parent)
    env = catch.make_env()
    obs, _ = env.reset(seed=9)
    for t in range(10):
        a, b, c = by_dir.act(obs), by_file.act(obs), by_folder.act(obs)
        assert a == b == c
        obs, *_ = env.step(a)


def test_same_results_from_evaluate_with_the_same_seeds(catch_run):
    agents = madqn.load_agents(catch_run.run_dir, seed=3)
    first = madqn.evaluate(catch.make_env, agents, episodes=3, epsilon=0.05, seed=11)
    agents.rng = np.random.default_rng(3)
    second = madqn.evaluate(catch.make_env, agents, episodes=3, epsilon=0.05, seed=11)
    assert first.scores == second.scores and first.lengths == second.lengths and first.steps == [35, 35, 35]
    assert first.epsilon == 0.05 and first.episodes == 3 and first.incomplete == 0


def test_old_checkpoints_need_the_env(catch_run, tmp_path):
    state = safe_load(catch_run.checkpoint)
    del state["observation_specs"]
    old = tmp_path / "old.pt"
    atomic_save(state, old)
    with pytest.raises(CheckpointError, match="pass env= to load_agents"):
        madqn.load_agents(old)
    agents = madqn.load_agents(old, env=catch.make_env)
    assert agents.specs == madqn.load_agents(catch_run.run_dir).specs


@pytest.mark.parametrize("bad", ["missing_dir", "empty_dir", "garbage"])
def test_bad_checkpoint_paths_are_clear_errors(tmp_path, bad):
    path = tmp_path / bad
    if bad == "empty_dir":
        path.mkdir()
    if bad == "garbage":
        path = tmp_path / "x.pt"
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        madqn.load_agents(path)


def test_unknown_agent_is_a_clear_error(catch_run):
    agents = madqn.load_agents(catch_run.run_dir)
    with pytest.raises(MadqnError, match="no trained network for agents"):
        agents.act({"catcher_7": np.zeros((48, 66, 3), np.uint8)})


def test_evaluate_counts_each_agents_raw_score_and_length():
    """Walking straight to the flag: every runner scores 1 - 0.05 * steps and the episode ends when the last one arrives."""

    class Walker:
        def reset(self):
            pass

        def act(self, observations, infos=None, epsilon=0.0):
            out = {}
            for a, o in observations.items():
                d = o[2:4] - o[0:2]
                out[a] = 4 if d[0] > 0 else 3 if d[0] < 0 else 2 if d[1] > 0 else 1
            return out

    result = madqn.evaluate(gridrace.make_env, Walker(), episodes=4, seed=0)
    for k in range(4):
        env = gridrace.make_env()
        env.reset(seed=k)
        distance = np.abs(env._flag - env._pos).sum(axis=1)
        joins = distance[:2].max() >= 3  # runner_2 joins at step 3 unless both others already arrived
        expected = [int(distance[0]), int(distance[1]), int(distance[2]) if joins else 0]
        assert [result.lengths[a][k] for a in env.possible_agents] == expected
        for agent, n in zip(env.possible_agents, expected):
            assert result.scores[agent][k] == pytest.approx(1.0 - 0.05 * n if n else 0.0)
        assert result.steps[k] == max(expected[0], expected[1], 3 + expected[2] if joins else 0)


def test_evaluate_with_a_policy_per_seat_and_a_step_budget(catch_run):
    agents = madqn.load_agents(catch_run.run_dir)
    mixed = madqn.evaluate(catch.make_env, {"catcher_0": agents, "catcher_1": "random"}, episodes=5, seed=0,
                           max_steps=35 * 3 + 10)
    assert mixed.episodes == 3 and mixed.incomplete == 1  # the 4th episode is cut short and dropped
    assert all(len(s) == 3 for s in mixed.scores.values())
    with pytest.raises(MadqnError, match="no policy for agents"):
        madqn.evaluate(catch.make_env, {"catcher_0": agents}, episodes=1)
    with pytest.raises(MadqnError, match="unknown policy"):
        madqn.evaluate(catch.make_env, "greedy", episodes=1)


def test_agents_respect_action_masks_on_a_turn_based_game(tmp_path):
    result = madqn.train(tictactoe_v3.env, None, run_dir=tmp_path / "run", sharing="shared", hist_len=1,
                         mlp_hidden=[16], device="cpu", **{**SHORT, "final_eval_episodes": 3})
    assert result.evaluation.episodes == 3 and set(result.eval_scores) == {"player_1", "player_2"}
    agents = madqn.load_agents(result.run_dir)
    random = RandomPolicy({"player_1": 9, "player_2": 9}, seed=0)
    for policy, eps in [(agents, 0.0), (agents, 1.0), (random, 1.0)]:
        for episode in range(10):
            env = tictactoe_v3.env()
            env.reset(seed=episode)
            if policy is agents:
                agents.reset()
            for agent in env.agent_iter():
                obs, _, term, trunc, _ = env.last()
                if term or trunc:
                    env.step(None)
                    continue
                action = policy.act({agent: obs}, epsilon=eps)[agent]
                assert obs["action_mask"][action] == 1
                env.step(action)


def test_from_trainer_and_checkpoint_agree_on_specs(catch_run):
    loaded = madqn.load_agents(catch_run.run_dir)
    assert isinstance(loaded, Agents)
    spec = loaded.specs["catcher_0"]
    assert (spec.kind, spec.layout, spec.raw_shape, spec.preprocess) == ("image", "HWC", (48, 66, 3), True)
    assert loaded.hist_len == 2
