"""madqn.envs.adapters: env specs, observation conversion (images, vectors, masks) and the parallel/AEC adapters."""

import functools
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

import madqn
from madqn.cli import main as cli_main
from madqn.config import Config
from madqn.envs.adapters import AECAdapter, ObservationSpec, ParallelAdapter, make_env, observation_spec
from madqn.errors import MadqnError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "envs"))

import catch  # noqa: E402
import gridrace  # noqa: E402


def reference_frame(image: np.ndarray) -> np.ndarray:
    """Independent DQN3.0 preprocessing: float64 BT.601 luminance, cv2 area resize to 84x84, truncation."""
    image = np.asarray(image, dtype=np.float64)
    gray = image if image.ndim == 2 else image[..., 0] * 0.299 + image[..., 1] * 0.587 + image[..., 2] * 0.114
    small = cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA)
    return np.floor(small + 1e-4).astype(np.uint8)


def spec_for(space, **config):
    return observation_spec("a", space, Config(**config))


# ---- observation specs ----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(48, 66, 3), (210, 160, 3), (30, 40, 4), (100, 90), (50, 50, 1)])
def test_images_of_any_size_become_84x84_luminance(shape):
    rng = np.random.default_rng(0)
    spec = spec_for(spaces.Box(0, 255, shape, np.uint8))
    assert (spec.kind, spec.preprocess, spec.shape) == ("image", True, (84, 84))
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    frame = spec.convert(image)
    assert frame.shape == (84, 84) and frame.dtype == np.uint8
    rgb = image[..., :3] if image.ndim == 3 and shape[2] >= 3 else image.reshape(shape[:2])
    # float32 vs float64 arithmetic may put a value on the other side of an integer: at most 1 level
    assert np.abs(frame.astype(int) - reference_frame(rgb).astype(int)).max() <= 1
    assert np.mean(frame == reference_frame(rgb)) > 0.99


def test_exact_gray_levels_survive_preprocessing():
    # A uniform gray RGB image must give exactly that gray (luminance weights sum to 1; no off-by-one)
    spec = spec_for(spaces.Box(0, 255, (40, 60, 3), np.uint8))
    for level in (0, 1, 110, 236, 255):
        assert np.all(spec.convert(np.full((40, 60, 3), level, np.uint8)) == level)


def test_channels_first_and_other_channel_counts():
    chw = spec_for(spaces.Box(0, 255, (3, 64, 48), np.uint8))
    assert (chw.kind, chw.layout) == ("image", "CHW")
    image = np.random.default_rng(1).integers(0, 256, (3, 64, 48), dtype=np.uint8)
    hwc = spec_for(spaces.Box(0, 255, (64, 48, 3), np.uint8))
    assert np.array_equal(chw.convert(image), hwc.convert(np.moveaxis(image, 0, -1)))
    planes = spec_for(spaces.Box(0, 255, (32, 32, 6), np.uint8))  # 6 channels: their mean
    x = np.zeros((32, 32, 6), np.uint8)
    x[..., 0] = 120
    assert np.all(planes.convert(x) == 20)


def test_84x84_single_channel_frames_pass_through_unless_forced():
    for shape in [(84, 84), (84, 84, 1)]:
        spec = spec_for(spaces.Box(0, 255, shape, np.uint8))
        assert spec.preprocess is False and spec.shape == (84, 84)
        frame = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
        assert np.array_equal(spec.convert(frame), frame.reshape(84, 84))
    assert spec_for(spaces.Box(0, 255, (84, 84), np.uint8), preprocess="atari").preprocess is True


def test_preprocess_none_keeps_frames_and_rejects_what_the_conv_net_cannot_take():
    spec = spec_for(spaces.Box(0, 255, (36, 36), np.uint8), preprocess="none")
    assert (spec.preprocess, spec.shape) == (False, (36, 36))
    for shape in [(36, 36, 3), (40, 36), (20, 20)]:
        with pytest.raises(MadqnError, match="preprocess = none"):
            spec_for(spaces.Box(0, 255, shape, np.uint8), preprocess="none")


