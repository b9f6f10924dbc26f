"""The example envs in envs/: PettingZoo API tests, their rules, and training on them through the
library and the CLI in both sharing modes, with the replay streams checked entry by entry."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test

import madqn
from madqn.training.checkpoint import safe_load
from madqn.config import make_config
from madqn.training.metrics import MetricsHook
from madqn.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "envs"))

import catch  # noqa: E402
import gridrace  # noqa: E402
import pong_mirrored  # noqa: E402
import pong_vs_random  # noqa: E402
import shared_catch  # noqa: E402
from helpers import read_csv  # noqa: E402

TINY = {"steps": 160, "learn_start": 100, "update_freq": 4, "target_q": 40, "replay_memory": 2_000,
        "final_eval_episodes": 2, "prog_freq": 80, "save_freq": 1_000, "num_threads": 1}


# ---- PettingZoo API tests -------------------------------------------------------------------

@pytest.mark.parametrize("factory", [catch.make_env, catch.make_env_3, catch.make_small_env,
                                     gridrace.make_env, gridrace.make_heterogeneous_env, shared_catch.make_env])
def test_parallel_api(factory):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(factory(), num_cycles=300)
    assert not caught, [str(w.message) for w in caught]  # not even a soft API warning


def test_aec_api():
    api_test(gridrace.make_aec_env(), num_cycles=300)


@pytest.mark.parametrize("factory", [catch.make_env, gridrace.make_env, shared_catch.make_env])
def test_same_seed_same_episode(factory):
    def rollout(seed):
        env = factory()
        obs, _ = env.reset(seed=seed)
        frames = [obs]
        rng = np.random.default_rng(0)
        while env.agents:
            obs, *_ = env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
            frames.append(obs)
        return frames

    a, b, c = rollout(5), rollout(5), rollout(6)
    assert len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))
    assert not all(np.array_equal(x[k], y[k]) for x, y in zip(a, c) for k in x if k in y)


# ---- rules ---------------------------------------------------------------------------------

def test_pong_vs_random_is_pong_v3_with_a_seeded_random_second_seat():
    """envs/pong_vs_random.py: first_0's frames, rewards and episode end are exactly pong_v3's under the joint
    action (learner's action, second_0 drawn from the episode's seeded generator); it passes the API test."""
    parallel_api_test(pong_vs_random.make_env(), num_cycles=50)
    env, reference = pong_vs_random.make_env(), madqn.envs.atari.make_atari_env("pong_v3")
    obs, _ = env.reset(seed=3)
    ref_obs, _ = reference.reset(seed=3)
    opponent, learner = np.random.default_rng([3, 1]), np.random.default_rng(0)
    rewards = []
    for _ in range(1_000):
        action = int(learner.integers(6))
        joint = {"first_0": action, "second_0": int(opponent.integers(6))}
        assert env.agents == ["first_0"] and np.array_equal(obs["first_0"], ref_obs["first_0"])
        obs, reward, term, trunc, _ = env.step({"first_0": action})
        ref_obs, ref_reward, ref_term, ref_trunc, _ = reference.step(joint)
        assert list(obs) == ["first_0"]
        assert (reward["first_0"], term["first_0"], trunc["first_0"]) == (
            ref_reward["first_0"], ref_term["first_0"], ref_trunc["first_0"])
        rewards.append(reward["first_0"])
    assert -1.0 in rewards and 1.0 in rewards  # points were played both ways

def test_pong_mirrored_is_pong_v3_with_the_left_seat_seeing_the_screen_flipped():
    """envs/pong_mirrored.py: rewards, episode ends and first_0's frames are exactly pong_v3's; second_0's frame
    is pong_v3's flipped left to right, and the action that moves a paddle up (RIGHT) does so for both seats."""
    parallel_api_test(pong_mirrored.make_env(), num_cycles=50)
    env, reference = pong_mirrored.make_env(), madqn.envs.atari.make_atari_env("pong_v3")
    obs, _ = env.reset(seed=3)
    ref_obs, _ = reference.reset(seed=3)
    rng = np.random.default_rng(0)
    rewards = []
    for _ in range(1_000):
        assert np.array_equal(obs["first_0"], ref_obs["first_0"])
        assert np.array_equal(obs["second_0"], ref_obs["second_0"][:, ::-1])
        assert not np.array_equal(obs["second_0"], ref_obs["second_0"])  # the picture is not symmetric
        joint = {a: int(rng.integers(6)) for a in env.agents}
        obs, reward, term, trunc, _ = env.step(joint)
        ref_obs, *ref = reference.step(joint)
        assert (reward, term, trunc) == tuple(ref[:3])
        rewards.append(reward["first_0"])
        if not env.agents:
            assert not reference.agents
            break
    assert -1.0 in rewards and 1.0 in rewards

    def own_paddle_top(frame):  # the top row of the paddle at the right edge (each seat's own, once mirrored)
        column = frame[14:76, 74:78].astype(int)
        rows = np.flatnonzero((column != np.bincount(column.ravel()).argmax()).any(1))
        return rows.min()

    for seat in ("first_0", "second_0"):
        tops = {}
        for action in (2, 3):  # RIGHT, LEFT
            obs, _ = env.reset(seed=0)
            for _ in range(6):
                obs, *_ = env.step({a: action if a == seat else 0 for a in env.agents})
            tops[action] = own_paddle_top(obs[seat])
        assert tops[2] < tops[3], (seat, tops)  # RIGHT moved the seat's own paddle higher than LEFT did


