"""Distributed acting (``backend = "process"`` and ``"ray"``): actor processes feed one DQN3.0 learner, Ape-X
style.

Two sides, one small interface:

- :class:`Actor` is an acting loop (madqn.training.acting, the in-process trainer's own) over
  ``num_envs`` env copies with CPU copies of the online networks, feeding a ``RecordingSink``.
  ``rollout(n, step, weights)`` steps ``n`` agent steps and returns a :class:`Rollout`: the replay
  entries (``Entry``: agent, copy, frame, action, reward, terminal, episode_end, mask) the loop emitted
  (one uint8 frame each, never stacked) and the finished episodes.
- :class:`DistributedTrainer` is the learner set (madqn.training.learners: networks, optimizers, one
  replay stream per (agent, actor, env copy), the learning schedule, target sync) with the usual
  hooks, fed through an :class:`ActorFeed`. It counts agent steps from the batches it RECEIVES (a batch
  lost with its actor is never counted), runs DQN3.0's learning rounds on that count
  (``update_ratio = "fixed"``) and publishes the online weights every ``sync_every`` rounds.

Pools drive the actors: :class:`InlinePool` in this process (tests, reference), :class:`ProcessPool` as
worker processes of this machine (started again when they die) and :class:`RayPool` as Ray actors (``max_restarts=-1``: a killed actor is restarted by Ray; its
unfinished batch is dropped, the episodes it was in are closed in replay as truncated, and it
gets the current weights with its next call). Each actor has at most ``max_in_flight`` batches
outstanding and gets a new call only after the learner consumed one (back-pressure).

Replay: an entry is added to its stream when its successor arrives (or it is a final frame), so
if an actor dies the learner can end each open episode at its last received frame, as the
Trainer does for an env copy reset mid-episode, and no frames of two episodes are stacked.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from madqn.config import Config
from madqn.core.rng import generator_state, set_generator_state
from madqn.envs.adapters import action_starts, make_env, observation_specs
from madqn.envs.vecenv import make_envs, worker_context
from madqn.errors import MadqnError
from madqn.training.acting import ActingLoop, Entry, EpisodeRecord, RecordingSink
from madqn.training.learners import LearnerSet, group_members, q_network_for, replay_seeds_and_acting_rng
from madqn.training.pool import OpponentPool
from madqn.training.trainer import (MEASURE, Hook, TrainerBase, refuse_beyond_memory, resolve_device, resolve_threads,
                                    usable_cores)


# an actor lost this many times in a row, without a batch in between, is taken for dead
MAX_LOST_IN_A_ROW = 3


def apex_epsilons(n_actors: int, eps: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X per-actor epsilons: ``eps ** (1 + i * alpha / (N - 1))`` for i = 0..N-1 (one actor: ``eps``)."""
    if n_actors == 1:
        return [float(eps)]
    return [float(eps) ** (1.0 + i * alpha / (n_actors - 1)) for i in range(n_actors)]


@dataclass
class Rollout:
    """One actor batch: ``steps`` agent steps, their replay entries, the episodes that ended."""

    actor: int
    steps: int
    entries: list[Entry]
    episodes: list[EpisodeRecord]
    incarnation: str = ""  # random id of the actor object: a new one means Ray rebuilt the actor
    epsilon: float = float("nan")  # what the actor acts with at the batch's last step
    snapshots: tuple[int, ...] = ()  # the opponent-pool snapshots (their steps) the actor holds after the batch


def actor_config(config: Config, index: int, reseed: int = 0) -> Config:
    """Actor ``index``'s config: inline envs on CPU, its own seed (actor 0 keeps the run's seed, so with one
    actor its transitions are the in-process Trainer's); ``reseed`` after a restart."""
    return config.replace(seed=config.seed + 100_000 * index + reseed, device="cpu", vector_env="inline",
                          overlap=False)


