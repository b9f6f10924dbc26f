"""Every multi-player Atari game trains and evaluates, in both sharing modes (slow: 48 short runs).

Each run is the real thing at a small size: PettingZoo's game through madqn's Atari pipeline and the real
emulator, 200 agent steps with learning from step 60 (replay 400, episodes cut at 150 agent steps), the
checkpoint written, then one evaluation episode. It catches a game whose agents, action sets or observations
madqn would mishandle (four-player games, eliminated players, games that end early)."""

import math

import pytest

import madqn
from madqn.envs.atari import ATARI_GAMES, make_atari_env
from helpers import SMOKE, read_csv

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sharing", ["shared", "independent"])
@pytest.mark.parametrize("game", ATARI_GAMES)
def test_every_multiplayer_atari_game_trains_and_evaluates(tmp_path, game, sharing):
    env = make_atari_env(game)
    agents, actions = list(env.possible_agents), {a: int(env.action_space(a).n) for a in env.possible_agents}
    env.close()
    result = madqn.train(game, SMOKE, run_dir=tmp_path / "run", steps=200, learn_start=60, update_freq=4,
                         replay_memory=400, save_freq=200, final_eval_episodes=1, num_threads=1, sharing=sharing)
    assert result.steps == 200 and result.checkpoint.is_file()
    learners = {"shared"} if sharing == "shared" else set(agents)
    assert set(result.updates) == learners and all(n > 0 for n in result.updates.values()), result.updates
    assert set(result.eval_scores) == set(agents) and all(math.isfinite(v) for v in result.eval_scores.values())
    rows = read_csv(tmp_path / "run" / "train.csv")
    assert {r["learner"] for r in rows} == learners
    assert all(math.isfinite(float(r["abs_delta"])) and math.isfinite(float(r["q_mean"])) for r in rows)
    # the trained networks load back for play with each seat's own action count
    played = madqn.load_agents(tmp_path / "run")
    assert played.possible_agents == agents and played.n_actions == actions
