"""madqn.envs.atari: DQN3.0 frame preprocessing, the PettingZoo multi-player Atari env and the ale-py
single-player env (the same pipeline)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pettingzoo
import pytest

from madqn.envs.atari import (
    ATARI_GAMES,
    SINGLE_AGENT,
    AtariEnv,
    SingleAtariEnv,
    UnknownGameError,
    is_atari_spec,
    make_atari_env,
    preprocess_frame,
    rom_dir,
)
from madqn.errors import MadqnError

# -- independent slow reference ---------------------------------------------------------------


def _box_weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) exact area weights: output i averages input [i*s, (i+1)*s), s = n_in/n_out."""
    scale = Fraction(n_in, n_out)
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        lo, hi = i * scale, (i + 1) * scale
        for k in range(n_in):
            overlap = min(hi, k + 1) - max(lo, Fraction(k))
            if overlap > 0:
                weights[i, k] = float(overlap / scale)
    return weights


_ROW_WEIGHTS = _box_weights(210, 84)
_COL_WEIGHTS = _box_weights(160, 84)


def reference_luminance_84(rgb_a: np.ndarray, rgb_b: np.ndarray) -> np.ndarray:
    """Float64 max-pool, luminance and box integration, unrounded (84, 84)."""
    pooled = np.maximum(rgb_a.astype(np.float64), rgb_b.astype(np.float64))
    y = 0.299 * pooled[..., 0] + 0.587 * pooled[..., 1] + 0.114 * pooled[..., 2]
    return _ROW_WEIGHTS @ y @ _COL_WEIGHTS.T


def reference_preprocess(rgb_a: np.ndarray, rgb_b: np.ndarray) -> np.ndarray:
    return np.floor(reference_luminance_84(rgb_a, rgb_b) + 1e-9).astype(np.int64)


def _assert_close_to_reference(a: np.ndarray, b: np.ndarray) -> None:
    fast = preprocess_frame(a, b)
    assert fast.shape == (84, 84) and fast.dtype == np.uint8
    expected = reference_preprocess(a, b)
    diff = np.abs(fast.astype(np.int64) - expected)
    assert diff.max() <= 1
    # float32 vs exact arithmetic may only flip values whose fraction is within ~1e-4 of an integer
    assert (diff != 0).mean() < 1e-3


def _real_screens() -> list[tuple[np.ndarray, np.ndarray]]:
    """Consecutive screen pairs from a few games under random play."""
    pairs = []
    rng = np.random.default_rng(0)
    for game in ("pong_v3", "boxing_v2", "warlords_v3", "space_invaders_v2"):
        env = pettingzoo.make(
            "parallel", f"atari/{game}", auto_rom_install_path=str(rom_dir())
        ).unwrapped
        env.reset(seed=0)
        n_players = len(env.possible_agents)
        for t in range(120):
            actions = env.action_mapping[rng.integers(len(env.action_mapping), size=n_players)]
            env.ale.act(actions.astype(np.int32))
            if t % 40 == 39:
                a = env.ale.getScreenRGB()
                env.ale.act(actions.astype(np.int32))
                pairs.append((a, env.ale.getScreenRGB()))
        env.close()
    return pairs


# -- preprocess_frame -------------------------------------------------------------------------


def test_preprocess_matches_reference_on_real_screens():
    for a, b in _real_screens():
        _assert_close_to_reference(a, b)


def test_preprocess_matches_reference_on_random_images():
    rng = np.random.default_rng(1)
    for _ in range(5):
        a = rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)
        b = rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)
        _assert_close_to_reference(a, b)
    # blocky images: flat areas whose exact luminance sits on integers and fractions
    for _ in range(5):
        small = rng.integers(0, 256, (21, 16, 3), dtype=np.uint8)
        a = np.repeat(np.repeat(small, 10, axis=0), 10, axis=1)
        _assert_close_to_reference(a, a)


