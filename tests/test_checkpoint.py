"""Checkpoint pieces: emulator state capture, compatibility checks, metrics trimming, envs without state capture."""

import copy
import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

import madqn
from madqn.cli.export import agents_state
from madqn.config import Config
from madqn.core.rng import generator_state, set_generator_state
from madqn.envs.atari import AtariEnv
from madqn.errors import CheckpointError
from madqn.evaluation.agents import Agents
from madqn.training.checkpoint import (ACTING_LAYOUT, REPLAY_KIND, acting_state, atomic_save, online_weights,
                                       restore_replay, restore_trainer, safe_load, trainer_state, truncate_csv)
from madqn.training.distributed import DistributedTrainer
from madqn.training.trainer import Trainer


def rollout(env, joint_actions):
    """Frames, rewards and flags of a sequence of joint actions (resetting when the episode ends)."""
    out = []
    for actions in joint_actions:
        if not env.agents:
            obs, _ = env.reset()
            out.append(("reset", obs["first_0"].copy()))
        obs, rewards, terms, truncs, infos = env.step({a: actions[a] for a in env.agents})
        out.append((obs["first_0"].copy(), rewards, terms, truncs, infos))
    return out


def same(a, b):
    return len(a) == len(b) and all(
        len(ra) == len(rb) and all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(ra, rb))
        for ra, rb in zip(a, b))


def test_atari_state_capture_continues_the_same_trajectory():
    """A fresh env (other seed) given get_state() plays on exactly like the original, resets included."""
    env = AtariEnv("pong_v3", seed=3, max_cycles=60)
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(45):
        env.step({a: int(rng.integers(6)) for a in env.agents})
    state = env.get_state()
    joint = [{a: int(rng.integers(6)) for a in env.possible_agents} for _ in range(130)]
    original = rollout(env, joint)
    assert sum(isinstance(r[0], str) for r in original) == 2  # two resets: their no-op counts come from the saved generator

    other = AtariEnv("pong_v3", seed=99, max_cycles=60)
    other.reset()
    assert not same(rollout(other, joint[:20]), original[:20])
    other.set_state(state)
    assert same(rollout(other, joint), original)
    with pytest.raises(ValueError, match="env state is for 'pong_v3'"):
        AtariEnv("boxing_v2").set_state(state)


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        f.write("step,learner,updates\r\n" + "".join(rows))


def test_truncate_csv_keeps_complete_rows_up_to_the_step(tmp_path):
    path = tmp_path / "train.csv"
    write_csv(path, ["100,a,1\r\n", "200,a,2\r\n", "200,b,2\r\n", "300,a,3\r\n", "400,a"])  # last row half-written
    assert truncate_csv(path, "step", 200) == 2
    with open(path, newline="") as f:
        assert list(csv.reader(f)) == [["step", "learner", "updates"], ["100", "a", "1"], ["200", "a", "2"],
                                       ["200", "b", "2"]]
    assert truncate_csv(path, "step", 200) == 0
    assert truncate_csv(path, "updates", 1) == 2
    assert truncate_csv(tmp_path / "missing.csv", "step", 5) == 0