class Actor:
    """An acting loop over ``num_envs`` env copies with CPU Q-networks, recording its replay entries."""

    def __init__(self, config_dict: dict[str, Any], index: int = 0, env: Any = None, reseed: int = 0):
        run_config = Config(**config_dict)
        c = actor_config(run_config, index, reseed)
        self.index = index
        envs = make_envs(c.env if env is None else env, c)
        first = envs[0]
        agents = list(first.possible_agents)
        members = group_members(c, agents)
        self.networks = [q_network_for(c, first.observation_space(group[0]).shape,
                                       int(first.action_space(group[0]).n), len(agents)).requires_grad_(False)
                         for _, group in members]
        _, rng = replay_seeds_and_acting_rng(c.seed, len(members))  # the in-process trainer's acting generator
        fixed = apex_epsilons(c.actors, c.apex_eps, c.apex_alpha)[index] if c.actor_epsilons == "apex" else None
        self.sink = RecordingSink()
        self.acting = ActingLoop(c, envs, self.networks, self.sink, rng, torch.device("cpu"), fixed_epsilon=fixed,
                                 own_snapshots=False)  # the learner's opponent pool sends them
        self.weights_version = -1
        self.incarnation = os.urandom(8).hex()

    def epsilon(self) -> float:
        return self.acting.epsilon()

    def set_weights(self, version: int, state_dicts: list[dict[str, torch.Tensor]]) -> None:
        for network, sd in zip(self.networks, state_dicts):
            network.load_state_dict(sd)  # copies in place: stacked acting views stay bound
        self.weights_version = version

    def rollout(self, n_steps: int, global_step: int, weights: tuple[int, list] | None = None,
                opponents: dict[str, Any] | None = None) -> Rollout:
        """Step at least ``n_steps`` agent steps; epsilon counts from ``max(own count, global_step)``.
        ``opponents``: the learner's opponent pool as :meth:`OpponentPool.changes` gives it."""
        if weights is not None and weights[0] > self.weights_version:
            self.set_weights(*weights)
        pool = self.acting.pool
        if pool is not None and opponents is not None:
            pool.apply(opponents)
        self.acting.step = max(self.acting.step, int(global_step))
        start = self.acting.step
        while self.acting.step - start < n_steps:
            self.acting.step_envs()
        entries, episodes = self.sink.take()
        return Rollout(self.index, self.acting.step - start, entries, episodes, self.incarnation, self.epsilon(),
                       pool.steps() if pool is not None else ())

    def close(self) -> None:
        self.acting.close()


@dataclass
class ActorLost:
    """A pool's answer when an actor died with batches outstanding (they are dropped, never counted)."""

    actor: int
    reason: str


class InlinePool:
    """Actors driven one call at a time in this process (no Ray): the reference the Ray pool matches."""

    def __init__(self, config: Config, env: Any = None):
        self.actors = [Actor(config.to_dict(), i, env) for i in range(config.actors)]
        self.calls: list[tuple[int, tuple]] = []

    def submit(self, actor: int, n_steps: int, global_step: int, weights: Any, opponents: Any = None) -> None:
        self.calls.append((actor, (n_steps, global_step, weights, opponents)))

    def in_flight(self, actor: int) -> int:
        """Batches ``actor`` has outstanding."""
        return sum(a == actor for a, _ in self.calls)

    def next(self, timeout: float | None = None) -> Rollout | ActorLost | None:
        if not self.calls:
            return None
        actor, args = self.calls.pop(0)
        return self.actors[actor].rollout(*args)

    def close(self) -> None:
        for a in self.actors:
            a.close()


class RayPool:
    """Actors as Ray actors (``max_restarts=-1``); results in completion order."""

    task_retries = -1  # Ray's max_task_retries: calls outstanding when an actor dies are run again after its restart

    def __init__(self, config: Config, env_spec: Any):
        try:
            import ray
        except ImportError:
            raise MadqnError("backend = 'ray' needs Ray: pip install 'madqn[ray]'") from None

        if not isinstance(env_spec, str):
            raise MadqnError("backend = 'ray' needs the env as a spec string (an Atari name, 'package.module:callable' "
                             "or 'file.py:callable') that every actor process can build")
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if config.ray_address:
                ray.init(address=config.ray_address, log_to_driver=False)
            else:  # a local instance; workers import this checkout of madqn
                root = str(Path(__file__).resolve().parents[2])
                path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
                ray.init(num_cpus=max(config.actors, os.cpu_count() or 1), include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
            self.started = True
        remote = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=self.task_retries)(RayActorProcess)
        self.handles = [remote.remote(config.to_dict(), i, env_spec) for i in range(config.actors)]
        self.pending: dict[Any, int] = {}  # object ref -> actor

    def submit(self, actor: int, n_steps: int, global_step: int, weights: Any, opponents: Any = None) -> None:
        ref = self.handles[actor].rollout.remote(n_steps, global_step, weights, opponents)
        self.pending[ref] = actor

    def in_flight(self, actor: int) -> int:
        """Batches ``actor`` has outstanding."""
        return sum(a == actor for a in self.pending.values())

    def next(self, timeout: float | None = None) -> Rollout | ActorLost | None:
        if not self.pending:
            return None
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        if not ready:
            return None
        actor = self.pending.pop(ready[0])
        try:
            return self.ray.get(ready[0])
        except self.ray.exceptions.RayActorError as e:
            for ref in [r for r, a in self.pending.items() if a == actor]:  # its other calls fail too
                del self.pending[ref]
            return ActorLost(actor, type(e).__name__)
        except self.ray.exceptions.RayTaskError as e:  # the actor's code raised: a bug or a bad env, not a crash
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise MadqnError(f"actor {actor} failed: {type(cause).__name__}: {str(cause).strip().splitlines()[-1]}") \
                from None

    def pids(self) -> list[int]:
        return self.ray.get([h.pid.remote() for h in self.handles])

    def close(self) -> None:
        for h in self.handles:
            try:
                self.ray.kill(h, no_restart=True)
            except Exception:
                pass
        self.handles = []
        if self.started:
            self.ray.shutdown()


