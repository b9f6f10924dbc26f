"""Turn-based AEC games with legal-action masks (pettingzoo.classic tictactoe_v3, connect_four_v3).

Training must never take an illegal action (checked against the env's own mask before every move,
in training and in the final evaluation) and never bootstrap from one: the masks stored in replay
are recomputed independently from the board in s2, and the learner's max over Q_target(s2) is
checked against a max over those legal actions only.
"""

import csv

import numpy as np
import pytest
import torch
from pettingzoo.classic import connect_four_v3, tictactoe_v3
from pettingzoo.utils.wrappers import BaseWrapper

from madqn.core.actor import epsilon_greedy
from madqn.api import final_evaluation
from madqn.config import make_config
from madqn.core.learner import q_targets
from madqn.training.metrics import MetricsHook
from madqn.training.trainer import Hook, Trainer


class LegalityCheck(BaseWrapper):
    """Records every move together with the legal moves the env itself reports at that moment."""

    def __init__(self, env, log):
        super().__init__(env)
        self.log = log

    def step(self, action):
        agent = self.env.agent_selection
        if action is not None:
            mask = self.env.observe(agent)["action_mask"]
            self.log.append((agent, int(action), bool(mask[action]), int(mask.sum())))
        self.env.step(action)


def tictactoe_legal(obs_BD):
    """Empty cells of a flattened (3, 3, 2) board: both planes 0. Action i is cell (i // 3, i % 3)."""
    board = obs_BD.reshape(-1, 3, 3, 2)
    return (board.sum(axis=3) == 0).reshape(-1, 9)


def connect_four_legal(obs_BD):
    """Columns whose top cell (row 0 of the (6, 7, 2) board) is empty."""
    board = obs_BD.reshape(-1, 6, 7, 2)
    return board[:, 0].sum(axis=2) == 0


GAMES = {"tictactoe": (tictactoe_v3.env, tictactoe_legal, 9), "connect_four": (connect_four_v3.env, connect_four_legal, 7)}


def train(game, tmp_path, sharing="shared", steps=750):
    """``steps`` rounds of turns (about 2 * steps moves); each seat moves about learn_start times before learning."""
    make, _, _ = GAMES[game]
    log = []
    cfg = make_config(None, {"sharing": sharing, "steps": steps, "hist_len": 1, "mlp_hidden": [32], "replay_memory": 5_000,
                             "learn_start": 100, "update_freq": 1, "target_q": 100, "ep_endt": 400, "ep_end": 0.1,
                             "prog_freq": 500, "save_freq": 10_000, "valid_size": 0, "device": "cpu",
                             "final_eval_episodes": 5, "num_threads": 1})
    trainer = Trainer(cfg, lambda: LegalityCheck(make(), log), hooks=[MetricsHook(tmp_path)])
    trainer.run()
    return trainer, log


@pytest.mark.parametrize("game", list(GAMES))
def test_no_illegal_action_is_ever_taken(game, tmp_path):
    trainer, log = train(game, tmp_path)
    training_moves = len(log)
    evaluation = final_evaluation(trainer, lambda: LegalityCheck(GAMES[game][0](), log), tmp_path)
    trainer.close()
    first_seat = trainer.agents[0]  # opens every game: one move per round of turns
    assert sum(agent == first_seat for agent, *_ in log[:training_moves]) == trainer.step == 750
    assert 750 < training_moves <= 1_500
    assert len(log) - training_moves == sum(evaluation.steps) > 0
    assert all(legal for _, _, legal, _ in log), [entry for entry in log if not entry[2]][:5]
    # the check can fail: over a hundred positions had illegal moves to avoid
    assert sum(n < GAMES[game][2] for *_, n in log) > 100
    assert all(g.updates == 750 - 100 for g in trainer.groups)


@pytest.mark.parametrize("game", list(GAMES))
def test_targets_never_bootstrap_from_illegal_actions(game, tmp_path):
    trainer, _ = train(game, tmp_path, steps=400)
    _, legal_fn, n_actions = GAMES[game]
    g = trainer.groups[0]
    batch = g.replay.sample(512)
    live = batch.terminals == 0
    assert live.sum() > 100 and (~live).sum() > 0
    # masks stored in replay = legal moves recomputed from the board in s2 (non-terminal s2)
    legal = legal_fn(batch.next_states[:, -1])
    assert np.array_equal(batch.next_action_masks[live], legal[live])
    assert (~legal[live]).any()  # some next states really had illegal moves

    # the target's max runs over legal actions only
    ids = torch.as_tensor(g.stream_agent_ids[batch.streams])
    with torch.no_grad():
        q2 = g.learner.target_network(torch.as_tensor(batch.next_states), ids).numpy()
        q = g.learner.online_network(torch.as_tensor(batch.states), ids)
    expected = np.where(legal, q2, -np.inf).max(axis=1)
    _, _, q2_max = q_targets(q, torch.as_tensor(q2), torch.as_tensor(batch.actions), torch.as_tensor(batch.rewards),
                             torch.as_tensor(batch.terminals), discount=0.99, clip_delta=1.0,
                             next_action_mask=torch.as_tensor(batch.next_action_masks))
    assert np.allclose(q2_max.numpy()[live], expected[live])
    assert (q2.max(axis=1)[live] > expected[live] + 1e-6).any()  # ignoring the mask would change targets

    # and LearnerSet.learn passes the stored masks: replay the same draw through learn() and compare its q2_max
    state = g.replay.rng.bit_generator.state
    batch = g.replay.sample(trainer.config.minibatch_size)
    g.replay.rng.bit_generator.state = state
    ids = torch.as_tensor(g.stream_agent_ids[batch.streams])
    with torch.no_grad():
        q2 = g.learner.target_network(torch.as_tensor(batch.next_states), ids).numpy()
    masked = np.where(batch.next_action_masks, q2, -np.inf).max(axis=1)
    masked = np.where(batch.next_action_masks.any(axis=1), masked, 0.0)
    g.update_stats.clear()
    trainer.learners.learn(trainer.step)
    assert g.update_stats.means()["q2_max"] == pytest.approx(float(masked.mean()), abs=1e-5)
    trainer.close()