def test_uniform_gray_is_preserved_exactly():
    # R = G = B = v has luminance exactly v: truncation must not drop it to v - 1
    for value in range(256):
        image = np.full((210, 160, 3), value, np.uint8)
        assert np.all(preprocess_frame(image, image) == value)


def test_max_pool_happens_in_rgb_before_luminance():
    red = np.zeros((210, 160, 3), np.uint8)
    red[..., 0] = 255
    green = np.zeros((210, 160, 3), np.uint8)
    green[..., 1] = 255
    pooled_first = int(0.299 * 255 + 0.587 * 255)  # max(R), max(G) -> Y = 225.93
    luminance_first = int(max(0.299 * 255, 0.587 * 255))  # max(Y_red, Y_green) = 149.69
    assert pooled_first != luminance_first
    frame = preprocess_frame(red, green)
    assert np.all(frame == pooled_first)
    assert np.array_equal(frame, preprocess_frame(green, red))


def test_preprocess_writes_into_out():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (210, 160, 3), dtype=np.uint8)
    out = np.zeros((84, 84), np.uint8)
    result = preprocess_frame(a, a, out=out)
    assert result is out
    assert np.array_equal(out, preprocess_frame(a, a))


# -- AtariEnv ---------------------------------------------------------------------------------


def _random_actions(env: AtariEnv, rng: np.random.Generator) -> dict[str, int]:
    return {agent: int(rng.integers(env.action_space(agent).n)) for agent in env.agents}


def test_game_list_matches_pettingzoo_and_roms_are_present():
    registered = {
        "_v".join(env_id.split("/", 1)[1].rsplit("-v", 1))  # atari/pong-v3 -> pong_v3
        for env_id in pettingzoo.parallel_registry
        if env_id.startswith("atari/")
    }
    assert set(ATARI_GAMES) == registered
    assert len(ATARI_GAMES) == 24
    assert (rom_dir() / "pong.bin").is_file()


def test_pong_shapes_spaces_and_shared_frame():
    env = AtariEnv("pong_v3", seed=0)
    assert env.possible_agents == ["first_0", "second_0"]
    for agent in env.possible_agents:
        space = env.observation_space(agent)
        assert space.shape == (84, 84) and space.dtype == np.uint8
        assert space.low.min() == 0 and space.high.max() == 255
        assert env.action_space(agent).n == 6
    assert AtariEnv("pong_v3", full_action_space=True).action_space("first_0").n == 18

    observations, infos = env.reset()
    assert set(observations) == set(infos) == set(env.agents) == set(env.possible_agents)
    first = observations["first_0"]
    assert first.shape == (84, 84) and first.dtype == np.uint8
    assert observations["second_0"] is first  # one frame for every agent
    assert first in env.observation_space("first_0")

    rng = np.random.default_rng(0)
    previous = first
    previous_copy = first.copy()
    for _ in range(10):
        actions = _random_actions(env, rng)
        observations, rewards, terminations, truncations, infos = env.step(actions)
        frame = observations["first_0"]
        assert observations["second_0"] is frame
        assert frame is not previous and not frame.flags.writeable  # fresh, shared read-only
        assert np.array_equal(previous, previous_copy)  # earlier frames are never overwritten
        assert all(isinstance(r, float) for r in rewards.values())
        assert set(terminations) == set(truncations) == set(infos) == set(env.possible_agents)
        previous, previous_copy = frame, frame.copy()
    screen = env.render()
    assert screen.shape == (210, 160, 3) and screen.dtype == np.uint8
    with pytest.raises(ValueError, match="outside"):
        env.step({"first_0": 6})
    with pytest.raises(ValueError, match="unknown agent"):
        env.step({"third_0": 0})
    env.close()