# memory one actor process holds [bytes]: a pong_v3 actor (torch, the emulator, one env copy, the network) held
# 233-241 MB resident beside a running learner (2-core Intel Xeon, 2026-12-06), with a margin
ACTOR_MEMORY = 256_000_000


def check_actor_processes(actors: int, cores: int | None = None, available: Any = MEASURE) -> str | None:
    """Before the first actor process starts: refuse (``MadqnError``, one line) ``actors`` processes that would
    not fit in the memory available now (``ACTOR_MEMORY`` each, :func:`refuse_beyond_memory`), and return a
    warning line where the actors alone outnumber the cores, else None. ``cores`` and ``available`` (bytes,
    None: unknown) are measured unless given (tests)."""
    cores = usable_cores() if cores is None else cores
    refuse_beyond_memory("actors", actors, "actor", ACTOR_MEMORY, available)
    if actors > cores:
        return (f"madqn: warning: {actors} actor processes and the learner on {cores} cores take turns on them; "
                f"actors = {max(1, cores - 1)} leaves the learner a core of its own")
    return None


class ProcessPool:
    """Actors in worker processes of this machine (``backend = "process"``): the Ray design without Ray.

    Each actor is an :class:`Actor` in its own process (forkserver, one torch thread), driven through a
    pipe; the learner runs in this process, so acting and learning use separate cores and never wait for
    each other's Python (one process's threads would share one interpreter lock). Weights travel with a
    call only when they are newer than what that actor has. A dead actor process is started again with a
    new seed and its outstanding calls are sent again (as Ray retries them): their batches come from the
    new actor, whose first batch makes the feed end the old episodes. An actor that dies ``max_restarts``
    times, or whose code raises, stops the run with one line.
    """

    max_restarts = 5

    def __init__(self, config: Config, env_spec: Any):
        if not isinstance(env_spec, str):
            raise MadqnError("backend = 'process' needs the env as a spec string (an Atari name, "
                             "'package.module:callable' or 'file.py:callable') that an actor process can build")
        warning = check_actor_processes(config.actors)
        if warning:
            print(warning, file=sys.stderr)
        self.config = config
        self.env_spec = env_spec
        self.ctx = worker_context()
        self.calls: list[list[tuple]] = [[] for _ in range(config.actors)]  # outstanding calls per actor
        self.sent_version = [-1] * config.actors  # newest weights each actor process has been sent
        self.restarts = [0] * config.actors
        self.latest_weights: Any = None
        self.workers: list[tuple[Any, Any]] = []
        try:
            for i in range(config.actors):
                self.workers.append(self._start(i, 0))
            for i in range(config.actors):
                self._expect_ready(i)
        except BaseException:
            self.close()
            raise

    def _start(self, index: int, reseed: int) -> tuple[Any, Any]:
        conn, child = self.ctx.Pipe()
        process = self.ctx.Process(target=_actor_process, args=(child, self.config.to_dict(), index, self.env_spec,
                                                                reseed), name=f"madqn-actor-{index}", daemon=True)
        process.start()
        child.close()
        return process, conn

    def _expect_ready(self, index: int) -> None:
        try:
            kind, payload = self.workers[index][1].recv()
        except (EOFError, OSError):
            raise MadqnError(f"actor {index} died while starting (exit code {self.workers[index][0].exitcode})") \
                from None
        if kind == "error":
            raise MadqnError(f"actor {index} failed to start: {payload}")

    def submit(self, actor: int, n_steps: int, global_step: int, weights: Any, opponents: Any = None) -> None:
        self.latest_weights = weights
        self.calls[actor].append((n_steps, global_step, opponents))
        self._send(actor, n_steps, global_step, opponents)

    def _send(self, actor: int, n_steps: int, global_step: int, opponents: Any = None) -> None:
        weights = self.latest_weights
        if weights is not None and weights[0] > self.sent_version[actor]:
            self.sent_version[actor] = weights[0]
        else:
            weights = None
        try:
            self.workers[actor][1].send(("rollout", (n_steps, global_step, weights, opponents)))
        except (BrokenPipeError, OSError):
            pass  # it died: next() sees the closed pipe and restarts it

    def next(self, timeout: float | None = None) -> Rollout | None:
        busy = {self.workers[a][1]: a for a in range(len(self.workers)) if self.calls[a]}
        if not busy:
            return None
        ready = wait(list(busy), timeout)
        if not ready:
            return None
        actor = busy[ready[0]]
        try:
            kind, payload = ready[0].recv()
        except (EOFError, OSError):
            self._restart(actor)
            return self.next(timeout)
        if kind == "error":
            raise MadqnError(f"actor {actor} failed: {payload}")
        self.calls[actor].pop(0)
        return payload

    def _restart(self, actor: int) -> None:
        """Start a dead actor's process again (a new seed: fresh episodes) and send its outstanding calls again."""
        process, conn = self.workers[actor]
        process.join(timeout=5)
        conn.close()
        self.restarts[actor] += 1
        if self.restarts[actor] > self.max_restarts:
            raise MadqnError(f"actor {actor} died {self.restarts[actor]} times (last exit code {process.exitcode}); "
                             "the run stops, its last checkpoint is intact")
        print(f"madqn: actor {actor} died (exit code {process.exitcode}); starting it again", file=sys.stderr,
              flush=True)
        reseed = int(np.random.default_rng().integers(1, 2**20)) * 1000
        self.workers[actor] = self._start(actor, reseed)
        self._expect_ready(actor)
        self.sent_version[actor] = -1
        for n_steps, global_step, opponents in self.calls[actor]:
            self._send(actor, n_steps, global_step, opponents)

    def in_flight(self, actor: int) -> int:
        """Batches ``actor`` has outstanding."""
        return len(self.calls[actor])

    def pids(self) -> list[int]:
        return [p.pid for p, _ in self.workers]

    def close(self) -> None:
        for actor, (process, conn) in enumerate(self.workers):
            try:  # take the answers still coming (an actor blocks on a full pipe), then ask it to stop
                while self.calls[actor] and conn.poll(10):
                    conn.recv()
                    self.calls[actor].pop(0)
                conn.send(("close", None))
            except (EOFError, BrokenPipeError, OSError):
                pass
        for process, conn in self.workers:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()
        self.workers = []