def test_shared_catch_one_screen_for_all_and_optimal_moves_match_a_search():
    """Every catcher gets the same frame; optimal_moves (a look-ahead of the ball) agrees with an exhaustive
    search over move sequences played through step() on copies of the env."""
    import copy

    env = shared_catch.SharedCatchEnv(cell=1)
    observations, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(120):
        frame = observations["catcher_0"]
        assert observations["catcher_1"] is frame and frame.shape == (9, 9)
        for i in range(2):
            assert frame[8, 5 * i + env._paddle[i]] == 255 and frame[env._ball_row[i], 5 * i + env._ball_col[i]] == 255
        assert (frame[:, 4] == shared_catch.WALL).all()
        steps_left = env.height - 1 - int(env._ball_row[0])
        if steps_left <= 4:  # 3 ** steps_left move sequences
            searched = set()
            for first in range(3):
                for rest in np.ndindex(*([3] * (steps_left - 1))):
                    trial = copy.deepcopy(env)
                    for move in (first, *rest):
                        _, rewards, _, _, _ = trial.step({"catcher_0": move, "catcher_1": 0})
                    if rewards["catcher_0"] == 1.0:
                        searched.add(first)
                        break
            assert env.optimal_moves("catcher_0") == (searched or {0, 1, 2})
            checked += 1
        observations, *_ = env.step({a: int(rng.integers(3)) for a in env.agents})
        if not env.agents:
            observations, _ = env.reset()
    assert checked > 40

class ScriptedCatcher:
    """Reads its own lane (white cells on the left) from the raw image and moves under the ball.

    ``toward=False`` moves away from the ball instead. A policy for madqn.evaluate."""

    def __init__(self, env, toward=True):
        self.width, self.height, self.cell, self.toward = env.width, env.height, env.cell, toward

    def reset(self):
        pass

    def act(self, observations, infos=None, epsilon=0.0):
        actions = {}
        for agent, image in observations.items():
            lane = image[::self.cell, : self.width * self.cell: self.cell]
            white = lane[..., 0] == 255 if lane.ndim == 3 else lane == 255
            paddle = int(np.flatnonzero(white[-1])[0])
            ball_rows = np.flatnonzero(white[:-1].any(axis=1))
            ball = int(np.flatnonzero(white[ball_rows[0]])[0]) if ball_rows.size else paddle
            step = int(np.sign(ball - paddle))
            if not self.toward:
                step = -step if step else (1 if paddle < self.width - 1 else -1)
            actions[agent] = {0: 0, -1: 1, 1: 2}[step]
        return actions


@pytest.mark.parametrize("factory", [catch.make_env, catch.make_small_env, catch.make_env_3])
def test_catch_scores_plus_one_per_catch_and_minus_one_per_miss(factory):
    env = factory()
    best = madqn.evaluate(factory, ScriptedCatcher(env), episodes=5, seed=0)
    worst = madqn.evaluate(factory, ScriptedCatcher(env, toward=False), episodes=5, seed=0)
    for agent in env.possible_agents:
        assert best.scores[agent] == [float(env.balls)] * 5
        assert best.lengths[agent] == [env.balls * (env.height - 1)] * 5
        assert worst.scores[agent] == [-float(env.balls)] * 5
    random = madqn.evaluate(factory, "random", episodes=40, seed=0)
    assert all(-env.balls < s < 0 for s in random.mean_scores().values())


def test_catch_image_shows_own_lane_first():
    env = catch.CatchEnv(n_agents=2, cell=1)
    obs, _ = env.reset(seed=1)
    for i, agent in enumerate(env.possible_agents):
        image = obs[agent]
        other = 1 - i
        assert image.shape == (8, 11, 3)
        assert image[7, env._paddle[i]].tolist() == [255, 255, 255]
        assert image[0, env._ball_col[i]].tolist() == [255, 255, 255]
        assert image[7, 6 + env._paddle[other]].tolist() == [110, 110, 110]
        assert (image[:, 5] == catch.WALL).all()