def test_epsilon_greedy_never_picks_an_illegal_action():
    rng = np.random.default_rng(0)
    legal = rng.random((2_000, 9)) < 0.3
    legal[np.arange(2_000), rng.integers(0, 9, 2_000)] = True
    q = rng.normal(size=(2_000, 9))
    for eps in (0.0, 0.5, 1.0):
        actions = epsilon_greedy(lambda rows: q[rows], 2_000, eps, rng, 9, legal)
        assert legal[np.arange(2_000), actions].all()
    greedy = epsilon_greedy(lambda rows: q[rows], 2_000, 0.0, rng, 9, legal)
    assert np.array_equal(greedy, np.where(legal, q, -np.inf).argmax(axis=1))
    assert not np.array_equal(greedy, q.argmax(axis=1))


def test_turn_based_rewards_reach_the_agent_that_moved_before(tmp_path):
    """Each stream's rewards per episode sum to that player's score: the loser's last transition
    carries the -1 that arrived on the winner's move."""
    trainer, _ = train("tictactoe", tmp_path, steps=300)
    with open(tmp_path / "episodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    g = trainer.groups[0]
    outcomes = []
    for agent in trainer.agents:
        stream = trainer.learners.stream(agent, 0)
        ends = np.flatnonzero(g.replay.episode_end[stream, : g.replay.written[stream]])
        starts = np.concatenate([[0], ends[:-1] + 1])
        logged = [float(r["score"]) for r in rows if r["agent"] == agent]
        assert len(ends) >= len(logged) > 10
        for start, end, score in zip(starts, ends, logged):
            assert g.replay.rewards[stream, start:end].sum() == score
            assert g.replay.rewards[stream, end - 1] == score  # only the last move of a game is rewarded
            assert g.replay.terminal[stream, end]
            outcomes.append(score)
    assert -1.0 in outcomes and 1.0 in outcomes
    trainer.close()


def test_turn_based_counter_counts_rounds_of_turns(tmp_path):
    """One agent step = one round of turns (each live seat moves once), as one parallel env step: in
    tictactoe player_1 opens every game and the seats alternate, so the counter equals player_1's moves,
    player_2 has made one move fewer at most per unfinished round, and learn_start, update_freq and
    ep_endt count each seat's own moves, as in a parallel game."""
    log = []
    cfg = make_config(None, {"sharing": "independent", "steps": 300, "hist_len": 1, "mlp_hidden": [16],
                             "replay_memory": 2_000, "learn_start": 100, "update_freq": 1, "target_q": 50,
                             "ep_endt": 100, "ep_end": 0.1, "prog_freq": 1_000, "save_freq": 10_000,
                             "valid_size": 0, "device": "cpu", "final_eval_episodes": 0, "num_threads": 1})
    episodes = []

    class Episodes(Hook):
        def on_episode(self, trainer, record):
            episodes.append(record)

    trainer = Trainer(cfg, lambda: LegalityCheck(tictactoe_v3.env(), log), hooks=[Episodes()])
    trainer.run()
    trainer.close()
    moves = {a: sum(agent == a for agent, *_ in log) for a in ("player_1", "player_2")}
    assert trainer.step == moves["player_1"] == 300
    assert 300 - len(episodes) - 1 <= moves["player_2"] <= 300 and len(log) > 500
    assert all(r.lengths["player_1"] - r.lengths["player_2"] in (0, 1) for r in episodes)
    assert all(g.updates == 300 - 100 for g in trainer.groups)  # a round per agent step after learn_start
    assert trainer.epsilon() == pytest.approx(0.1)


def test_worker_process_envs_count_rounds_too():
    """Env copies in worker processes report that they are turn-based: over 30 vector steps (60 moves)
    the counter advances exactly on player_1's moves (player_1 opens every tictactoe game)."""
    cfg = make_config(None, {"env": "pettingzoo.classic.tictactoe_v3:env", "num_envs": 2, "vector_env": "process",
                             "steps": 1_000, "hist_len": 1, "mlp_hidden": [8], "replay_memory": 1_000,
                             "learn_start": 1_000, "device": "cpu", "num_threads": 1})
    with Trainer(cfg) as trainer:
        assert trainer.acting.turn_based == [True, True]
        openings = 0
        for _ in range(30):
            openings += sum("player_1" in obs for obs in trainer.acting.observations)
            trainer.env_step()
        assert trainer.step == openings and 30 <= openings < 60