@pytest.mark.parametrize("action_repeat, n_steps", [(4, 300), (1, 120)])
def test_pong_matches_pettingzoo_stepped_frame_by_frame(action_repeat, n_steps):
    seed = 3
    env = AtariEnv("pong_v3", action_repeat=action_repeat, noop_max=0, seed=seed)
    reference = pettingzoo.make(
        "parallel", "atari/pong_v3", auto_rom_install_path=str(rom_dir())
    ).unwrapped
    observations, _ = env.reset()
    ref_observations, _ = reference.reset(seed=seed)
    last_screen = ref_observations["first_0"]
    assert np.array_equal(observations["first_0"], preprocess_frame(last_screen, last_screen))

    rng = np.random.default_rng(seed)
    total_abs_reward = 0.0
    for _ in range(n_steps):
        actions = _random_actions(env, rng)
        observations, rewards, terminations, truncations, _ = env.step(actions)
        ref_rewards = dict.fromkeys(reference.agents, 0)
        screens = [last_screen]
        for _ in range(action_repeat):
            ref_obs, ref_rew, ref_term, _, _ = reference.step(actions)
            for agent, reward in ref_rew.items():
                ref_rewards[agent] += reward
            screens.append(ref_obs["first_0"])
        last_screen = screens[-1]
        assert rewards == {agent: float(r) for agent, r in ref_rewards.items()}
        assert terminations == ref_term
        assert not any(truncations.values())
        assert np.array_equal(observations["first_0"], preprocess_frame(screens[-2], screens[-1]))
        total_abs_reward += sum(abs(r) for r in rewards.values())
    if action_repeat == 4:
        assert total_abs_reward > 0  # points were scored, so reward sums were really compared
    reference.close()


def test_max_cycles_truncates_without_terminating():
    env = AtariEnv("pong_v3", max_cycles=3, seed=0)
    env.reset()
    for step in range(1, 4):
        _, _, terminations, truncations, _ = env.step({"first_0": 0, "second_0": 0})
        assert not any(terminations.values())
        assert all(truncations.values()) == (step == 3)
        assert any(truncations.values()) == (step == 3)
    assert env.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"first_0": 0})
    env.reset()  # the counter restarts
    _, _, _, truncations, _ = env.step({})
    assert not any(truncations.values()) and env.agents == env.possible_agents


