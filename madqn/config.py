"""The run configuration: one typed dataclass whose names and defaults are DQN3.0's (``run_gpu``).

Counters count **agent steps**: one decision of one agent seat (= 4 emulator frames at
``action_repeat`` 4). In a parallel game every live agent acts once per environment step, so one
environment step advances the counter by one; with ``num_envs`` copies a vector step advances it by
``num_envs``. In a turn-based (AEC) game one round of turns (every live seat moves once) is one
agent step, so each seat's ``learn_start``, ``update_freq``, ``ep_endt`` and ``target_q`` mean what
they mean in a parallel game.

Configs are TOML files (``configs/*.toml``) holding any subset of the fields; ``key=value``
overrides are parsed as TOML values. Unknown keys and bad values raise :class:`ConfigError` naming
the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from madqn.errors import ConfigError


def _f(default: Any, doc: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass
class Config:
    # --- run ---------------------------------------------------------------------------------
    env: str = _f("pong_v3", "environment: a PettingZoo Atari name, a single-player Atari id (ALE/Pong-v5, gym:PongNoFrameskip-v4), 'package.module:callable' or 'file.py:callable'")
    sharing: str = _f("independent", "'shared': one Q-network for all agents; 'independent': one per agent",
                      choices=("shared", "independent"))
    agent_indicator: bool = _f(True, "shared mode: feed a one-hot agent id to the network (extra constant channels)")
    seed: int = _f(1, "random seed (envs, exploration, replay sampling, network init)")
    device: str = _f("auto", "'auto' (cuda if available), 'cpu', 'cuda' or 'cuda:N'")
    steps: int = _f(50_000_000, "training length (DQN3.0 steps: 4 frames each) [agent steps]", min=1)
    num_envs: int = _f(1, "copies of the game stepped together; each copy's agents keep their own histories and replay streams", min=1)
    num_threads: int = _f(0, "torch CPU threads (0 = choose: the cores left after the env workers, 1 on a 2-core machine)", min=0)
    vector_env: str = _f("auto", "where env copies run: 'process' (one worker process each, stepped while the learner works), "
                         "'inline' (in this process, one after another), 'auto' (process when num_envs > 1)",
                         choices=("auto", "process", "inline"))
    overlap: bool = _f(False, "learn in a background thread while acting goes on (at most one learning round behind); "
                       "false keeps DQN3.0's strict act-learn-step order and same-seed reproducibility")

    # --- distributed acting (madqn.training.distributed) ---------------------------------------------
    backend: str = _f("local", "'local': this process and its env workers act and learn in turn, DQN3.0's order "
                      "(madqn.training.trainer); 'process': actor processes on this machine feed this process's "
                      "learner, each side on its own cores at the same replay ratio (madqn.training.distributed); "
                      "'ray': the same with actor processes on a Ray cluster (needs madqn[ray])",
                      choices=("local", "process", "ray"))
    actors: int = _f(1, "backend process or ray: actor processes, each with num_envs env copies and a CPU copy of the Q-networks", min=1)
    ray_address: str = _f("", "backend ray: '' starts a local Ray instance; 'auto' or HOST:PORT joins a running cluster")
    sync_every: int = _f(100, "backend process or ray: the learner publishes its online weights to the actors every sync_every "
                         "learning rounds [rounds]", min=1)
    rollout_len: int = _f(64, "backend process or ray: agent steps in one batch an actor sends the learner [agent steps]", min=1)
    max_in_flight: int = _f(2, "backend process or ray: rollout batches one actor may have outstanding; it waits for the learner "
                            "beyond that (back-pressure, nothing dropped)", min=1)
    update_ratio: str = _f("fixed", "backend process or ray: 'fixed' keeps DQN3.0's n_replay updates per update_freq agent steps "
                           "received (actors wait for the learner); 'float' lets the learner update whenever no batch "
                           "is waiting, so the ratio follows the speeds of both sides", choices=("fixed", "float"))
    actor_epsilons: str = _f("dqn3", "backend process or ray: 'dqn3' (DQN3.0's schedule over the agent steps of all actors) or "
                             "'apex' (fixed per actor: apex_eps ** (1 + i * apex_alpha / (actors - 1)))",
                             choices=("dqn3", "apex"))
    apex_eps: float = _f(0.4, "Ape-X base epsilon", min=0.0, max=1.0)
    apex_alpha: float = _f(7.0, "Ape-X epsilon exponent spread", min=0.0)

    # --- environment (DQN3.0 alewrap / xitari behaviour) ---------------------------------------
    action_repeat: int = _f(4, "emulator frames per agent step (actrep); rewards are summed over them", min=1)
    random_starts: int = _f(30, "1..random_starts random no-op frames after each reset (0 = none) [emulator frames]", min=0)
    sticky_actions: float = _f(0.0, "probability that the emulator repeats the previous action (0 = deterministic, DQN3.0)", min=0.0, max=1.0)
    max_cycles: int = _f(27_000, "episodes are truncated (not terminated) after this many agent steps [agent steps]", min=1)
    terminal_on_life_loss: bool = _f(True, "a lost life is a terminal for learning; the game goes on (DQN3.0 training)")
    full_action_space: bool = _f(False, "use all 18 Atari actions instead of the game's minimal set")
    preprocess: str = _f("auto", "image observations: 'auto' (84x84 luminance unless already 84x84x1), 'atari' (always), 'none' (frames as given)",
                         choices=("auto", "atari", "none"))
    network: str = _f("auto", "Q-network and observation kind: 'auto' (conv for uint8 images, mlp for anything else), 'conv' (read observations as images), 'mlp' (as flat vectors)",
                      choices=("auto", "conv", "mlp"))
    mlp_hidden: list = _f([256, 256], "hidden layer sizes of the MLP Q-network (vector observations)")

    # --- DQN3.0 agent (NeuralQLearner) -------------------------------------------------------
    hist_len: int = _f(4, "frames stacked into one state [frames]", min=1)
    replay_memory: int = _f(1_000_000, "replay capacity per agent, split over its env copies (num_envs x actors) [transitions]", min=1)
    learn_start: int = _f(50_000, "no learning until this many agent steps [agent steps]", min=0)
    update_freq: int = _f(4, "a learning round every update_freq agent steps [agent steps]", min=1)
    n_replay: int = _f(1, "minibatch updates per learning round", min=1)
    minibatch_size: int = _f(32, "transitions per minibatch", min=1)
    discount: float = _f(0.99, "discount factor gamma", min=0.0, max=1.0)
    target_q: int = _f(10_000, "target network copied from the online network every target_q agent steps (0 = no target network) [agent steps]", min=0)
    lr: float = _f(0.00025, "RMSProp learning rate (lr_start)", min=0.0)
    lr_end: float = _f(0.00025, "final learning rate of the linear anneal (DQN3.0: = lr, no anneal)", min=0.0)
    lr_endt: int = _f(1_000_000, "learning-rate anneal length after learn_start [agent steps]", min=1)
    wc: float = _f(0.0, "L2 weight cost (dw -= wc * w)", min=0.0)
    rmsprop_decay: float = _f(0.95, "decay of RMSProp's running mean and mean square", min=0.0, max=1.0)
    rmsprop_eps: float = _f(0.01, "constant added INSIDE the square root of centred RMSProp", min=0.0)
    ep_start: float = _f(1.0, "initial exploration epsilon", min=0.0, max=1.0)
    ep_end: float = _f(0.1, "final exploration epsilon", min=0.0, max=1.0)
    ep_endt: int = _f(1_000_000, "epsilon anneals linearly over ep_endt agent steps after learn_start [agent steps]", min=1)
    clip_delta: float = _f(1.0, "TD error clipped to [-clip_delta, clip_delta] (0 = no clipping)", min=0.0)
    rescale_r: bool = _f(True, "divide rewards by r_max, the running max of the clipped reward, starting at 1 (stays 1 with clipping)")
    min_reward: float = _f(-1.0, "rewards clipped below at this value (per agent step, after summing the repeat)")
    max_reward: float = _f(1.0, "rewards clipped above at this value")

    # --- beyond DQN3.0 (each off by default; docs/dqn3.md says what each changes) ---------------
    double: bool = _f(False, "Double DQN (van Hasselt et al. 2016): the online network picks the next action, the target network values it")
    optimizer: str = _f("rmsprop", "'rmsprop': DQN3.0's centred RMSProp (rmsprop_decay, rmsprop_eps); 'adam': Adam with adam_eps (Rainbow: lr 6.25e-5 and eps 1.5e-4 on the mean loss, adam_eps 4.8e-3 here)",
                        choices=("rmsprop", "adam"))
    adam_eps: float = _f(4.8e-3, "Adam's epsilon (optimizer = 'adam') on madqn's update, the minibatch's SUMMED gradient (DQN3.0's, "
                         "like rmsprop_eps): an eps meant for a minibatch-MEAN loss, as in Rainbow and most PyTorch code, is multiplied "
                         "by minibatch_size (Rainbow's 1.5e-4 x 32 = 4.8e-3)", min=0.0)
    dueling: bool = _f(False, "dueling network (Wang et al. 2016): two streams V and A after the conv stack (512 units each; "
                       "the MLP splits its last hidden layer), Q = V + A - mean(A)")
    n_step: int = _f(1, "n-step returns (Sutton 1988; Rainbow): sum up to n_step clipped rewards, discount**k, bootstrap "
                     "from the state k steps on; stops at an episode end (1 = DQN3.0)", min=1)
    prioritized: bool = _f(False, "proportional prioritized replay (Schaul et al. 2016): sample by (|clipped delta| + "
                           "priority_eps) ** priority_alpha, importance weights scale the delta")
    priority_alpha: float = _f(0.6, "prioritized replay: priority exponent alpha (0 = uniform)", min=0.0, max=1.0)
    priority_beta: float = _f(0.4, "prioritized replay: importance-sampling exponent beta at learn_start, annealed "
                              "linearly to 1", min=0.0, max=1.0)
    priority_beta_endt: int = _f(0, "prioritized replay: beta reaches 1 this many agent steps after learn_start (0 = at "
                                 "the last step of the run, so a resume with a new 'steps' changes the schedule) "
                                 "[agent steps]", min=0)
    priority_eps: float = _f(1e-6, "prioritized replay: added to |clipped delta| so that no transition gets priority 0",
                             min=0.0)
    random_opponent: float = _f(0.0, "self-play against random players: at each episode start of an env copy, with this "
                                "probability one seat, drawn uniformly, acts uniformly at random for the whole episode (its "
                                "transitions are stored like any others; episodes.csv marks it in 'random_seat'); 0 = "
                                "every seat acts with the networks, as in DQN3.0", min=0.0, max=1.0)
    pool_every: int = _f(0, "opponent pool for self-play (madqn.training.pool): copy the networks' weights into the pool "
                         "every pool_every agent steps (0 = no pool) [agent steps]", min=0)
    pool_size: int = _f(10, "opponent pool: snapshots kept (the oldest is dropped)", min=1)
    pool_prob: float = _f(0.5, "opponent pool: at each episode start of an env copy, with this probability one seat, "
                          "drawn uniformly, is played by a snapshot for the whole episode (greedy up to eval_ep; its "
                          "transitions are stored like any others; episodes.csv names it in 'snapshot_step')",
                          min=0.0, max=1.0)
    pool_sampling: str = _f("uniform", "opponent pool: which snapshot plays: 'uniform', or 'pfsp' (prioritized "
                            "fictitious self-play: weight (1 - p)^2, p = the networks' points per game against it)",
                            choices=("uniform", "pfsp"))
    precision: str = _f("fp32", "learner arithmetic: 'fp32' (DQN3.0), 'bf16' (autocast forwards and backward; weights, targets and optimizer stay fp32), 'auto' (bf16 where the CPU/GPU supports it natively)",
                        choices=("fp32", "bf16", "auto"))
    compile: bool = _f(False, "compile the learner's update with torch.compile: the forwards, DQN3.0's targets and the "
                       "injected backward as one graph, the optimizer as one fused kernel (the same maths up to float "
                       "rounding; tens of seconds of compiling at the start, needs a C++ compiler on CPU); false runs it "
                       "eagerly, op by op")
    cuda_graph: bool = _f(False, "CUDA only: capture the learner's whole update (both forwards, DQN3.0's targets, the "
                          "injected backward, the optimizer step) in a CUDA graph and replay it per update: one launch "
                          "instead of hundreds (the batch-32 update is launch-bound on a GPU); the same maths as the "
                          "eager update up to float rounding")
    replay_device: str = _f("host", "where the learner gathers minibatch frames: 'host' (the replay memory's, copied to "
                            "the learner's device per batch) or 'learner' (a copy of the replay frames kept on the "
                            "learner's device, gathered there: no frame copy per batch on a GPU; the same batches)",
                            choices=("host", "learner"))

    # --- evaluation, logging, checkpoints ---------------------------------------------------
    eval_freq: int = _f(250_000, "evaluate every eval_freq agent steps (0 = never during training) [agent steps]", min=0)
    eval_steps: int = _f(125_000, "length of one evaluation [agent steps]", min=1)
    eval_ep: float = _f(0.05, "epsilon during evaluation", min=0.0, max=1.0)
    eval_opponent: str = _f("random", "periodic evaluation: 'random' (each seat in turn against random others, the multiplayer-ALE protocol) or 'self' (the trained agents in every seat)",
                            choices=("random", "self"))
    final_eval_episodes: int = _f(10, "episodes of the evaluation (epsilon eval_ep, at most eval_steps agent steps) at the end of madqn.train; its mean raw scores are the run's result (0 = none)", min=0)
    final_eval_seconds: float = _f(0.0, "time limit of the final evaluation; the episode it cuts short is dropped (0 = max(60 s, 10% of the training wall time)) [s]", min=0.0)
    valid_size: int = _f(500, "held-out transitions (drawn at learn_start) for DQN3.0's V and TD-error statistics", min=0)
    prog_freq: int = _f(10_000, "a progress line and a train.csv row every prog_freq agent steps [agent steps]", min=1)
    save_freq: int = _f(125_000, "checkpoint every save_freq agent steps and at the end [agent steps]", min=1)
    save_replay: bool = _f(False, "also checkpoint the replay memory (large: ~7 KB per transition per agent)")
    video_freq: int = _f(0, "record a video of the agents playing (epsilon eval_ep) to videos/ every video_freq agent steps (0 = never) [agent steps]", min=0)
    video_length: int = _f(2_000, "longest video episode (madqn video's default --max-steps too) [agent steps]", min=1)

    def __post_init__(self) -> None:
        self.validate()

    # ----------------------------------------------------------------------------------------
    def validate(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            want = hints[f.name]
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                setattr(self, f.name, value)
            if want is list:
                ok = isinstance(value, list)
            elif want is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, want)
            if not ok:
                raise ConfigError(f"config key '{f.name}' must be {_type_name(want)}, got {value!r}")
            meta = f.metadata
            if "choices" in meta and value not in meta["choices"]:
                raise ConfigError(f"config key '{f.name}' must be one of {', '.join(meta['choices'])}; got {value!r}")
            if "min" in meta and value < meta["min"]:
                raise ConfigError(f"config key '{f.name}' must be >= {meta['min']}, got {value!r}")
            if "max" in meta and value > meta["max"]:
                raise ConfigError(f"config key '{f.name}' must be <= {meta['max']}, got {value!r}")
        if self.rmsprop_eps <= 0:
            raise ConfigError(f"config key 'rmsprop_eps' must be > 0, got {self.rmsprop_eps!r}")
        if self.rmsprop_decay >= 1:
            raise ConfigError(f"config key 'rmsprop_decay' must be < 1, got {self.rmsprop_decay!r}")
        if self.min_reward > self.max_reward:
            raise ConfigError(f"config key 'min_reward' ({self.min_reward}) must be <= 'max_reward' ({self.max_reward})")
        if self.replay_memory < self.hist_len + self.minibatch_size:
            raise ConfigError(
                f"config key 'replay_memory' ({self.replay_memory}) must be at least hist_len + minibatch_size "
                f"({self.hist_len + self.minibatch_size})")
        if not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in self.mlp_hidden):
            raise ConfigError(f"config key 'mlp_hidden' must be a list of positive integers, got {self.mlp_hidden!r}")
        if self.dueling and not self.mlp_hidden and self.network != "conv":
            raise ConfigError("config key 'dueling' needs at least one hidden layer in 'mlp_hidden' (the MLP's last "
                              "hidden layer becomes the V and A streams)")
        if self.prioritized and self.priority_eps <= 0:
            raise ConfigError(f"config key 'priority_eps' must be > 0 with prioritized replay, got {self.priority_eps!r}")
        if self.pool_every > 0 and self.random_opponent + self.pool_prob > 1:
            raise ConfigError(f"config keys 'random_opponent' ({self.random_opponent}) and 'pool_prob' "
                              f"({self.pool_prob}) are chances of one episode start and must add up to at most 1")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"config key 'device' must be auto, cpu, cuda or cuda:N; got {self.device!r}")

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The fully resolved config as TOML, each key preceded by its one-line doc."""
        lines = ["# madqn resolved config: every key, with its meaning and units"]
        for f in fields(self):
            lines.append(f"# {f.metadata['doc']}")
            lines.append(f"{f.name} = {_toml_value(getattr(self, f.name))}")
        return "\n".join(lines) + "\n"


# ---- loading -----------------------------------------------------------------------------------

FIELD_NAMES = tuple(f.name for f in fields(Config))


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}.get(t, str(t))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, int):
        return f"{v:_}" if abs(v) >= 10_000 else str(v)
    return repr(v)


def _check_keys(d: dict[str, Any], where: str) -> None:
    for key in d:
        if key not in FIELD_NAMES:
            close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown config key '{key}' in {where}{hint}")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a config file into a dict of known keys (not yet validated as a whole)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text file (not valid UTF-8)") from None
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    nested = [k for k, v in d.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"config file {p}: tables are not supported ([{nested[0]}]); write keys at top level")
    _check_keys(d, str(p))
    return d


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values use TOML syntax, bare words are strings."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like key=value")
        key, raw = (s.strip() for s in item.split("=", 1))
        _check_keys({key: None}, "--set")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key] = value
    return out


def make_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults <- config file <- overrides, validated."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update(load_toml(path))
    if overrides:
        _check_keys(overrides, "overrides")
        values.update(overrides)
    try:
        return Config(**values)
    except TypeError as e:  # pragma: no cover - keys are checked above
        raise ConfigError(str(e)) from None