def test_vectors_and_overrides():
    box = spec_for(spaces.Box(-1, 1, (3, 4), np.float64))
    assert (box.kind, box.shape) == ("vector", (12,))
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = box.convert(x)
    assert out.dtype == np.float32 and np.array_equal(out, np.arange(12, dtype=np.float32))
    small_uint8 = spec_for(spaces.Box(0, 255, (3, 3), np.uint8))  # too small to be an image
    assert small_uint8.kind == "vector"
    forced = spec_for(spaces.Box(0, 255, (48, 66, 3), np.uint8), network="mlp")
    assert (forced.kind, forced.shape) == ("vector", (48 * 66 * 3,))
    as_image = spec_for(spaces.Box(0, 1, (40, 40), np.float32), network="conv")
    assert as_image.kind == "image"
    discrete = spec_for(spaces.Discrete(4))
    assert np.array_equal(discrete.convert(2), [0, 0, 1, 0])
    assert np.array_equal(spec_for(spaces.Discrete(3, start=1)).convert(3), [0, 0, 1])
    binary = spec_for(spaces.MultiBinary(5))
    assert binary.kind == "vector" and np.array_equal(binary.convert(np.array([1, 0, 1, 1, 0], np.int8)), [1, 0, 1, 1, 0])


def test_dict_observations_with_action_masks():
    space = spaces.Dict({"observation": spaces.Box(0, 1, (3, 3, 2), np.int8),
                         "action_mask": spaces.Box(0, 1, (9,), np.int8)})
    spec = spec_for(space)
    assert spec.dict_obs and spec.kind == "vector" and spec.shape == (18,)
    obs = {"observation": np.ones((3, 3, 2), np.int8), "action_mask": np.array([1, 0, 1, 0, 0, 0, 0, 0, 1], np.int8)}
    assert spec.convert(obs).shape == (18,)
    assert spec.action_mask(obs, {}, 9).tolist() == [True, False, True] + [False] * 5 + [True]
    with pytest.raises(MadqnError, match="action mask of shape"):
        spec.action_mask(obs, {}, 7)
    assert spec_for(spaces.Box(0, 1, (4,))).action_mask(np.zeros(4), {"action_mask": [0, 1, 1, 0]}, 4).tolist() == [
        False, True, True, False]


def test_spec_round_trips_through_a_plain_dict():
    spec = spec_for(spaces.Box(0, 255, (3, 64, 48), np.uint8))
    assert ObservationSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("space, message", [
    (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "not supported"),
    (spaces.Dict({"pos": spaces.Box(0, 1, (2,))}), "need an 'observation' entry"),
])
def test_unsupported_observation_spaces_are_named(space, message):
    with pytest.raises(MadqnError, match=message):
        spec_for(space)


# ---- adapters -------------------------------------------------------------------------------

class BoxActions(ParallelEnv):
    metadata = {"name": "box_actions"}
    possible_agents = ["a"]

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return spaces.Box(-1, 1, (1,), np.float32)


def test_non_discrete_action_space_is_a_clear_error():
    with pytest.raises(MadqnError, match="agent a: DQN needs a Discrete action space"):
        make_env(BoxActions, Config())


def test_parallel_adapter_converts_and_offsets_discrete_start():
    env = make_env(gridrace.make_heterogeneous_env, Config())
    assert isinstance(env, ParallelAdapter)
    assert env.action_space("runner_0") == spaces.Discrete(4)  # Discrete(4, start=1) in the env
    obs, infos = env.reset(seed=3)
    assert set(obs) == {"runner_0", "runner_1"}  # runner_2 joins later
    assert obs["runner_0"].shape == (6,) and obs["runner_1"].shape == (5,)
    before = env.env._pos[0].copy()
    env.step({"runner_0": 3, "runner_1": 0, })  # madqn action 3 = env action 4 = right
    assert env.env._pos[0][0] == min(before[0] + 1, env.env.size - 1) and env.env._pos[0][1] == before[1]