def test_gridrace_runners_join_late_and_finish_at_different_times():
    env = gridrace.make_env()
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == ["runner_0", "runner_1"]
    finished, t = {}, 0
    while env.agents:
        t += 1
        actions = {}
        for a in env.agents:  # walk straight to the flag
            i = env.possible_agents.index(a)
            d = env._flag[i] - env._pos[i]
            actions[a] = 4 if d[0] > 0 else 3 if d[0] < 0 else 2 if d[1] > 0 else 1
        obs, rewards, terms, truncs, _ = env.step(actions)
        if t == 3:
            assert "runner_2" in env.agents and "runner_2" in obs
        for a, done in terms.items():
            if done:
                finished[a] = t
                assert rewards[a] == pytest.approx(0.95)
    assert len(finished) == 3 and len(set(finished.values())) > 1, finished


# ---- training through the library and the CLI ------------------------------------------------

def stream_episodes(replay, stream):
    """Entry indices of each complete episode in one replay stream (the replay must not have wrapped)."""
    n = int(replay.written[stream])
    assert n <= replay.capacity
    episodes, current = [], []
    for k in range(n):
        current.append(k)
        if replay.episode_end[stream, k]:
            episodes.append(current)
            current = []
    return episodes


def check_gridrace_streams(trainer, run_dir, max_steps=30):
    """Every stream holds one runner's own consecutive steps, episode by episode: the flag never changes
    inside an episode, time advances by exactly one step per entry, the rewards sum to the logged score,
    and the final entry is terminal iff the runner reached its flag."""
    rows = read_csv(Path(run_dir) / "episodes.csv")
    arrivals = []
    for g in trainer.groups:
        for agent in g.agents:
            stream = trainer.learners.stream(agent, 0)
            logged = [r for r in rows if r["agent"] == agent and int(r["length"]) > 0]
            episodes = stream_episodes(g.replay, stream)
            # the episode still running at the end of training is not logged, but may be over for this runner
            assert len(logged) <= len(episodes) <= len(logged) + 1 and logged
            for entries, row in zip(episodes, logged):
                frames = g.replay.frames[stream, entries]
                assert (frames[:, 2:4] == frames[0, 2:4]).all()  # one runner's flag
                assert np.allclose(np.diff(frames[:, 4]), 1 / max_steps)  # its consecutive steps
                rewards = g.replay.rewards[stream, entries[:-1]]
                assert rewards.sum() == pytest.approx(float(row["score"]), abs=1e-5)
                assert len(entries) - 1 == int(row["length"])
                last = entries[-1]
                arrived = bool(np.all(frames[-1, 0:2] == frames[-1, 2:4]))
                assert g.replay.terminal[stream, last] == arrived
                assert arrived or frames[-1, 4] == pytest.approx(1.0)  # else truncated at max_steps
                if agent == "runner_2":
                    assert frames[0, 4] == pytest.approx(3 / max_steps)  # joined at step 3
                arrivals.append((int(row["episode"]), agent, int(row["length"]), arrived))
    by_episode = {}
    for episode, agent, length, arrived in arrivals:
        by_episode.setdefault(episode, []).append((length, arrived))
    # runners finished at different times while the others went on
    assert any(len({length for length, _ in v}) > 1 and any(a for _, a in v) for v in by_episode.values())


@pytest.mark.parametrize("sharing", ["shared", "independent"])
@pytest.mark.parametrize("factory", [gridrace.make_env, gridrace.make_aec_env], ids=["parallel", "aec"])
def test_library_trains_on_gridrace(tmp_path, sharing, factory):
    cfg = make_config(ROOT / "configs" / "gridrace.toml", {**TINY, "steps": 600, "sharing": sharing})
    trainer = Trainer(cfg, factory, hooks=[MetricsHook(tmp_path)])
    trainer.run()
    trainer.close()
    updates = {g.name: g.updates for g in trainer.groups}
    assert updates == ({"shared": 125} if sharing == "shared" else {f"runner_{i}": 125 for i in range(3)})
    check_gridrace_streams(trainer, tmp_path)