def _actor_process(conn: Any, config_dict: dict[str, Any], index: int, env_spec: str, reseed: int) -> None:
    """An actor process's main loop: build the :class:`Actor`, answer rollout calls until 'close'."""
    try:
        import cv2

        cv2.setNumThreads(1)
        torch.set_num_threads(1)  # one core per actor: the learner has its own
        actor = Actor(config_dict, index, env_spec, reseed)
        conn.send(("ready", None))
        while True:
            command, args = conn.recv()
            if command == "close":
                actor.close()
                return
            conn.send(("ok", actor.rollout(*args)))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        return
    except BaseException as e:  # a bug or a bad env: reported to the learner, which stops with one line
        try:
            message = str(e).strip()
            conn.send(("error", f"{type(e).__name__}: {message.splitlines()[-1] if message else ''}"))
        except (BrokenPipeError, OSError):
            pass


class RayActorProcess:
    """The Ray actor: an :class:`Actor` built inside the actor process (reseeded when Ray rebuilds it)."""

    def __init__(self, config_dict: dict[str, Any], index: int, env_spec: str):
        import ray

        torch.set_num_threads(1)
        reseed = 0
        if ray.get_runtime_context().was_current_actor_reconstructed:
            reseed = int(np.random.default_rng().integers(1, 2**20)) * 1000  # fresh episodes, not a replay of old ones
        self.actor = Actor(config_dict, index, env_spec, reseed)

    def rollout(self, n_steps: int, global_step: int, weights: Any, opponents: Any = None) -> Rollout:
        import ray

        if weights[0] > self.actor.weights_version:  # fetch only a newer version (a rebuilt actor has none)
            weights = (weights[0], ray.get(weights[1]))
        return self.actor.rollout(n_steps, global_step, weights, opponents)

    def pid(self) -> int:
        return os.getpid()

    def epsilon(self) -> float:
        return self.actor.epsilon()