def _frames(env: AtariEnv, n_steps: int, seed: int | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(123)
    observations, _ = env.reset(seed=seed)
    frames = [observations["first_0"]]
    for _ in range(n_steps):
        observations, *_ = env.step(_random_actions(env, rng))
        frames.append(observations["first_0"])
    observations, _ = env.reset()  # a second episode draws fresh no-ops from the same generator
    frames.append(observations["first_0"])
    for _ in range(n_steps):
        observations, *_ = env.step(_random_actions(env, rng))
        frames.append(observations["first_0"])
    return frames


def test_same_seed_gives_identical_frames():
    a = _frames(AtariEnv("pong_v3", seed=7), 30)
    b = _frames(AtariEnv("pong_v3", seed=7), 30)
    c = _frames(AtariEnv("pong_v3", seed=1), 30, seed=7)  # reset(seed=...) reseeds
    for fa, fb, fc in zip(a, b, c, strict=True):
        assert np.array_equal(fa, fb) and np.array_equal(fa, fc)


def test_sticky_actions_are_seeded():
    sticky = _frames(AtariEnv("pong_v3", sticky_actions=0.5, seed=5), 40)
    again = _frames(AtariEnv("pong_v3", sticky_actions=0.5, seed=5), 40)
    plain = _frames(AtariEnv("pong_v3", seed=5), 40)
    assert all(np.array_equal(a, b) for a, b in zip(sticky, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(sticky, plain, strict=True))


def test_noop_starts():
    def noop_frames(env: AtariEnv) -> int:
        return env.ale.getEpisodeFrameNumber() - baseline

    no_noops = AtariEnv("pong_v3", noop_max=0, seed=0)
    no_noops.reset()
    baseline = no_noops.ale.getEpisodeFrameNumber()
    assert noop_frames(no_noops) == 0
    counts = set()
    for seed in range(8):
        env = AtariEnv("pong_v3", noop_max=30, seed=seed)
        env.reset()
        counts.add(noop_frames(env))
    assert counts <= set(range(1, 31)) and len(counts) > 1

    # pong's opening screen is static, but the serve comes noop frames earlier
    noop_env = AtariEnv("pong_v3", noop_max=30, seed=0)
    still = {"first_0": 0, "second_0": 0}
    frames_without = [no_noops.reset()[0]["first_0"]] + [
        no_noops.step(still)[0]["first_0"] for _ in range(10)
    ]
    frames_with = [noop_env.reset()[0]["first_0"]] + [
        noop_env.step(still)[0]["first_0"] for _ in range(10)
    ]
    assert any(not np.array_equal(a, b) for a, b in zip(frames_without, frames_with))
    # in space invaders the first frame itself moves
    first_without = AtariEnv("space_invaders_v2", noop_max=0, seed=0).reset()[0]["first_0"]
    first_with = AtariEnv("space_invaders_v2", noop_max=30, seed=0).reset()[0]["first_0"]
    assert not np.array_equal(first_without, first_with)


def test_life_loss_is_flagged_and_the_game_goes_on():
    flagged = AtariEnv("entombed_cooperative_v3", seed=0)
    unflagged = AtariEnv("entombed_cooperative_v3", seed=0, terminal_on_life_loss=False)
    flagged.reset()
    unflagged.reset()
    rng = np.random.default_rng(0)
    life_losses = 0
    for _ in range(200):
        actions = _random_actions(flagged, rng)
        _, _, terminations, _, infos = flagged.step(actions)
        _, _, _, _, plain_infos = unflagged.step(actions)
        assert not any(info.get("life_lost") for info in plain_infos.values())
        for agent, info in infos.items():
            if info.get("life_lost"):
                life_losses += 1
                assert not terminations[agent] and agent in flagged.agents
        if not flagged.agents:
            break
    assert life_losses > 0


def test_eliminated_player_terminates_while_the_game_goes_on():
    env = AtariEnv("warlords_v3", seed=0)
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(1500):
        acting = list(env.agents)
        _, _, terminations, truncations, _ = env.step(_random_actions(env, rng))
        ended = [agent for agent in acting if terminations[agent]]
        if ended and env.agents:  # a castle fell, the others play on
            assert set(env.agents) == set(acting) - set(ended)
            assert not any(truncations.values())
            survivors = list(env.agents)
            observations, *_ = env.step({agent: 0 for agent in env.possible_agents})
            assert set(observations) == set(survivors)  # the eliminated player is gone
            return
    pytest.fail("no warlords player was eliminated in 1500 random steps")


def test_every_game_constructs_resets_and_steps():
    rng = np.random.default_rng(0)
    for game in ATARI_GAMES:
        env = AtariEnv(game, noop_max=2, seed=0)
        observations, infos = env.reset()
        assert set(observations) == set(env.possible_agents) == set(infos), game
        for _ in range(3):
            observations, rewards, terminations, truncations, infos = env.step(
                _random_actions(env, rng)
            )
            frame = next(iter(observations.values()))
            assert frame.shape == (84, 84) and frame.dtype == np.uint8, game
            assert set(rewards) == set(observations), game
        env.close()


def test_unknown_game_suggests_close_matches():
    with pytest.raises(ValueError, match="pong_v3") as error:
        make_atari_env("pong_v2")
    assert isinstance(error.value, UnknownGameError) and isinstance(error.value, MadqnError)
    assert "did you mean" in str(error.value)
    with pytest.raises(ValueError, match="unknown Atari game"):
        AtariEnv("not_a_game")
    assert make_atari_env("pong_v3", noop_max=0).noop_max == 0


# -- SingleAtariEnv: ale-py single-player games through the same pipeline ---------------------


def _gymnasium_reference(env_id: str):
    """ale-py's own Gymnasium env emulating ONE frame per step, no sticky actions, RGB screens:
    an independent frame-by-frame reference for madqn's action repeat, reward sums and pooling."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    return gymnasium.make(env_id, frameskip=1, repeat_action_probability=0.0, obs_type="rgb",
                          max_num_frames_per_episode=None).unwrapped


@pytest.mark.parametrize("name, env_id", [("ALE/Pong-v5", "ALE/Pong-v5"),
                                          ("gym:PongNoFrameskip-v4", "PongNoFrameskip-v4")])
def test_single_agent_pong_matches_ale_py_stepped_frame_by_frame(name, env_id):
    seed = 3
    env = make_atari_env(name, noop_max=0, seed=seed)
    assert isinstance(env, SingleAtariEnv)
    assert env.possible_agents == [SINGLE_AGENT] == ["player_0"]
    assert env.action_space("player_0").n == 6  # pong's minimal action set
    assert env.observation_space("player_0").shape == (84, 84)
    assert env.ale.getInt("frame_skip") == 1 and env.ale.getFloat("repeat_action_probability") == 0.0
    reference = _gymnasium_reference(env_id)
    observations, _ = env.reset()
    last_screen, _ = reference.reset(seed=seed)
    assert np.array_equal(observations["player_0"], preprocess_frame(last_screen, last_screen))

    rng = np.random.default_rng(seed)
    total_abs_reward, pooled_differs = 0.0, 0
    for step in range(1, 301):
        action = int(rng.integers(6))
        observations, rewards, terminations, truncations, _ = env.step({"player_0": action})
        reward, screens = 0.0, [last_screen]
        for _ in range(4):
            screen, r, terminated, _, _ = reference.step(action)
            reward += r
            screens.append(screen)
        last_screen = screens[-1]
        assert env.ale.getEpisodeFrameNumber() == reference.ale.getEpisodeFrameNumber() == 4 * step
        assert rewards == {"player_0": reward}
        assert terminations == {"player_0": terminated} and truncations == {"player_0": False}
        expected = preprocess_frame(screens[-2], screens[-1])
        assert np.array_equal(observations["player_0"], expected)
        pooled_differs += not np.array_equal(expected, preprocess_frame(screens[-1], screens[-1]))
        total_abs_reward += abs(reward)
    assert total_abs_reward > 0  # points were scored, so reward sums were really compared
    assert pooled_differs > 100  # the max over two frames mattered (the ball moves), so pooling was compared
    reference.close()


def test_single_agent_life_loss_and_game_over_follow_ale_py():
    """Breakout has 5 lives: each loss is flagged (a learning terminal), the game goes on, game over terminates."""
    env = make_atari_env("ALE/Breakout-v5", noop_max=0, seed=0)
    reference = _gymnasium_reference("ALE/Breakout-v5")
    env.reset()
    _, info = reference.reset(seed=0)
    lives = info["lives"]
    assert lives == 5 and env.action_space("player_0").n == 4
    rng = np.random.default_rng(0)
    losses = 0
    while env.agents:
        action = int(rng.integers(4))
        _, _, terminations, _, infos = env.step({"player_0": action})
        for _ in range(4):
            _, _, terminated, _, info = reference.step(action)
            if terminated:
                break
        lost = info["lives"] < lives and not terminated
        assert infos["player_0"].get("life_lost", False) == lost
        assert terminations["player_0"] == terminated
        losses += lost
        lives = info["lives"]
    assert losses == 4 and lives == 0


def test_single_agent_noop_starts_seeds_sticky_actions_truncation_and_state():
    def frames(env, n_steps, seed=None):
        rng = np.random.default_rng(5)
        out = [env.reset(seed=seed)[0]["player_0"]]
        out += [env.step({"player_0": int(rng.integers(6))})[0]["player_0"] for _ in range(n_steps)]
        return out

    same = [frames(make_atari_env("ALE/Pong-v5", seed=7), 40) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*same, strict=True))
    sticky = [frames(make_atari_env("ALE/Pong-v5", seed=7, sticky_actions=0.5), 40) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*sticky, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(sticky[0], same[0], strict=True))

    counts = set()
    for seed in range(6):
        env = make_atari_env("ALE/Pong-v5", seed=seed)
        env.reset()
        counts.add(env.ale.getEpisodeFrameNumber())
    assert counts <= set(range(1, 31)) and len(counts) > 1  # 1..30 no-op frames

    env = make_atari_env("ALE/Pong-v5", max_cycles=3, seed=0)
    env.reset()
    truncated = [env.step({"player_0": 0})[3]["player_0"] for _ in range(3)]
    assert truncated == [False, False, True] and env.agents == []

    env = make_atari_env("ALE/Pong-v5", seed=1)
    frames(env, 25)
    state = env.get_state()
    rng = np.random.default_rng(9)
    actions = [int(rng.integers(6)) for _ in range(30)]
    ahead = [env.step({"player_0": a})[0]["player_0"] for a in actions]
    restored = make_atari_env("ALE/Pong-v5", seed=2)
    restored.set_state(state)
    again = [restored.step({"player_0": a})[0]["player_0"] for a in actions]
    assert all(np.array_equal(a, b) for a, b in zip(ahead, again, strict=True))
    with pytest.raises(ValueError, match="ALE/Pong-v5"):
        make_atari_env("ALE/Breakout-v5").set_state(state)


def test_unknown_single_player_name_is_one_clear_error():
    with pytest.raises(UnknownGameError, match="did you mean 'ALE/Pong-v5'") as typo:
        make_atari_env("ALE/Pongg-v5")
    assert "Boxing" not in str(typo.value) and "Pooyan" not in str(typo.value)  # only close games
    with pytest.raises(UnknownGameError) as unrelated:
        make_atari_env("ALE/Zzzz-v5")
    assert "did you mean" not in str(unrelated.value)
    with pytest.raises(UnknownGameError, match="did you mean 'gym:PongNoFrameskip-v4'"):
        make_atari_env("gym:PongNoFrameskp-v4")
    with pytest.raises(UnknownGameError, match="did you mean 'gym:PongNoFrameskip-v4'"):
        make_atari_env("PongNoFrameskip-v4")  # a Gymnasium id needs gym: (or the ALE/ form)
    assert is_atari_spec("ALE/Pong-v5") and is_atari_spec("gym:Pong-v4") and is_atari_spec("pong_v3")
    assert not is_atari_spec("envs/catch.py:make_env")


def test_emulate_is_step_without_the_screen_work():
    """``AtariEnv.emulate`` (madqn bench's limit for the env row) runs the emulator exactly as ``step`` does: the
    same joint action for ``action_repeat`` frames, the same ALE state afterwards; it leaves the episode alone."""
    stepped, emulated = (AtariEnv("pong_v3", noop_max=0, seed=5) for _ in range(2))
    for env in (stepped, emulated):
        env.reset()
    start = emulated.ale.getEpisodeFrameNumber()
    rng = np.random.default_rng(0)
    for _ in range(30):
        joint = rng.integers(6, size=2)
        stepped.step(dict(zip(stepped.possible_agents, map(int, joint))))
        emulated.emulate(joint)
        assert emulated.ale.getEpisodeFrameNumber() == stepped.ale.getEpisodeFrameNumber()
        assert np.array_equal(emulated.ale.getRAM(), stepped.ale.getRAM())
    assert emulated.ale.getEpisodeFrameNumber() == start + 30 * 4
    assert emulated.agents == emulated.possible_agents
    for env in (stepped, emulated):
        env.close()
