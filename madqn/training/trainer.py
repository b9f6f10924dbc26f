"""The in-process trainer: an acting loop (madqn.training.acting) feeding a learner set
(madqn.training.learners), with hooks.

Data path: env copies -> acting loop -> sink -> replay -> learner set. The :class:`Trainer` is the
acting loop's sink (transitions into replay, episode records to the hooks) and runs the learner
set's rounds between acting and emulating, in DQN3.0's ``perceive`` order. :class:`Hook` is how
logging, evaluation, checkpoints and videos attach; :class:`TrainerBase` is what they see of a run,
in-process or on Ray (madqn.training.distributed). Steps count agent steps (see ``madqn.config``).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from madqn.training.acting import ActingLoop, EpisodeRecord  # EpisodeRecord: what Hook.on_episode receives
from madqn.config import Config
from madqn.envs.adapters import action_starts, is_pettingzoo_env, observation_specs
from madqn.errors import MadqnError
from madqn.training.learners import Group, LearnerSet, group_members, replay_seeds_and_acting_rng
from madqn.training.overlap import BackgroundLearner
from madqn.envs.vecenv import WORKER_MEMORY, WORKERS_PER_CORE, make_envs, use_processes
from madqn.core.replay import available_memory

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice (physical cores), before anything changes it


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MadqnError(f"device '{name}' requested but CUDA is not available (use --device cpu or auto)")
    return torch.device(name)


def resolve_threads(num_threads: int, env_workers: int = 0, cores: int | None = None,
                    default: int | None = None) -> tuple[int, str]:
    """Torch CPU threads for ``num_threads`` (0 = choose), and why, for the run's first line.

    Chosen: the cores left once the envs have theirs (one per env worker process, or one for
    emulating inline in this process), at least 1 and at most torch's default (the physical cores):
    1 on a 2-core machine, where a second torch thread competes with the emulator and runs several
    times slower. ``cores`` (default: the CPUs this process may use) and ``default`` are for tests.
    """
    if num_threads > 0:
        return num_threads, "num_threads"
    if cores is None:
        cores = usable_cores()
    default = TORCH_DEFAULT_THREADS if default is None else default
    for_envs = max(env_workers, 1)
    threads = max(1, min(cores - for_envs, default))
    return threads, f"auto: {cores} cores, {for_envs} for the envs"


def usable_cores() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


MEASURE = object()  # "measure it now": the default of the checks' available-memory argument


def refuse_beyond_memory(key: str, count: int, kind: str, per_process: int, available: Any = MEASURE) -> None:
    """Refuse (``MadqnError``, one line naming config key ``key``) ``count`` ``kind`` processes of ``per_process``
    bytes each that would not fit in the memory available now (``available`` bytes, None: unknown, no refusal;
    measured unless given), before the first one starts: the kernel would kill the run midway."""
    available = available_memory() if available is MEASURE else available
    need = count * per_process
    if available is not None and need > available:
        raise MadqnError(f"{key} = {count} {kind} processes need about {need / 1e9:.1f} GB "
                         f"({per_process / 1e6:.0f} MB each), but only {available / 1e9:.2f} GB of memory is "
                         f"available: lower {key}")


def check_env_copies(workers: int, cores: int | None = None, available: Any = MEASURE) -> str | None:
    """Before the first env worker process starts: refuse (``MadqnError``, one line) ``workers`` processes that
    would not fit in the memory available now (``WORKER_MEMORY`` each; the kernel would kill the run midway),
    and return a warning line where they far exceed the cores (more than ``WORKERS_PER_CORE`` per core),
    else None. ``cores`` and ``available`` (bytes, None: unknown) are measured unless given (tests)."""
    if workers <= 0:
        return None
    cores = usable_cores() if cores is None else cores
    refuse_beyond_memory("num_envs", workers, "worker", WORKER_MEMORY, available)
    if workers > WORKERS_PER_CORE * cores:
        return (f"madqn: warning: {workers} env worker processes on {cores} cores take turns on them; "
                f"num_envs = {WORKERS_PER_CORE * cores} or fewer (at most {WORKERS_PER_CORE} per core) runs as fast")
    return None


class Hook:
    """Override what you need; the trainer calls these in order of registration."""

    def on_start(self, trainer: "TrainerBase") -> None: ...
    def on_step(self, trainer: "TrainerBase") -> None: ...
    def on_episode(self, trainer: "TrainerBase", record: EpisodeRecord) -> None: ...
    def on_end(self, trainer: "TrainerBase") -> None: ...
    def on_scalars(self, trainer: "TrainerBase", step: int, scalars: dict[str, float]) -> None: ...


class TrainerBase:
    """What hooks and checkpoints see of a run, whatever the backend: ``config``, ``agents``, ``step``,
    ``episodes``, ``learners`` (the :class:`~madqn.training.learners.LearnerSet`; ``groups`` are its groups),
    ``acting`` (the acting side's state), ``epsilon()``, ``log_scalars``, ``settle()``; ``run()`` calls
    the hooks around the backend's ``_loop``."""

    config: Config
    hooks: list[Hook]
    device: torch.device
    learners: LearnerSet
    agents: list[str]
    start_time: float
    stop_requested: bool = False  # set by hooks or signal handlers: stop after the current step
    failed: bool = False  # run() ended by an exception: the state may be mid-step, checkpoints must not save it

    @property
    def groups(self) -> list[Group]:
        return self.learners.groups

    def epsilon(self) -> float:
        """The epsilon the acting side acts with now (``acting.epsilon()``): the acting loop's (DQN3.0's
        schedule); on Ray the mean of the actors' latest (Ape-X actors each have their own)."""
        return self.acting.epsilon()

    def log_scalars(self, scalars: dict[str, float], step: int | None = None) -> None:
        """Publish named scalars (TensorBoard-style tags, e.g. ``td_error/first_0``) to every hook's ``on_scalars``."""
        step = self.step if step is None else int(step)
        for h in self.hooks:
            h.on_scalars(self, step, scalars)

    def settle(self) -> None:
        """Return once no learning round is running: the learners' weights and statistics then hold still
        until the next step (overlap mode waits for the learner thread; otherwise nothing to wait for)."""

    def run(self) -> None:
        for h in self.hooks:
            h.on_start(self)
        try:
            self._loop()
        except BaseException:
            self.failed = True
            raise
        finally:
            for h in self.hooks:
                h.on_end(self)

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "TrainerBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class Trainer(TrainerBase):
    """The in-process run: an acting loop over ``num_envs`` env copies whose transitions go straight into
    the learner set's replay, learning rounds in DQN3.0 ``perceive`` order, hooks; ``run()`` trains
    ``config.steps`` agent steps. With ``overlap = true`` the same learner set runs its rounds in a
    thread (madqn.training.overlap)."""

    _replay_lock: Any = nullcontext()

    def __init__(self, config: Config, env: Any = None, hooks: Iterable[Hook] = ()):
        self.config = config
        self.hooks = list(hooks)
        self.device = resolve_device(config.device)
        env_spec = config.env if env is None else env
        workers = config.num_envs if use_processes(env_spec, config) else 0
        self.torch_threads, self.threads_reason = resolve_threads(config.num_threads, workers)
        torch.set_num_threads(self.torch_threads)
        torch.manual_seed(config.seed)
        if config.num_envs > 1 and is_pettingzoo_env(env_spec):
            raise MadqnError("num_envs > 1 needs an env spec or a factory (one env per copy), not an env instance")
        self.env_spec = env_spec  # what make_env built the envs from (hooks may build more copies)
        warning = check_env_copies(workers)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        envs = make_envs(env_spec, config)  # worker processes or inline copies (madqn.envs.vecenv)
        try:
            self._build(config, envs)
        except BaseException:  # e.g. a replay too large: the env workers must not outlive the failed start
            for env in envs:
                env.close()
            raise

    def _build(self, config: Config, envs: list[Any]) -> None:
        """Everything after the env copies exist: spaces, resets, the learner set, the acting loop."""
        first = envs[0]
        self.agents = list(first.possible_agents)
        self.observation_specs = observation_specs(first, config)  # raw observation -> network input (checkpoints)
        self.action_starts = action_starts(first)  # each agent's Discrete.start
        self.start_time = time.time()
        started = [env.reset() for env in envs]
        has_masks = any("action_mask" in info for _, infos in started for info in infos.values())
        replay_seeds, acting_rng = replay_seeds_and_acting_rng(config.seed, len(group_members(config, self.agents)))
        self.learners = LearnerSet(config, first, config.num_envs, has_masks, replay_seeds, self.device)
        self.acting = ActingLoop(config, envs, self.learners.online_networks, self, acting_rng, self.device,
                                 started=started)
        self.background = BackgroundLearner(self.learners, self.acting.policy.refresh) if config.overlap else None
        self._precision = ExitStack()
        if self.background is not None:
            # CUDA's fp32 switches are process-wide: set once for the run, so that the acting thread's forwards
            # never run under whatever the learner thread's update has set for the moment
            self._precision.enter_context(self.groups[0].learner.device_precision())
        # held only around replay writes: the envs emulate while the learner thread samples
        self._replay_lock = self.background.replay_lock if self.background is not None else nullcontext()

    @property
    def step(self) -> int:
        return self.acting.step

    @step.setter
    def step(self, value: int) -> None:
        self.acting.step = int(value)

    @property
    def episodes(self) -> int:
        return self.acting.episodes

    @episodes.setter
    def episodes(self, value: int) -> None:
        self.acting.episodes = int(value)

    # ---- the acting loop's sink -------------------------------------------------------------------
    def add(self, agent: str, copy: int, frame: np.ndarray, action: int, reward: float, terminal: bool,
            episode_end: bool, mask: Any = None) -> None:
        """A transition from the acting loop: straight into its learner's replay stream."""
        with self._replay_lock:  # overlap mode: the learner thread samples the same memory
            self.learners.add(agent, copy, frame, action, reward, terminal, episode_end, mask)

    def episode(self, record: EpisodeRecord) -> None:
        """A finished episode from the acting loop: to every hook."""
        for h in self.hooks:
            h.on_episode(self, record)

    # ---- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        self.acting.policy.refresh()  # overlap mode: act with the weights as they are now (e.g. restored)
        while self.step < self.config.steps and not self.stop_requested:
            prev = self.step
            self.env_step()
            if self.background is not None and self._hooks_due(prev):
                self.background.drain()  # hooks that log or checkpoint see settled learners
            for h in self.hooks:
                h.on_step(self)
        self.settle()

    def env_step(self) -> None:
        """One step of every env copy in DQN3.0 ``perceive`` order: act, learn, then the emulators advance.

        Worker envs receive their joint actions before the learning round and emulate while it runs;
        inline envs step after it. Either way the learning round samples the replay as it was
        before this step's transitions, and the result is the same.
        """
        sent = self.acting.send()
        prev, step = self.step, self.step + sent.agent_steps
        n_updates, sync_target = self.learners.due(prev, step)
        if self.background is not None:
            self.background.submit(n_updates, step, sync_target)
        else:
            self.learners.run_round(n_updates, step, sync_target)
        self.acting.collect(sent)

    def _hooks_due(self, prev: int) -> bool:
        """Whether this step crossed a multiple of prog_freq, save_freq or eval_freq (where hooks act)."""
        c = self.config
        return any(k > 0 and self.step // k > prev // k for k in (c.prog_freq, c.save_freq, c.eval_freq))

    def settle(self) -> None:
        if self.background is not None:
            self.background.drain()

    def close(self) -> None:
        if self.background is not None:
            self.background.close()
        self._precision.close()
        self.acting.close()


def default_run_dir(config: Config) -> Path:
    env = config.env.replace("/", "_").replace(":", "_").replace(".py", "")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{env}-{config.sharing}-s{config.seed}-{stamp}"