@pytest.mark.parametrize("sharing", ["shared", "independent"])
def test_library_trains_on_catch_and_agents_load_back(tmp_path, sharing):
    result = madqn.train(catch.make_env, ROOT / "configs" / "catch.toml", run_dir=tmp_path / "run", sharing=sharing,
                         **TINY)
    names = ["shared"] if sharing == "shared" else ["catcher_0", "catcher_1"]
    assert result.steps == 160 and result.updates == {n: 15 for n in names}
    assert result.evaluation.episodes == 2 and set(result.eval_scores) == {"catcher_0", "catcher_1"}
    for agent, scores in result.evaluation.scores.items():
        assert result.eval_scores[agent] == pytest.approx(np.mean(scores))
        assert all(-5 <= s <= 5 and s == int(s) for s in scores)
    rows = read_csv(result.run_dir / "final_eval.csv")
    assert [(int(r["episode"]), r["agent"], float(r["score"])) for r in rows] == [
        (k + 1, a, result.evaluation.scores[a][k]) for k in range(2) for a in ["catcher_0", "catcher_1"]]
    state = safe_load(result.checkpoint)
    assert state["observation_specs"]["catcher_0"]["kind"] == "image"
    assert state["observation_specs"]["catcher_0"]["raw_shape"] == [48, 66, 3]

    agents = madqn.load_agents(result.run_dir)
    env = catch.make_env()
    obs, _ = env.reset(seed=0)
    agents.reset()
    actions = agents.act(obs)
    assert set(actions) == set(obs) and all(0 <= a < 3 for a in actions.values())


@pytest.mark.parametrize("sharing", ["shared", "independent"])
@pytest.mark.parametrize("spec, config", [("envs/catch.py:make_env", "configs/catch.toml"),
                                          ("envs/gridrace.py:make_env", "configs/gridrace.toml")])
def test_cli_trains_on_examples(tmp_path, madqn_cli, spec, config, sharing):
    run_dir = tmp_path / "run"
    overrides = [f"{k}={v}" for k, v in TINY.items() if k != "steps"]
    cmd, env = madqn_cli("train", "--env", spec, "--config", config, "--sharing", sharing, "--steps", "160",
                         "--run-dir", run_dir, *[x for o in overrides for x in ("--set", o)])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "done: 160 agent steps" in proc.stdout and "final evaluation (2 episodes" in proc.stdout
    state = safe_load(run_dir / "checkpoints" / "latest.pt")
    assert state["step"] == 160 and state["config"]["env"] == spec and state["config"]["sharing"] == sharing
    assert all(g["updates"] == 15 for g in state["groups"].values())
    assert len(read_csv(run_dir / "final_eval.csv")) == 2 * len(state["agents"])


def test_readme_example_runs(tmp_path, monkeypatch):
    """The "Your own environment" example, as printed, with a shorter run and the run dir in tmp."""
    text = (ROOT / "README.md").read_text()
    code = text.split("## Your own environment", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in code.splitlines() if line.strip()]) < 10  # "in under ten lines"
    short = code.replace('"runs/c4"', repr(str(tmp_path / "c4"))).replace("steps=20_000", "steps=300, final_eval_episodes=2")
    assert short != code and "steps=300" in short
    monkeypatch.chdir(ROOT)
    namespace = {}
    exec(compile(short, "README.md", "exec"), namespace)
    assert namespace["result"].steps == 300 and set(namespace["result"].eval_scores) == {"player_0", "player_1"}
    assert namespace["env"].agents == []  # the loaded agents played a whole game


def test_independent_networks_for_agents_with_different_spaces(tmp_path):
    result = madqn.train(gridrace.make_heterogeneous_env, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                         sharing="independent", **{**TINY, "steps": 400})
    state = safe_load(result.checkpoint)
    online = {name: g["learner"]["online"] for name, g in state["groups"].items()}
    first_layer = {name: w["layers.0.weight"].shape[1] for name, w in online.items()}
    last_layer = {name: w[max(k for k in w if k.endswith(".weight"))].shape[0] for name, w in online.items()}
    assert first_layer == {"runner_0": 6, "runner_1": 5, "runner_2": 5}
    assert last_layer == {"runner_0": 4, "runner_1": 5, "runner_2": 5}
    assert result.updates == {"runner_0": 75, "runner_1": 75, "runner_2": 75}
    agents = madqn.load_agents(result.run_dir)
    env = gridrace.make_heterogeneous_env()
    obs, _ = env.reset(seed=0)
    for _ in range(10):  # the env rejects actions outside Discrete(4, start=1) for runner_0
        if not env.agents:
            break
        obs, *_ = env.step(agents.act({a: obs[a] for a in env.agents}, epsilon=0.5))


def test_several_env_copies_of_a_custom_env(tmp_path):
    result = madqn.train(gridrace.make_env, ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "run",
                         **{**TINY, "num_envs": 2, "steps": 400})
    assert result.steps == 400 and result.updates == {"shared": 75}
    with pytest.raises(madqn.MadqnError, match="num_envs > 1 needs an env spec or a factory"):
        madqn.train(gridrace.make_env(), ROOT / "configs" / "gridrace.toml", run_dir=tmp_path / "r2", num_envs=2)