class Countdown(ParallelEnv):
    """Two agents, vector observations, 7-step episodes; no get_state(): resumes start fresh episodes."""

    metadata = {"name": "countdown_v0"}
    n_actions = 2

    def __init__(self):
        self.possible_agents = ["a", "b"]
        self.agents = []

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(self.n_actions)

    def reset(self, seed=None, options=None):
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self):
        return self.rng.uniform(-1, 1, 3).astype(np.float32)

    def step(self, actions):
        self.t += 1
        done = self.t >= 7
        obs = {a: self._obs() for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        flags = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, {a: False for a in flags}, infos


class Countdown3(Countdown):
    n_actions = 3


SMALL = Config(env="countdown", hist_len=2, replay_memory=200, learn_start=20, minibatch_size=8, target_q=10,
               mlp_hidden=[16], prog_freq=10, save_freq=20, max_cycles=50, device="cpu", num_threads=1,
               save_replay=True, steps=60)


def test_env_without_state_capture_resumes_with_fresh_episodes(tmp_path):
    run = tmp_path / "run"
    first = madqn.train(Countdown, SMALL, run_dir=run, handle_signals=False)
    assert first.steps == 60
    before = safe_load(run / "checkpoints" / "latest.pt")
    assert before["envs"] == [None]
    written = safe_load(run / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"]["a"]["written"][0].item()
    resumed = madqn.train(Countdown, resume=run, steps=100, handle_signals=False)
    assert resumed.resumed_from == 60 and resumed.steps == 100
    # replay restored: learning went on at once, one update every 4 steps from step 20
    assert resumed.updates == {"a": 20, "b": 20}
    replay = safe_load(run / "checkpoints" / "replay.pt", kind=REPLAY_KIND)["groups"]["a"]
    # the interrupted episode was closed in the replay stream by its newest frame (a truncation, not
    # a terminal), so the next episode is never stacked onto it
    assert bool(replay["episode_end"][0, written]) and not bool(replay["terminal"][0, written])
    assert torch.equal(replay["frames"][0, written], before["observations"][0]["a"])
    # 60 steps = 8 full episodes + 4 steps; the resumed run restarts, so 40 more steps = 5 episodes + 5 steps
    episodes = [r for r in csv.DictReader(open(run / "episodes.csv", newline="")) if r["agent"] == "a"]
    assert [int(r["episode"]) for r in episodes] == list(range(1, 14))
    assert {int(r["length"]) for r in episodes} == {7}


def test_incompatible_checkpoints_are_refused_naming_the_mismatch(tmp_path):
    run = tmp_path / "run"
    # a lambda cannot be re-imported from config.env (an importable factory would be: module:function)
    madqn.train(lambda: Countdown(), SMALL, run_dir=run, steps=20, save_replay=False, handle_signals=False)
    with pytest.raises(madqn.MadqnError, match=r"trained on an env object given in Python \(<lambda>\); pass it again"):
        madqn.train(resume=run, steps=40, handle_signals=False)
    with pytest.raises(CheckpointError, match="a has 2 actions in the checkpoint but 3 in this env"):
        madqn.train(Countdown3, resume=run, steps=40, handle_signals=False)
    state = safe_load(run / "checkpoints" / "latest.pt")
    shared = Trainer(SMALL.replace(sharing="shared"), Countdown)
    with pytest.raises(CheckpointError, match="checkpoint has sharing = independent, this run has sharing = shared"):
        restore_trainer(shared, state, run / "checkpoints" / "latest.pt")
    wider = Trainer(SMALL.replace(mlp_hidden=[32]), Countdown)
    with pytest.raises(CheckpointError, match="network of a does not fit this config"):
        restore_trainer(wider, state, run / "checkpoints" / "latest.pt")


def test_checkpoint_with_one_statistics_row_per_update_still_loads(tmp_path):
    """Checkpoints of the same format written before the running sums hold a learner's unreported
    statistics as one (abs_delta, q_mean, q2_max) row per update: they load as those rows' sums."""
    run = tmp_path / "run"
    madqn.train(Countdown, SMALL, run_dir=run, steps=40, save_replay=False, handle_signals=False)
    state = safe_load(run / "checkpoints" / "latest.pt")
    for saved in state["groups"].values():
        del saved["update_stats"]
        saved["stats"] = torch.tensor([[0.5, 1.0, 2.0], [0.25, 3.0, -1.0]])
    trainer = Trainer(SMALL, Countdown)
    try:
        restore_trainer(trainer, state, run / "checkpoints" / "latest.pt")
        for g in trainer.groups:
            assert g.update_stats.count == 2
            assert g.update_stats.means() == {"abs_delta": 0.375, "q_mean": 2.0, "q2_max": 0.5}
    finally:
        trainer.close()


# ---- one owner per concept: generators, a group's online weights, each backend's layout -----------------

OLD = Path(__file__).resolve().parent / "data" / "checkpoints_2fd8111"  # written by madqn at 2fd8111 (make.py)


def draws(rng, n=5):
    return rng.integers(0, 2**62, size=n).tolist()


def test_generator_state_travels_through_a_checkpoint_file(tmp_path):
    """Six int64 words, through torch.save and the weights-only loader; the generator goes on with the same
    draws. A generator saved before the words (a bit_generator.state dict) restores too; anything else is refused."""
    rng = np.random.default_rng(7)
    rng.random(size=3)
    rng.integers(0, 10, dtype=np.int32)  # leaves half of a 64-bit draw buffered (has_uint32 = 1): it must travel too
    words = generator_state(rng)
    assert words.dtype == np.int64 and words.shape == (6,) and words[4] == 1
    atomic_save({"format_version": 2, "kind": REPLAY_KIND, "step": 0, "groups": {"g": {"rng": torch.from_numpy(words)}}},
                tmp_path / "f.pt")
    loaded = safe_load(tmp_path / "f.pt", kind=REPLAY_KIND)["groups"]["g"]["rng"]
    expected = draws(copy.deepcopy(rng))
    for saved in (loaded, words, copy.deepcopy(rng).bit_generator.state):
        fresh = np.random.default_rng(0)
        set_generator_state(fresh, saved)
        assert draws(fresh) == expected
    with pytest.raises(ValueError, match="6 words"):
        set_generator_state(np.random.default_rng(0), words[:4])
    with pytest.raises(ValueError, match="PCG64"):
        generator_state(np.random.Generator(np.random.MT19937(0)))


def old_checkpoint(name):
    state = safe_load(OLD / f"{name}.pt")
    return state, Config(**state["config"])


def test_a_local_checkpoint_from_before_the_generator_words_resumes(tmp_path):
    """local.pt / local_replay.pt (madqn 2fd8111, in-process backend, independent learners): the learner set's and
    the acting loop's generators were bit_generator.state dicts. They restore into today's trainer exactly, with
    the replay memory, and the run trains on."""
    state, config = old_checkpoint("local")
    assert isinstance(state["rng"]["numpy"], dict) and isinstance(state["groups"]["left"]["replay_rng"], dict)
    trainer = Trainer(config)
    try:
        assert restore_trainer(trainer, state, OLD / "local.pt") is False  # tiny_catch has no get_state: new episodes
        restore_replay(trainer, safe_load(OLD / "local_replay.pt", kind=REPLAY_KIND), OLD / "local_replay.pt")
        assert trainer.step == 120 and trainer.acting.rng.bit_generator.state == state["rng"]["numpy"]
        for g in trainer.groups:
            assert g.replay.rng.bit_generator.state == state["groups"][g.name]["replay_rng"]
            assert g.updates == state["groups"][g.name]["updates"] > 0 and g.replay.can_sample()
        updates = [g.updates for g in trainer.groups]
        for _ in range(20):
            trainer.env_step()
        assert all(g.updates > u for g, u in zip(trainer.groups, updates))
        now = trainer_state(trainer)
        assert set(now) >= set(ACTING_LAYOUT["local"]) and now["rng"]["numpy"].dtype == torch.int64
    finally:
        trainer.close()


def test_ray_checkpoints_hold_what_the_ray_learner_has_and_old_ones_with_empty_acting_lists_load(tmp_path):
    """A Ray run's learner has no env copies or slots: its checkpoint holds the generator and the held replay
    entries only, and the layout check asks a Ray checkpoint for those. ray.pt (madqn 2fd8111) still carries the
    empty acting lists it wrote to pass the old check: it loads, and its generators restore."""
    state, config = old_checkpoint("ray")
    assert state["envs"] == state["slots"] == [] and state["held"]
    trainer = DistributedTrainer(config, pool="inline")
    try:
        assert restore_trainer(trainer, state, OLD / "ray.pt") is False  # actors start fresh episodes
        assert trainer.acting.rng.bit_generator.state == state["rng"]["numpy"]
        for g in trainer.groups:
            assert g.replay.rng.bit_generator.state == state["groups"][g.name]["replay_rng"]
        trainer.acting.close_interrupted_episodes(acting_state(state))
        assert {(g.name, int(g.replay.written.sum())) for g in trainer.groups} == {("left", 1), ("right", 1)}
        atomic_save(trainer_state(trainer), tmp_path / "ray.pt")
    finally:
        trainer.close()
    now = safe_load(tmp_path / "ray.pt")
    assert not set(now) & set(ACTING_LAYOUT["local"]) and isinstance(now["held"], list)
    for drop, complete in (("held", now), ("slots", old_checkpoint("local")[0])):
        broken = dict(complete)
        del broken[drop]
        atomic_save(broken, tmp_path / "broken.pt")
        with pytest.raises(CheckpointError, match=f"entry '{drop}' is missing or malformed"):
            safe_load(tmp_path / "broken.pt")


def test_the_online_weights_of_a_group_are_read_alike_from_a_checkpoint_and_an_export(tmp_path):
    """``online_weights``: the learner's online network in a trainer checkpoint, the exported one in a
    madqn-agents file; madqn export writes them and load_agents plays them (not the target network's)."""
    state, config = old_checkpoint("local")
    trainer = Trainer(config)
    try:
        restore_trainer(trainer, state, OLD / "local.pt")
        for g in trainer.groups:  # online and target networks differ
            with torch.no_grad():
                for p in g.learner.online_network.parameters():
                    p.add_(1.0)
        checkpoint = trainer_state(trainer)
    finally:
        trainer.close()
    exported = agents_state(checkpoint)
    agents = {source: Agents.from_state(s) for source, s in (("checkpoint", checkpoint), ("export", exported))}
    for name, group in checkpoint["groups"].items():
        online, target = online_weights(group), group["learner"]["target"]
        assert any(not torch.equal(online[k], target[k]) for k in online)
        assert online.keys() == online_weights(exported["groups"][name]).keys()
        assert all(torch.equal(online[k], online_weights(exported["groups"][name])[k]) for k in online)
        for a in group["agents"]:
            for played in agents.values():
                assert all(torch.equal(online[k], v) for k, v in played.networks[a].state_dict().items())
