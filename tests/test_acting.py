"""The two parts of training: an acting loop that knows no learner, a learner set that keeps bounded state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from madqn.training.acting import ActingLoop, RecordingSink
from madqn.config import Config
from madqn.training.learners import group_members, q_network_for, replay_seeds_and_acting_rng
from madqn.training.trainer import Trainer
from madqn.envs.vecenv import make_envs

ROOT = Path(__file__).resolve().parents[1]
CATCH = f"{ROOT / 'tests' / 'tiny_catch.py'}:make"
TINY = dict(env=CATCH, replay_memory=500, prog_freq=100, save_freq=1000, eval_freq=0, valid_size=0, device="cpu",
            hist_len=2, mlp_hidden=[16], num_threads=1, final_eval_episodes=0)


def test_acting_loop_with_a_recording_sink_emits_the_local_trainers_replay():
    """No learner at all: the entries an acting loop emits, stream by stream, are the replay the trainer stores
    (two env copies, random phase: learning never starts)."""
    cfg = Config(**TINY, steps=240, learn_start=10_000, num_envs=2, vector_env="inline", sharing="independent",
                 seed=3)
    with Trainer(cfg) as trainer:
        trainer.run()
        learners = trainer.learners
    envs = make_envs(cfg.env, cfg)
    members = group_members(cfg, envs[0].possible_agents)
    networks = [q_network_for(cfg, envs[0].observation_space(agents[0]).shape, 3, 2) for _, agents in members]
    _, rng = replay_seeds_and_acting_rng(cfg.seed, len(members))
    sink = RecordingSink()
    loop = ActingLoop(cfg, envs, networks, sink, rng, torch.device("cpu"))
    while loop.step < cfg.steps:
        loop.step_envs()
    loop.close()
    assert loop.step == trainer.step and loop.episodes == trainer.episodes == len(sink.episodes) > 20
    compared = 0
    for agent in envs[0].possible_agents:
        for copy in range(cfg.num_envs):
            mine = [e for e in sink.entries if e[0] == agent and e[1] == copy]
            replay, stream = learners.group_of[agent].replay, learners.stream(agent, copy)
            n = int(replay.written[stream])
            assert n == len(mine) > 100  # capacity 500 never wrapped
            np.testing.assert_array_equal(np.stack([e[2] for e in mine]), replay.frames[stream, :n])
            for column, k in ((replay.actions, 3), (replay.rewards, 4), (replay.terminal, 5), (replay.episode_end, 6)):
                np.testing.assert_array_equal(np.array([e[k] for e in mine]), column[stream, :n])
            compared += n
    assert compared == len(sink.entries)


def test_update_statistics_stay_bounded_without_a_metrics_hook():
    """B6: a Trainer driven without hooks keeps, per learner, three running sums and a count, whatever the
    number of updates, and their means are the per-update statistics' means."""
    cfg = Config(**TINY, steps=1_000, learn_start=50, update_freq=1, n_replay=1, sharing="shared", seed=1)
    with Trainer(cfg) as trainer:
        g = trainer.groups[0]
        seen = []
        update = g.learner.update

        def recording(*args, **kwargs):
            stats = update(*args, **kwargs)
            seen.append([float(stats[k]) for k in ("abs_delta", "q_mean", "q2_max")])
            return stats

        g.learner.update = recording
        trainer.run()
        assert g.updates == len(seen) == 950
        kept = g.update_stats.state_dict()
        assert kept["count"] == 950 and kept["sums"].shape == (3,)
        means = g.update_stats.means()
        np.testing.assert_allclose([means["abs_delta"], means["q_mean"], means["q2_max"]],
                                   np.mean(seen, axis=0), rtol=1e-5)
