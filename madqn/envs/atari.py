"""Atari with DQN3.0 preprocessing, computed once per step for all agents.

One `AtariEnv` wraps one PettingZoo `ParallelAtariEnv` but drives its ALE directly: every agent
step repeats the joint action for `action_repeat` frames, sums the raw per-player rewards, max-pools
the RGB screens of the last two frames and turns them into one 84x84 luminance frame that every
agent receives (all players look at the same screen). This is DQN3.0's alewrap/Scale pipeline
(dqn3-reference.md section 5) with PettingZoo's player/termination rules on top.

`SingleAtariEnv` is the same env (the same step, reset and state code) on ale-py's own
`ALEInterface`: a single-player game named by its Gymnasium id (`ALE/Pong-v5`,
`gym:PongNoFrameskip-v4`) becomes a one-agent env whose agent is `player_0`. The ALE runs one frame
per `act` without sticky actions (unless `sticky_actions` is set), so DQN3.0's preprocessing applies
exactly once, whatever frame skip and sticky-action defaults the Gymnasium id has.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pettingzoo
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from madqn.errors import MadqnError

__all__ = [
    "ATARI_GAMES",
    "FRAME_SHAPE",
    "AtariEnv",
    "GYM_PREFIX",
    "SINGLE_AGENT",
    "SingleAtariEnv",
    "UnknownGameError",
    "area_resize_84",
    "is_atari_spec",
    "luminance",
    "make_atari_env",
    "preprocess_frame",
    "rom_dir",
    "single_player_ids",
]

# PettingZoo's multi-player Atari games (registry ids `atari/pong-v3`...; a test checks the list).
ATARI_GAMES: tuple[str, ...] = (
    "basketball_pong_v3",
    "boxing_v2",
    "combat_plane_v2",
    "combat_tank_v2",
    "double_dunk_v3",
    "entombed_competitive_v3",
    "entombed_cooperative_v3",
    "flag_capture_v2",
    "foozpong_v3",
    "ice_hockey_v2",
    "joust_v3",
    "mario_bros_v3",
    "maze_craze_v3",
    "othello_v3",
    "pong_v3",
    "quadrapong_v4",
    "space_invaders_v2",
    "space_war_v2",
    "surround_v2",
    "tennis_v3",
    "video_checkers_v4",
    "volleyball_pong_v3",
    "warlords_v3",
    "wizard_of_wor_v3",
)

FRAME_SHAPE = (84, 84)  # (height, width) of a preprocessed frame
NOOP = 0  # ALE action id of "no operation" (every game's minimal set contains it)
GYM_PREFIX = "gym:"  # `gym:<Gymnasium id>` names any ale-py single-player game (`ALE/<Game>-v5` also works bare)
SINGLE_AGENT = "player_0"  # the agent of a single-player game

# ITU-R BT.601 luma weights on (R, G, B), as a 1x3 matrix for cv2.transform.
_LUMINANCE_1x3 = np.array([[0.299, 0.587, 0.114]], dtype=np.float32)
_LUMINANCE_2_5 = _LUMINANCE_1x3 * np.float32(0.4)
# Added before truncating to uint8: exact integer luminances (grays, where R = G = B) come out of
# float32 arithmetic up to ~4e-5 low and would otherwise drop one gray level (236 -> 235).
_TRUNCATION_SLACK = 1e-4


class UnknownGameError(MadqnError, ValueError):
    """The Atari game name is not one of ATARI_GAMES (the message suggests close matches)."""


def rom_dir() -> Path:
    """The folder of Atari ROMs shipped inside ale-py (PettingZoo loads `<game>.bin` from it)."""
    import ale_py

    return Path(ale_py.__file__).parent / "roms"


def preprocess_frame(
    rgb_a: np.ndarray, rgb_b: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """DQN3.0 frame preprocessing of the last two RGB screens of an action repeat.

    Element-wise max of the two (H, W, 3) uint8 screens in RGB (before luminance), then
    `luminance` and `area_resize_84`. Returns `out` if given (an (84, 84) uint8 array), else a new array.
    """
    pooled = np.maximum(rgb_a, rgb_b)
    if pooled.shape[:2] != (210, 160):
        return area_resize_84(luminance(pooled), out)
    # Atari screens: the same area resize in two passes, the vertical one (5 rows -> 2, weights
    # 1, 1, 1/2 | 1/2, 1, 1; scale 2/5 folded into the luminance weights) as plain sums, since cv2's
    # generic non-integer INTER_AREA is the slowest step of the pipeline
    v = cv2.transform(pooled.astype(np.float32), _LUMINANCE_2_5).reshape(42, 5, 160)  # 0.4 * Y
    half = v[:, 2] * np.float32(0.5)
    rows = np.empty((42, 2, 160), np.float32)
    np.add(v[:, 0], v[:, 1], out=rows[:, 0])
    rows[:, 0] += half
    np.add(v[:, 3], v[:, 4], out=rows[:, 1])
    rows[:, 1] += half
    return _to_uint8(cv2.resize(rows.reshape(84, 160), FRAME_SHAPE[::-1], interpolation=cv2.INTER_AREA), out)


def luminance(rgb: np.ndarray) -> np.ndarray:
    """Y = 0.299 R + 0.587 G + 0.114 B of an (H, W, 3) image, as (H, W) float32 (DQN3.0's Scale)."""
    return cv2.transform(np.asarray(rgb, dtype=np.float32), _LUMINANCE_1x3)


def area_resize_84(gray: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Area resize of a whole (H, W) float32 luminance image (no crop) to 84x84, then uint8.

    cv2.INTER_AREA is exact box averaging when shrinking; values are truncated to uint8 as DQN3.0's
    TransitionTable stores them. Returns `out` if given (an (84, 84) uint8 array), else a new array.
    """
    return _to_uint8(cv2.resize(np.asarray(gray, dtype=np.float32), FRAME_SHAPE[::-1],
                                interpolation=cv2.INTER_AREA), out)


def _to_uint8(small: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Truncate a float luminance image to uint8 (DQN3.0 stores y * 255 truncated), into `out` if given."""
    small += _TRUNCATION_SLACK
    if out is None:
        return small.astype(np.uint8)  # float -> uint8 casting truncates (values are in [0, 256))
    np.copyto(out, small, casting="unsafe")
    return out


class _Emulator:
    """The handful of per-frame ALE calls, bound once to preallocated buffers.

    multi_agent_ale_py's Python wrapper allocates and converts arrays with `as_ctypes` on every
    `act`/`getScreenRGB` call (~20 us each, a third of the emulation time per frame); here the
    same C functions get fixed pointers. Other ALE objects go through the public methods.
    """

    def __init__(self, ale: Any, n_players: int, screen_shape: tuple[int, int, int]) -> None:
        self.ale = ale
        self.joint_action = np.zeros(n_players, np.intc)  # ALE action ids, written by the caller
        self.rewards = np.zeros(n_players, np.intc)  # rewards of the latest frame
        self._lives = np.zeros(n_players, np.intc)
        self.screens = (np.empty(screen_shape, np.uint8), np.empty(screen_shape, np.uint8))
        self._lib = None
        try:
            from multi_agent_ale_py import ale_python_interface

            if isinstance(ale, ale_python_interface.ALEInterface):
                lib = ale_python_interface.ale_lib
                if lib.actMultiSize(ale.obj) == n_players and lib.livesSize(ale.obj) == n_players:
                    self._lib = lib
                    self._obj = ale.obj
                    self._pointers = (  # the buffers live as long as self; fixed addresses
                        self.joint_action.ctypes.data,
                        self.rewards.ctypes.data,
                        self._lives.ctypes.data,
                        self.screens[0].ctypes.data,
                        self.screens[1].ctypes.data,
                    )
        except (ImportError, AttributeError):  # another ALE build: use the public API
            self._lib = None

    def act(self) -> np.ndarray:
        """Emulate one frame with `joint_action`; returns the `rewards` buffer (reused)."""
        if self._lib is not None:
            self._lib.actMulti(self._obj, self._pointers[0], self._pointers[1])
        else:
            self.rewards[:] = self.ale.act(self.joint_action)
        return self.rewards

    def grab_screen(self, which: int) -> None:
        """Copy the current RGB screen into `screens[which]`."""
        if self._lib is not None:
            self._lib.getScreenRGB(self._obj, self._pointers[3 + which])
        else:
            self.ale.getScreenRGB(self.screens[which])

    def lives(self) -> np.ndarray:
        """Per-player life counters (a new array); -1 marks an eliminated player."""
        if self._lib is not None:
            self._lib.lives(self._obj, self._pointers[2])
            return self._lives.copy()
        return np.asarray(self.ale.allLives(), np.intc)

    def game_over(self) -> bool:
        return bool(self.ale.game_over())

    def reset(self) -> None:
        self.ale.reset_game()

    def load_rom(self, rom_path: str, seed: int, sticky_actions: float, mode: int | None,
                 difficulty: int | None) -> None:
        """(Re)load the ROM: ALE settings (random_seed, used by sticky actions) apply on load."""
        self.apply_settings(seed, sticky_actions)
        self.ale.loadROM(rom_path)
        if mode is not None:
            self.ale.setMode(mode)
        if difficulty is not None:
            self.ale.setDifficulty(difficulty)

    def apply_settings(self, seed: int, sticky_actions: float) -> None:
        """The ALE settings `load_rom` applies before loading (multi_agent_ale_py takes bytes keys)."""
        self.ale.setFloat(b"repeat_action_probability", sticky_actions)
        self.ale.setInt(b"random_seed", seed)

    def save_state(self) -> np.ndarray:
        """The ALE system state (RAM, CPU, TIA, frame counters) as uint8 bytes."""
        handle = self.ale.cloneSystemState()
        try:
            return np.array(self.ale.encodeState(handle), dtype=np.uint8)
        finally:
            self.ale.deleteState(handle)

    def restore_state(self, data: np.ndarray) -> None:
        handle = self.ale.decodeState(np.ascontiguousarray(data, dtype=np.uint8))
        try:
            self.ale.restoreSystemState(handle)
        finally:
            self.ale.deleteState(handle)


class _SinglePlayerEmulator(_Emulator):
    """The same calls on ale-py's `ALEInterface` (one player; its nanobind methods take buffers directly)."""

    def __init__(self, ale: Any) -> None:
        self.ale = ale
        self.joint_action = np.zeros(1, np.intc)
        self.rewards = np.zeros(1, np.intc)
        self.screens = (np.empty(0, np.uint8), np.empty(0, np.uint8))  # allocated once the ROM is loaded
        self._lib = None

    def act(self) -> np.ndarray:
        self.rewards[0] = self.ale.act(int(self.joint_action[0]))
        return self.rewards

    def grab_screen(self, which: int) -> None:
        self.ale.getScreenRGB(self.screens[which])

    def lives(self) -> np.ndarray:
        return np.array([self.ale.lives()], np.intc)

    def apply_settings(self, seed: int, sticky_actions: float) -> None:
        """ale-py's settings take str keys; one frame per act, since madqn repeats the action itself."""
        self.ale.setInt("frame_skip", 1)
        self.ale.setFloat("repeat_action_probability", sticky_actions)
        self.ale.setInt("random_seed", seed)

    def save_state(self) -> np.ndarray:
        return np.frombuffer(self.ale.cloneState(include_rng=True).serialize(), dtype=np.uint8).copy()

    def restore_state(self, data: np.ndarray) -> None:
        import ale_py

        self.ale.restoreState(ale_py.ALEState(np.ascontiguousarray(data, dtype=np.uint8).tobytes()))


def _game_name(env_id: str) -> str:
    """The game an id names, for typo matching: `pong` for `pong_v3`, `ALE/Pong-v5` and `PongNoFrameskip-v4`."""
    name = env_id.removeprefix(GYM_PREFIX).removeprefix("ALE/")
    return re.fullmatch(r"(.*?)(No[A-Z][a-z]*|Det[a-z]*)?([-_]v\d*)?", name, re.S).group(1).lower()


def close_ids(name: str, ids, cutoff: float = 0.8, n: int = 2) -> list[str]:
    """At most ``n`` of ``ids`` whose game is as similar to ``name``'s as ``cutoff`` (difflib's ratio over the
    game names, so that shared prefixes and versions such as ``ALE/`` or ``-v5`` make no game look close);
    among the forms of one game, the most similar id first. Typos, not games that merely share a suffix."""
    game = _game_name(name)
    scored = [(difflib.SequenceMatcher(None, game, _game_name(i)).ratio(),
               difflib.SequenceMatcher(None, name, i).ratio(), i) for i in ids]
    return [i for similarity, _, i in sorted(scored, reverse=True)[:n] if similarity >= cutoff]


def close_games(name: str) -> list[str]:
    """The multi-player games whose names are close to ``name`` (see `close_ids`)."""
    return close_ids(name, ATARI_GAMES)


def _check_game(name: str) -> str:
    if name in ATARI_GAMES:
        return name
    matches = [GYM_PREFIX + name] if name in single_player_ids() else close_games(name)
    if matches:
        raise UnknownGameError(f"unknown Atari game {name!r} (did you mean {' or '.join(map(repr, matches))}?)")
    raise UnknownGameError(f"unknown Atari game {name!r} (the games: {', '.join(ATARI_GAMES)}; single-player games: "
                           f"ALE/<Game>-v5 or {GYM_PREFIX}<Gymnasium id>, e.g. ALE/Pong-v5)")


class AtariEnv(ParallelEnv):
    """One PettingZoo multi-player Atari game as a madqn `MultiAgentEnv` (docs/architecture.md).

    Per `step`: the joint action (absent or finished agents send NOOP) is repeated for
    `action_repeat` frames (stopping early at game over), rewards are the raw per-player sums,
    and every acting agent receives the same fresh, read-only (84, 84) uint8 frame from
    `preprocess_frame` on the last two screens. Game over terminates every agent; a player whose
    ALE life count drops below 0 (PettingZoo's marker of an eliminated player) is terminated.
    After `max_cycles` agent steps every live agent is truncated (never terminated), so a game
    that stalls (a player who never serves) still ends. After each reset, DQN3.0's random start:
    1..noop_max no-op frames for all players (drawn from the env's seeded generator) before the
    first observation. With `terminal_on_life_loss`, a life lost while the game goes on is flagged
    as `infos[agent]["life_lost"] = True` (DQN3.0's training terminal; the episode continues).
    """

    metadata = {"render_modes": ["rgb_array"], "name": "madqn_atari", "render_fps": 15}

    def __init__(
        self,
        game: str,
        *,
        action_repeat: int = 4,
        max_cycles: int = 27_000,
        noop_max: int = 30,
        sticky_actions: float = 0.0,
        terminal_on_life_loss: bool = True,
        full_action_space: bool = False,
        seed: int | None = None,
    ) -> None:
        self.game = _check_game(game)
        self._settings(action_repeat, max_cycles, noop_max, sticky_actions, terminal_on_life_loss, full_action_space)
        ale_seed = self._seed_generator(seed)
        wrapped = pettingzoo.make(
            "parallel",
            "atari/" + "-v".join(self.game.rsplit("_v", 1)),  # registry id, e.g. atari/pong-v3
            obs_type="rgb_image",
            full_action_space=self.full_action_space,
            max_cycles=2**62,  # we count cycles ourselves; PettingZoo must never truncate
            auto_rom_install_path=str(rom_dir()),
            seed=ale_seed,  # PettingZoo sets the ALE random_seed and loads the ROM with it
        )
        self._pz_env = wrapped.unwrapped  # the ParallelAtariEnv under PettingZoo's wrappers
        self._rom = (self._pz_env.rom_path, self._pz_env.mode, None)  # path, mode, difficulty
        ale = self._pz_env.ale
        width, height = ale.getScreenDims()
        emulator = _Emulator(ale, len(self._pz_env.possible_agents), (height, width, 3))
        self._attach(emulator, list(self._pz_env.possible_agents), self._pz_env.action_mapping)
        if self.sticky_actions != 0.0:  # PettingZoo loaded the ROM without sticky actions
            self._load_rom(ale_seed)

    # -- MultiAgentEnv -------------------------------------------------------------------------

    def observation_space(self, agent: str) -> spaces.Box:
        self._check_agent(agent)
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Discrete:
        self._check_agent(agent)
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """New game, then 1..noop_max no-op frames (0: none); returns every agent's first frame."""
        if seed is not None:
            self._load_rom(self._seed_generator(seed))
        emulator = self._emulator
        emulator.reset()
        n_noops = int(self._rng.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        emulator.joint_action.fill(NOOP)
        if n_noops == 0:
            emulator.grab_screen(0)
        for i in range(n_noops):
            if i == n_noops - 1:
                emulator.grab_screen(0)
            emulator.act()
            if emulator.game_over():  # not seen in practice; start again as DQN3.0 would
                emulator.reset()
        emulator.grab_screen(1)
        self.agents = list(self.possible_agents)
        self._lives[:] = emulator.lives()
        self._agent_steps = 0
        frame = self._frame()
        return {agent: frame for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[
        dict[str, np.ndarray],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        """Repeat the joint action for `action_repeat` frames; see the class docstring."""
        if not self.agents:
            raise RuntimeError("step() after the episode ended (no live agents); call reset()")
        acting = self.agents
        emulator = self._emulator
        joint = emulator.joint_action
        joint.fill(NOOP)
        n_actions = self._action_space.n
        for agent, action in actions.items():
            index = self._agent_index.get(agent)
            if index is None:
                raise ValueError(f"unknown agent {agent!r}; agents are {self.possible_agents}")
            action = int(action)
            if not 0 <= action < n_actions:
                raise ValueError(f"action {action} of {agent!r} is outside Discrete({n_actions})")
            if agent in acting:
                joint[index] = self._action_mapping[action]

        rewards = np.zeros(len(self.possible_agents), np.int64)
        last = self.action_repeat - 1
        game_over = False
        for f in range(self.action_repeat):
            if f == last:
                emulator.grab_screen(0)  # the screen after frame repeat-2 (or of the last step)
            rewards += emulator.act()
            if emulator.game_over():
                game_over = True
                break
        emulator.grab_screen(1)
        if f < last:  # game over before the last frame: pool the final screen with itself
            emulator.grab_screen(0)
        frame = self._frame()
        self._agent_steps += 1

        lives = emulator.lives()
        time_up = self._agent_steps >= self.max_cycles
        observations, reward_out, terminations, truncations, infos = {}, {}, {}, {}, {}
        for agent in acting:
            i = self._agent_index[agent]
            terminated = game_over or int(lives[i]) < 0
            observations[agent] = frame
            reward_out[agent] = float(rewards[i])
            terminations[agent] = terminated
            truncations[agent] = time_up and not terminated
            info: dict[str, Any] = {}
            if self.terminal_on_life_loss and not terminated and lives[i] < self._lives[i]:
                info["life_lost"] = True
            infos[agent] = info
        self._lives[:] = lives
        self.agents = [] if time_up else [a for a in acting if not terminations[a]]
        return observations, reward_out, terminations, truncations, infos

    def emulate(self, actions: np.ndarray) -> None:
        """The bare emulator, what ``step`` is measured against (``madqn bench``): the joint action
        (``actions``: one env action index per possible agent) for ``action_repeat`` frames through the
        same C calls as ``step``, without reading or preprocessing a screen, rewards or lives; a game
        that ends starts again at once. The episode bookkeeping (``agents``, step count) is not updated:
        it is for timing, not for playing."""
        emulator = self._emulator
        emulator.joint_action[:] = self._action_mapping[np.asarray(actions)]
        for _ in range(self.action_repeat):
            emulator.act()
            if emulator.game_over():
                emulator.reset()

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue this env exactly, as numpy arrays and plain values.

        The ALE system state (RAM, CPU, TIA, frame counters) serialised by the ALE, plus the
        wrapper's live agents, life counters, agent-step counter and no-op generator. Checkpoints
        use it so that a resumed run continues the very same episode (madqn.training.checkpoint), frame for
        frame with DQN3.0's deterministic emulator; with `sticky_actions` > 0 the restored ALE does
        not repeat the same sticky-action draws (it does not restore all they depend on).
        """
        return {
            "game": self.game,
            "ale": self._emulator.save_state(),
            "agents": list(self.agents),
            "lives": self._lives.copy(),
            "agent_steps": self._agent_steps,
            "noop_rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a `get_state()` result (taken from an env built with the same settings)."""
        if state["game"] != self.game:
            raise ValueError(f"env state is for {state['game']!r}, this env plays {self.game!r}")
        self._emulator.restore_state(state["ale"])
        self.agents = [a for a in state["agents"] if a in self._agent_index]
        self._lives[:] = np.asarray(state["lives"], dtype=np.int64)
        self._agent_steps = int(state["agent_steps"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["noop_rng"]

    def render(self) -> np.ndarray:
        """The current (210, 160, 3) uint8 RGB screen (the newest emulated frame)."""
        return self.ale.getScreenRGB()

    def close(self) -> None:
        self._pz_env.close()

    # -- internals -----------------------------------------------------------------------------

    def _settings(self, action_repeat: int, max_cycles: int, noop_max: int, sticky_actions: float,
                  terminal_on_life_loss: bool, full_action_space: bool) -> None:
        if int(action_repeat) < 1:
            raise ValueError(f"action_repeat must be >= 1 (frames), got {action_repeat}")
        if int(max_cycles) < 1:
            raise ValueError(f"max_cycles must be >= 1 (agent steps), got {max_cycles}")
        if int(noop_max) < 0:
            raise ValueError(f"noop_max must be >= 0 (frames), got {noop_max}")
        if not 0.0 <= float(sticky_actions) <= 1.0:
            raise ValueError(f"sticky_actions must be a probability, got {sticky_actions}")
        self.action_repeat = int(action_repeat)
        self.max_cycles = int(max_cycles)
        self.noop_max = int(noop_max)
        self.sticky_actions = float(sticky_actions)
        self.terminal_on_life_loss = bool(terminal_on_life_loss)
        self.full_action_space = bool(full_action_space)
        self.render_mode = "rgb_array"
        self.metadata = {**self.metadata, "name": f"madqn_{self.game}"}

    def _attach(self, emulator: _Emulator, agents: list[str], action_mapping: Any) -> None:
        """Bind the emulator (with its ROM loaded), the players and their ALE action ids."""
        self._emulator = emulator
        self.ale = emulator.ale
        self.possible_agents: list[str] = list(agents)
        self.agents: list[str] = []
        self._agent_index = {agent: i for i, agent in enumerate(self.possible_agents)}
        self._action_mapping = np.asarray(action_mapping, dtype=np.int32)
        self._observation_space = spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        self._action_space = spaces.Discrete(len(self._action_mapping))
        self._lives = np.zeros(len(self.possible_agents), np.int64)
        self._agent_steps = 0

    def _check_agent(self, agent: str) -> int:
        index = self._agent_index.get(agent)
        if index is None:
            raise KeyError(f"unknown agent {agent!r}; agents are {self.possible_agents}")
        return index

    def _seed_generator(self, seed: int | None) -> int:
        """Seed the no-op draws; returns the ALE seed: `seed` (mod 2**31), as PettingZoo does."""
        self._rng = np.random.default_rng(seed)
        return int(seed) % 2**31 if seed is not None else int(self._rng.integers(2**31))

    def _load_rom(self, ale_seed: int) -> None:
        """(Re)load the ROM with `random_seed` = ale_seed and `sticky_actions` (settings apply on load)."""
        rom_path, mode, difficulty = self._rom
        self._emulator.load_rom(rom_path, ale_seed, self.sticky_actions, mode, difficulty)

    def _frame(self) -> np.ndarray:
        frame = preprocess_frame(*self._emulator.screens)
        frame.flags.writeable = False  # shared by all agents; callers copy before writing
        return frame


# ---- single-player games (ale-py, Gymnasium ids) ----------------------------------------------

def single_player_ids() -> tuple[str, ...]:
    """Every Gymnasium id that ale-py registers (`ALE/Pong-v5`, `PongNoFrameskip-v4`, ...)."""
    import ale_py  # noqa: F401  (importing it registers its envs with Gymnasium)
    import gymnasium

    return tuple(sorted(k for k, spec in gymnasium.envs.registry.items()
                        if str(spec.entry_point).startswith("ale_py")))


def _resolve_gym_id(name: str) -> tuple[str, dict[str, Any]]:
    """`ALE/Pong-v5` or `gym:<id>` -> (the Gymnasium id, its registered kwargs); UnknownGameError otherwise."""
    import gymnasium

    env_id = name[len(GYM_PREFIX):] if name.startswith(GYM_PREFIX) else name
    ids = single_player_ids()
    if env_id not in ids:
        matches = [m if m.startswith("ALE/") else GYM_PREFIX + m for m in close_ids(env_id, ids)]
        hint = f"did you mean {' or '.join(repr(m) for m in matches)}? " if matches else ""
        raise UnknownGameError(f"unknown single-player Atari env {name!r}; {hint}use an ale-py Gymnasium id "
                               f"such as ALE/Pong-v5 or {GYM_PREFIX}PongNoFrameskip-v4 "
                               f"({len(ids)} ids: see gymnasium.envs.registry)")
    return env_id, dict(gymnasium.envs.registry[env_id].kwargs)


def is_atari_spec(name: Any) -> bool:
    """Does the env spec name a madqn Atari env: a PettingZoo game (`pong_v3`), `ALE/...` or `gym:...`?"""
    return isinstance(name, str) and (name in ATARI_GAMES or name.startswith(("ALE/", GYM_PREFIX)))


class SingleAtariEnv(AtariEnv):
    """An ale-py single-player game as a one-agent `MultiAgentEnv` (agent `player_0`), through `AtariEnv`.

    `name` is a Gymnasium id of ale-py (`ALE/Pong-v5`, `PongNoFrameskip-v4`, optionally written
    `gym:<id>`). Only the game, its mode and difficulty come from the id: its frame skip and sticky
    actions are replaced by madqn's (the ALE emulates one frame per `act`, `action_repeat` and
    `sticky_actions` are applied as for PettingZoo games), observations are the full RGB screen
    preprocessed once, and episodes end at game over or after `max_cycles` agent steps. The ROM is
    the one ale-py ships. A lost life is flagged (`terminal_on_life_loss`) as ale-py counts lives.
    """

    def __init__(self, name: str, *, action_repeat: int = 4, max_cycles: int = 27_000, noop_max: int = 30,
                 sticky_actions: float = 0.0, terminal_on_life_loss: bool = True, full_action_space: bool = False,
                 seed: int | None = None) -> None:
        import ale_py

        self.env_id, kwargs = _resolve_gym_id(name)
        self.game = self.env_id
        self._settings(action_repeat, max_cycles, noop_max, sticky_actions, terminal_on_life_loss, full_action_space)
        self.metadata = {**self.metadata, "name": f"madqn_{kwargs['game']}"}
        ale_seed = self._seed_generator(seed)
        rom_path = ale_py.roms.get_rom_path(kwargs["game"])
        if rom_path is None:
            raise UnknownGameError(f"ale-py has no ROM for {name!r} (game {kwargs['game']!r})")
        self._rom = (str(rom_path), kwargs.get("mode"), kwargs.get("difficulty"))
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        emulator = _SinglePlayerEmulator(ale_py.ALEInterface())
        emulator.load_rom(str(rom_path), ale_seed, self.sticky_actions, kwargs.get("mode"), kwargs.get("difficulty"))
        height, width = emulator.ale.getScreenDims()  # ale-py: (rows, columns)
        emulator.screens = (np.empty((height, width, 3), np.uint8), np.empty((height, width, 3), np.uint8))
        ale = emulator.ale
        actions = ale.getLegalActionSet() if self.full_action_space else ale.getMinimalActionSet()
        self._attach(emulator, [SINGLE_AGENT], [int(a.value) for a in actions])

    def close(self) -> None:
        pass


def make_atari_env(name: str, **kwargs: Any) -> AtariEnv:
    """`AtariEnv(name, **kwargs)`, or `SingleAtariEnv` for `ALE/...` and `gym:...` names; an unknown
    name raises `UnknownGameError` (a `ValueError`)."""
    if isinstance(name, str) and name.startswith(("ALE/", GYM_PREFIX)):
        return SingleAtariEnv(name, **kwargs)
    return AtariEnv(_check_game(name), **kwargs)