def test_aec_adapter_plays_tictactoe_turn_by_turn():
    from pettingzoo.classic import tictactoe_v3

    env = make_env(tictactoe_v3.env, Config(), seed=0)
    assert isinstance(env, AECAdapter)
    obs, infos = env.reset()
    assert list(obs) == ["player_1"] and obs["player_1"].shape == (18,)
    assert infos["player_1"]["action_mask"].all()
    # player_1 takes cells 0, 1, 2 (a row), player_2 takes 3, 4
    moves = [("player_1", 0), ("player_2", 3), ("player_1", 1), ("player_2", 4)]
    taken = []
    for agent, cell in moves:
        obs, rewards, terms, truncs, infos = env.step({agent: cell})
        taken.append(cell)
        nxt = "player_2" if agent == "player_1" else "player_1"
        assert list(obs) == [nxt] and not terms[nxt]  # only the agent whose turn it is
        assert np.flatnonzero(~infos[nxt]["action_mask"]).tolist() == sorted(taken)
    with pytest.raises(ValueError, match="player_1's turn"):
        env.step({"player_2": 5})
    obs, rewards, terms, truncs, infos = env.step({"player_1": 2})  # wins
    # both final observations arrive at once; the loser's -1 came on the winner's move
    assert set(obs) == {"player_1", "player_2"}
    assert rewards == {"player_1": 1.0, "player_2": -1.0}
    assert terms == {"player_1": True, "player_2": True}
    assert env.agents == []


# ---- specs on the command line --------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("pong_v9", "cannot resolve env 'pong_v9'"),
    ("envs/catch.py", "missing ':callable'"),
    ("envs/nope.py:make_env", "env file not found: envs/nope.py"),
    ("envs/catch.py:no_such_fn", "has no attribute 'no_such_fn'"),
    ("envs/catch.py:OWN", "is not callable"),
    ("no_such_package.mod:make_env", "cannot import module 'no_such_package.mod'"),
    ("envs/catch.py:CatchEnv.render", "has no attribute"),
    ("numpy:zeros", "env factory zeros() raised TypeError"),
    ("os:getcwd", "returned str, not a PettingZoo ParallelEnv or AECEnv"),
    ("envs/gridrace.py:make_heterogeneous_env", "sharing = shared needs equal observation spaces, but runner_0 has"),
])
def test_bad_env_specs_give_one_clear_line(spec, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    code = cli_main(["train", "--env", spec, "--sharing", "shared", "--run-dir", str(tmp_path / "run"),
                     "--set", "device='cpu'"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("madqn: error: ") and message in err, err
    assert "Traceback" not in err


def test_unknown_name_lists_the_accepted_forms(capsys, tmp_path):
    cli_main(["train", "--env", "my_game", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert "package.module:callable" in err and "path/to/file.py:callable" in err and "pong_v3" in err


def test_bad_spec_in_a_real_process_has_no_traceback(madqn_cli, tmp_path):
    import subprocess

    cmd, env = madqn_cli("train", "--env", "envs/catch.py:nope", "--run-dir", str(tmp_path / "r"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "madqn: error: 'envs/catch.py' has no attribute 'nope' (from env 'envs/catch.py:nope')"


def test_shared_spaces_error_names_agents_and_spaces(tmp_path):
    with pytest.raises(MadqnError) as e:
        madqn.train(gridrace.make_heterogeneous_env, None, run_dir=tmp_path / "run", sharing="shared", device="cpu")
    assert not (tmp_path / "run").exists()  # nothing written for a run that cannot start
    msg = str(e.value)
    assert "runner_0" in msg and "runner_1" in msg and "(6,)" in msg and "(5,)" in msg
    assert "sharing independent" in msg


def test_example_env_modules_import_by_path():
    factory = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_env")
    again = madqn.envs.adapters.load_env_factory(str(ROOT / "envs" / "catch.py") + ":make_env")
    assert factory is again  # imported once
    assert isinstance(factory(), ParallelEnv)