class ActorFeed:
    """The acting side of a Ray run as its learner sees it: actor batches into the learner set's replay.

    Actor ``a``'s env copy ``c`` is copy ``a * num_envs + c`` of the learner set. Each stream's newest
    entry is held back until its successor arrives (or it is a final frame), so when an actor is lost
    its open episodes end in replay at their last received frame (:meth:`close_streams`), as the
    in-process trainer ends an env copy reset mid-episode. A checkpoint carries the held entries; a
    resumed run's actors start fresh episodes and :meth:`close_interrupted_episodes` ends the old ones.
    """

    def __init__(self, learners: LearnerSet, num_envs: int, rng: np.random.Generator,
                 pool: OpponentPool | None = None):
        self.learners = learners
        self.pool = pool  # the run's opponent pool (config.pool_every > 0): snapshots, PFSP statistics
        self.actor_snapshots: dict[int, tuple[int, ...]] = {}  # actor -> the snapshots it reported holding
        self.num_envs = num_envs
        self.rng = rng  # seeded the replay memories; kept in checkpoints like the in-process acting generator
        self.held: dict[tuple[str, int], Entry] = {}  # (agent, copy) -> its newest entry, stored when a successor comes
        self.incarnations: dict[int, str] = {}  # actor -> id of the actor object its last batch came from
        self.epsilons: dict[int, float] = {}  # actor -> the epsilon it acted with at the end of its last batch
        self.actor_restarts = 0

    def ingest(self, batch: Rollout, step: int) -> None:
        known = self.incarnations.get(batch.actor)
        if known is not None and known != batch.incarnation:  # Ray rebuilt the actor; its lost batch never came
            self.close_streams(batch.actor, "was restarted", step)
        self.incarnations[batch.actor] = batch.incarnation
        self.epsilons[batch.actor] = batch.epsilon
        self.actor_snapshots[batch.actor] = tuple(batch.snapshots)
        if self.pool is not None:
            for r in batch.episodes:
                self.pool.record(r.scores, r.snapshot_seats, r.random_seats)
        for received in batch.entries:
            entry = received._replace(copy=batch.actor * self.num_envs + received.copy)  # the learner set's copy
            self.learners.note_reward(entry.agent, entry.reward)
            held = self.held.pop((entry.agent, entry.copy), None)
            if held is not None:
                self.learners.store(*held)
            if entry.episode_end:
                self.learners.store(*entry)
            else:
                self.held[(entry.agent, entry.copy)] = entry

    def opponents(self, actor: int) -> dict[str, Any] | None:
        """What ``actor``'s copy of the opponent pool lacks (None without a pool): the snapshots it did not
        report holding, sent again with each call until it does."""
        return None if self.pool is None else self.pool.changes(self.actor_snapshots.get(actor, ()))

    def epsilon(self) -> float:
        """The mean of the epsilons the actors acted with in their latest batches (with Ape-X epsilons the
        actors differ; each episode record carries its own actor's); NaN before the first batch."""
        return float(np.mean(list(self.epsilons.values()))) if self.epsilons else float("nan")

    def close_streams(self, actor: int, what: str, step: int) -> None:
        """An actor process died: end its open episodes in replay at their last received frame (truncated).
        Its unfinished batch was never received, so never counted; the new actor fetches the current
        weights with its first call."""
        self.actor_restarts += 1
        for agent, copy in [k for k in self.held if k[1] // self.num_envs == actor]:
            self._end_at(self.held.pop((agent, copy)))
        print(f"madqn: actor {actor} {what} before step {step}; its unfinished batch is dropped "
              f"(not counted), its episodes end in replay, training continues", file=sys.stderr, flush=True)

    def _end_at(self, entry: Entry) -> None:
        """Store ``entry``'s frame as a truncated final frame: its stream's episode ends there."""
        self.learners.store(entry.agent, entry.copy, entry.frame, 0, 0.0, False, True, entry.mask)

    def state_dict(self) -> dict[str, Any]:
        """The generator, the held entries and the opponent pool; no env or slot state (the actors' episodes
        are not resumed)."""
        return {"rng": generator_state(self.rng), "held": [{"agent": e.agent, "copy": e.copy, "frame": e.frame,
                                                            "mask": e.mask} for e in self.held.values()],
                **({"pool": self.pool.state_dict()} if self.pool is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Returns False: a resumed run's actors start fresh episodes (their pools come with their first calls)."""
        set_generator_state(self.rng, state["rng"])
        if self.pool is not None and "pool" in state:
            self.pool.load_state_dict(state["pool"])
        return False

    def close_interrupted_episodes(self, state: dict[str, Any]) -> None:
        """After the replay memory is restored: end each stream's interrupted episode at its held entry."""
        for h in state.get("held", []):
            self._end_at(Entry(h["agent"], int(h["copy"]), h["frame"], 0, 0.0, False, True, h["mask"]))


class DistributedTrainer(TrainerBase):
    """The learner of a distributed run: a learner set and the usual hooks, fed by a pool of actors.

    ``pool``: ``"ray"``, ``"process"`` (actor processes on this machine) or ``"inline"`` (actors in this
    process, for tests). Checkpoints carry networks,
    optimizers, counters, generators and the held replay entries; a resumed run's actors start fresh
    episodes.
    """

    def __init__(self, config: Config, env: Any = None, hooks: Iterable[Hook] = (), pool: str = "ray"):
        backend = "process" if pool == "process" else "ray"
        if config.overlap:
            raise MadqnError(f"backend = '{backend}' learns in this process while the actors act: overlap must be false")
        if config.video_freq:
            raise MadqnError(f"backend = '{backend}' does not record training videos (video_freq = 0); "
                             "record them afterwards with: madqn video RUN_DIR")
        self.config = config
        self.hooks = list(hooks)
        self.device = resolve_device(config.device)
        if pool == "process":  # the actors' cores are on this machine: torch gets the others
            self.torch_threads, self.threads_reason = resolve_threads(config.num_threads, config.actors)
            torch.set_num_threads(self.torch_threads)
        elif config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.env_spec = config.env if env is None else env
        pools = {"inline": lambda: InlinePool(config, env), "process": lambda: ProcessPool(config, self.env_spec)}
        self.pool = pools.get(pool, lambda: RayPool(config, self.env_spec))()
        try:
            self._build(config)
        except BaseException:  # e.g. a replay too large: the actors (and a Ray instance started here) must go
            self.pool.close()
            raise

    def _build(self, config: Config) -> None:
        """Everything after the actor pool exists: spaces, the learner set, the feed."""
        probe, has_masks = self._probe_env()
        self.agents = list(probe.possible_agents)
        self.observation_specs = observation_specs(probe, config)  # raw observation -> network input (checkpoints)
        self.action_starts = action_starts(probe)
        torch.manual_seed(config.seed)  # the learners start as the in-process trainer's do
        replay_seeds, rng = replay_seeds_and_acting_rng(config.seed, len(group_members(config, self.agents)))
        try:
            self.learners = LearnerSet(config, probe, config.num_envs * config.actors, has_masks, replay_seeds,
                                       self.device)
        except BaseException:
            if not isinstance(self.pool, InlinePool):
                probe.close()
            raise
        pool = OpponentPool(config.pool_every, config.pool_size, config.pool_sampling) if config.pool_every else None
        self.acting = ActorFeed(self.learners, config.num_envs, rng, pool)
        self.step = 0
        self.episodes = 0
        self.start_time = time.time()
        self.weights_version = 0
        self.rounds_since_sync = 0
        self._published: tuple[int, Any] | None = None
        if not isinstance(self.pool, InlinePool):
            probe.close()

    def _probe_env(self) -> tuple[Any, bool]:
        """An env built here for the spaces and agent names (inline pool: its first actor's), and whether
        its observations come with action masks."""
        if isinstance(self.pool, InlinePool):
            acting = self.pool.actors[0].acting
            return acting.envs[0], any("action_mask" in info for infos in acting.infos for info in infos.values())
        env = make_env(self.env_spec, self.config, seed=self.config.seed)
        _, infos = env.reset()
        return env, any("action_mask" in info for info in infos.values())

    # ---- the loop ---------------------------------------------------------------------------
    def _fill(self, actor: int) -> None:
        """Give ``actor`` batches to play until it has ``max_in_flight`` outstanding."""
        for _ in range(self.config.max_in_flight - self.pool.in_flight(actor)):
            self._submit(actor)

    def _submit(self, actor: int) -> None:
        """One rollout call: the current weights (when newer than the actor's) and the opponent pool."""
        self.pool.submit(actor, self.config.rollout_len, self.step, self._current_weights(),
                         self.acting.opponents(actor))

    def _loop(self) -> None:
        c = self.config
        for _ in range(c.max_in_flight):
            for a in range(c.actors):
                self._submit(a)
        lost_in_a_row = [0] * c.actors  # ActorLost answers per actor since its last delivered batch
        while self.step < c.steps and not self.stop_requested:
            result = self.pool.next(timeout=0 if self._may_float() else None)
            if result is None:
                if not self._may_float():
                    raise MadqnError("no actor has a batch outstanding (internal error)")
                self._floating_round()  # no batch waiting: the learner keeps going
                continue
            if isinstance(result, ActorLost):  # out of restarts, or no task retries on this cluster
                lost_in_a_row[result.actor] += 1
                if lost_in_a_row[result.actor] >= MAX_LOST_IN_A_ROW:  # dead for good: calls fail at once
                    raise MadqnError(f"actor {result.actor} was lost {lost_in_a_row[result.actor]} times in a row "
                                     f"without delivering a batch ({result.reason}); stopping the run (the last "
                                     f"checkpoint is intact: --resume continues it)")
                self.acting.close_streams(result.actor, f"was lost ({result.reason})", self.step)
                self._fill(result.actor)  # all its outstanding batches were dropped
                continue
            lost_in_a_row[result.actor] = 0
            prev = self.step
            self._ingest(result)
            self.step = prev + result.steps
            opponents = self.acting.pool
            if opponents is not None and opponents.due(prev, self.step):  # a snapshot of the learner's networks
                opponents.add(self.step, self.learners.online_networks)
            if c.update_ratio == "fixed":
                n_updates, sync_target = self.learners.due(prev, self.step)
                self.learners.run_round(n_updates, self.step, sync_target)
                self._rounds_done(n_updates // c.n_replay)
            self._submit(result.actor)
            for h in self.hooks:
                h.on_step(self)

    def _may_float(self) -> bool:
        return self.config.update_ratio == "float" and self.learners.learn_from < self.step

    def _floating_round(self) -> None:
        """``update_ratio = "float"``: one round (n_replay updates per learner) whenever no batch waits; the
        target syncs every ``target_q / update_freq`` rounds."""
        c = self.config
        rounds = self.groups[0].updates // c.n_replay + 1
        sync_target = c.target_q > 0 and rounds % max(1, c.target_q // c.update_freq) == 0
        self.learners.run_round(c.n_replay, self.step, sync_target)
        self._rounds_done(1)

    def _rounds_done(self, rounds: int) -> None:
        """Publish the online weights to the actors every ``sync_every`` learning rounds."""
        self.rounds_since_sync += rounds
        if self.rounds_since_sync >= self.config.sync_every:
            self.rounds_since_sync = 0
            self.weights_version += 1
            self._published = None

    def _current_weights(self) -> tuple[int, list]:
        if self._published is None or self._published[0] != self.weights_version:
            weights = [{k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
                       for net in self.learners.online_networks]
            payload = (self.weights_version, weights)
            if isinstance(self.pool, RayPool):
                payload = (self.weights_version, self.pool.ray.put(weights))  # one copy in the object store
            self._published = payload
        return self._published

    def _ingest(self, batch: Rollout) -> None:
        self.acting.ingest(batch, self.step)
        for r in batch.episodes:
            self.episodes += 1
            record = EpisodeRecord(self.step + batch.steps, self.episodes, batch.actor * self.config.num_envs
                                   + r.env_index, r.scores, r.lengths, r.truncated, r.epsilon, r.random_seats,
                                   r.snapshot_seats)
            for h in self.hooks:
                h.on_episode(self, record)

    def close(self) -> None:
        self.pool.close()
