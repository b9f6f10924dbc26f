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
from tiny_catch import TinyCatch

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


def _greedy_stay_network(cfg, envs):
    """The run's Q-network with a last layer that makes action 1 (stay) greedy in every state."""
    (_, agents), = group_members(cfg, envs[0].possible_agents)
    net = q_network_for(cfg, envs[0].observation_space(agents[0]).shape, 3, len(agents))
    last = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
    return net


def _episodes_of(sink, agent):
    """Per finished episode, in order, the actions ``agent`` took (one env copy)."""
    episodes, current = [], []
    for entry in sink.entries:
        if entry[0] != agent:
            continue
        if entry[6]:  # episode_end: the final frame closes the episode
            episodes.append(current)
            current = []
        else:
            current.append(entry[3])
    return episodes


def _play_greedy(cfg):
    """Run an acting loop with the greedy 'stay' network for ``cfg.steps`` agent steps; what it emitted."""
    envs = make_envs(cfg.env, cfg)
    sink = RecordingSink()
    loop = ActingLoop(cfg, envs, [_greedy_stay_network(cfg, envs)], sink, np.random.default_rng(0),
                      torch.device("cpu"))
    while loop.step < cfg.steps:
        loop.step_envs()
    loop.close()
    return sink


def test_random_opponent_draws_one_seat_to_act_at_random_for_a_whole_episode():
    """random_opponent 0.5 with greedy networks (epsilon 0) that always choose 'stay': about half the episodes
    have exactly one seat, drawn uniformly, whose every action is uniform over the three; every other seat's
    every action is the greedy one; the episode records name the random seat."""
    cfg = Config(**TINY, steps=2_000, learn_start=0, ep_start=0.0, ep_end=0.0, ep_endt=1, sharing="shared",
                 vector_env="inline", random_opponent=0.5, seed=4)
    sink = _play_greedy(cfg)
    records = sink.episodes
    actions = {a: _episodes_of(sink, a) for a in ("left", "right")}
    assert len(records) == len(actions["left"]) == len(actions["right"]) == 2_000 // 4  # the ball lands in 4 steps
    drawn = [r.random_seats for r in records]
    assert all(len(seats) <= 1 for seats in drawn)
    with_random = [seats[0] for seats in drawn if seats]
    assert 0.42 < len(with_random) / len(records) < 0.58  # 500 episodes: 0.5 +- 3.6 standard deviations
    assert 0.38 < with_random.count("left") / len(with_random) < 0.62  # the seat is drawn uniformly
    random_actions = []
    for k, record in enumerate(records):
        for agent, episodes in actions.items():
            if agent in record.random_seats:
                random_actions += episodes[k]
            else:
                assert episodes[k] == [1] * 4, (k, agent, episodes[k])  # the network's greedy action, every step
    counts = np.bincount(random_actions, minlength=3) / len(random_actions)
    np.testing.assert_allclose(counts, [1 / 3] * 3, atol=0.05)  # about 1,000 uniform actions: 3.4 standard deviations


def test_random_opponent_zero_never_draws_and_a_drawn_seat_survives_a_checkpoint():
    """random_opponent 0 never draws a seat; a seat drawn to act at random is part of the acting state, so a
    resumed episode goes on with the same seat random."""
    common = dict(**TINY, steps=400, learn_start=0, ep_start=0.0, ep_end=0.0, ep_endt=1, sharing="shared",
                  vector_env="inline", seed=4)
    sink = _play_greedy(Config(**common))
    assert len(sink.episodes) == 100 and not any(r.random_seats for r in sink.episodes)

    mixed = Config(**{**common, "random_opponent": 1.0})
    envs = [SavableCatch()]
    loop = ActingLoop(mixed, envs, [_greedy_stay_network(mixed, envs)], RecordingSink(), np.random.default_rng(1),
                      torch.device("cpu"))
    loop.step_envs()
    (seat,) = [s.agent for s in loop.slots.values() if s.random]
    state = loop.state_dict()
    envs = [SavableCatch()]
    resumed = ActingLoop(mixed, envs, [_greedy_stay_network(mixed, envs)], RecordingSink(), np.random.default_rng(2),
                         torch.device("cpu"))
    for s in resumed.slots.values():
        s.random = s.agent != seat  # the fresh loop's own draw, made to differ
    assert resumed.load_state_dict(state)  # the episode continues exactly
    assert [s.agent for s in resumed.slots.values() if s.random] == [seat]


class SavableCatch(TinyCatch):
    """tiny_catch with the emulator-state methods an Atari env has, so that an episode can continue exactly."""

    def get_state(self):
        return {"agents": list(self.agents), "ball": list(self.ball), "paddles": dict(self.paddles)}

    def set_state(self, state):
        self.agents, self.ball, self.paddles = list(state["agents"]), list(state["ball"]), dict(state["paddles"])


def test_episodes_csv_marks_random_seats_and_curves_leave_them_out(tmp_path):
    """A run with random_opponent: episodes.csv marks each row of a seat that acted at random (epsilon 1.0,
    random_seat 1); the training curves (madqn plot, compare, TensorBoard's score/<agent>) are the networks'
    scores only."""
    import madqn
    from madqn.evaluation.plot import load_run
    from helpers import read_csv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = {k: v for k, v in TINY.items() if k != "env"}
    madqn.train(CATCH, run_dir=tmp_path / "run", **settings, steps=600, learn_start=100,
                sharing="shared", random_opponent=0.5, seed=2)
    rows = read_csv(tmp_path / "run" / "episodes.csv")
    marked = [r for r in rows if r["random_seat"] == "1"]
    assert {r["random_seat"] for r in rows} == {"0", "1"} and 0.1 < len(marked) / len(rows) < 0.4
    assert {r["epsilon"] for r in marked} == {"1.0"}
    per_episode = {}
    for r in marked:
        per_episode.setdefault(r["episode"], []).append(r["agent"])
    assert all(len(agents) == 1 for agents in per_episode.values())  # one random seat per episode at most
    curves = load_run(tmp_path / "run").curves
    events = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    events.Reload()
    for agent, (steps, scores) in curves.items():
        mine = [r for r in rows if r["agent"] == agent and r["random_seat"] == "0"]
        assert len(steps) == len(mine) and list(scores) == [float(r["score"]) for r in mine]
        assert [(e.step, e.value) for e in events.Scalars(f"score/{agent}")] == \
            [(int(r["step"]), float(r["score"])) for r in mine]  # TensorBoard's score/<agent> too
