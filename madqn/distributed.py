"""Distributed acting (``backend = "ray"``): actor processes feed one DQN3.0 learner, Ape-X style.

Two sides, one small interface:

- :class:`Actor` holds ``num_envs`` env copies, a CPU copy of the Q-networks and one slot (recent
  history, pending transition) per agent seat. It IS the in-process ``Trainer``'s acting code:
  ``Trainer.env_step``, ``act``, ``_step_env`` ... run unchanged, with learning switched off and
  the replay memory replaced by a :class:`ReplayRecorder`. ``rollout(n, step, weights)`` steps
  ``n`` agent steps and returns a :class:`Rollout`: replay entries ``(group, stream, frame,
  action, reward, terminal, episode_end, mask)`` exactly as the Trainer would have stored them
  (one uint8 frame each, never stacked) and the finished episodes.
- :class:`DistributedTrainer` is the learner (networks, optimizers, one replay stream per
  (actor, env copy, agent), target sync, the usual hooks). It counts agent steps from the
  batches it RECEIVES (a batch lost with its actor is never counted), runs DQN3.0's learning
  rounds on that count (``update_ratio = "fixed"``: ``n_replay`` updates per ``update_freq``
  steps) and publishes the online weights every ``sync_every`` rounds.

Pools drive the actors: :class:`InlinePool` in this process (tests, reference) and
:class:`RayPool` as Ray actors (``max_restarts=-1``: a killed actor is restarted by Ray; its
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
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from madqn.config import Config
from madqn.env import action_starts, observation_specs
from madqn.errors import MadqnError
from madqn.networks import build_q_network
from madqn.runner import EpisodeRecord, Group, Hook, Trainer, learning_rounds, resolve_device

Entry = tuple  # (group, stream, frame, action, reward, terminal, episode_end, mask)


def apex_epsilons(n_actors: int, eps: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X per-actor epsilons: ``eps ** (1 + i * alpha / (N - 1))`` for i = 0..N-1 (one actor: ``eps``)."""
    if n_actors == 1:
        return [float(eps)]
    return [float(eps) ** (1.0 + i * alpha / (n_actors - 1)) for i in range(n_actors)]


class ReplayRecorder:
    """Stands in for an actor-side ReplayMemory: records ``add`` calls as replay entries."""

    def __init__(self, group: int):
        self.group = group
        self.entries: list[Entry] = []

    def add(self, stream: int, frame: np.ndarray, action: int, reward: float, terminal: bool, episode_end: bool,
            action_mask: Any = None) -> None:
        mask = None if action_mask is None else np.asarray(action_mask, bool)
        self.entries.append((self.group, int(stream), np.array(frame, copy=True), int(action), float(reward),
                             bool(terminal), bool(episode_end), mask))


@dataclass
class _ActingLearner:
    """What acting needs from a learner: the online network, and r_max (the Trainer updates it on store)."""

    online_network: torch.nn.Module
    r_max: float = 1.0


class _EpisodeCollector(Hook):
    def __init__(self) -> None:
        self.records: list[EpisodeRecord] = []

    def on_episode(self, trainer: Any, record: EpisodeRecord) -> None:
        self.records.append(record)


@dataclass
class Rollout:
    """One actor batch: ``steps`` agent steps, their replay entries, the episodes that ended."""

    actor: int
    steps: int
    entries: list[Entry]
    episodes: list[EpisodeRecord]
    incarnation: str = ""  # random id of the actor object: a new one means Ray rebuilt the actor


def actor_config(config: Config, index: int, reseed: int = 0) -> Config:
    """Actor ``index``'s config: inline envs on CPU, no learning, its own seed (actor 0 keeps the run's seed,
    so with one actor its transitions are the in-process Trainer's); ``reseed`` after a restart."""
    return config.replace(seed=config.seed + 100_000 * index + reseed, device="cpu", vector_env="inline",
                          overlap=False, target_q=0, num_threads=0)


class Actor(Trainer):
    """Env copies + CPU Q-networks + per-seat slots; produces replay entries (see the module docstring).

    Reuses ``Trainer``'s acting methods unchanged: ``learn_from`` is infinite and ``target_q`` is 0,
    so ``env_step`` never learns, and each group's ``replay`` is a :class:`ReplayRecorder`.
    """

    def __init__(self, config_dict: dict[str, Any], index: int = 0, env: Any = None, reseed: int = 0):
        self.run_config = Config(**config_dict)
        self.index = index
        self.collector = _EpisodeCollector()
        super().__init__(actor_config(self.run_config, index, reseed), env, hooks=[self.collector])
        self.learn_from = sys.maxsize
        c = self.run_config
        self.fixed_epsilon = apex_epsilons(c.actors, c.apex_eps, c.apex_alpha)[index] \
            if c.actor_epsilons == "apex" else None
        self.weights_version = -1
        self.incarnation = os.urandom(8).hex()

    def _build_groups(self, env: Any) -> list[Group]:
        """Networks built as the Trainer builds them (same torch RNG draws); recorders for replay."""
        c = self.config
        groups = []
        agent_sets = [("shared", self.agents)] if c.sharing == "shared" else [(a, [a]) for a in self.agents]
        for k, (name, agents) in enumerate(agent_sets):
            obs_space = env.observation_space(agents[0])
            n_actions = int(env.action_space(agents[0]).n)
            n_indicator = len(self.agents) if (c.sharing == "shared" and c.agent_indicator) else 0
            network = build_q_network(tuple(obs_space.shape), n_actions, c.hist_len, n_indicator,
                                      kind=c.network, hidden=tuple(c.mlp_hidden),
                                      dueling=c.dueling).requires_grad_(False)
            self.rng.integers(2**31)  # the Trainer seeds each replay memory here: keep the acting RNG in step
            ids = np.array([self.agents.index(a) for a in agents for _ in range(c.num_envs)], dtype=np.int64)
            groups.append(Group(name, list(agents), _ActingLearner(network), ReplayRecorder(k), n_actions, ids))
        return groups

    def epsilon(self) -> float:
        return super().epsilon() if self.fixed_epsilon is None else self.fixed_epsilon

    def set_weights(self, version: int, state_dicts: list[dict[str, torch.Tensor]]) -> None:
        for g, sd in zip(self.groups, state_dicts):
            g.learner.online_network.load_state_dict(sd)  # copies in place: stacked acting views stay bound
        self.weights_version = version

    def rollout(self, n_steps: int, global_step: int, weights: tuple[int, list] | None = None) -> Rollout:
        """Step at least ``n_steps`` agent steps; epsilon counts from ``max(own count, global_step)``."""
        if weights is not None and weights[0] > self.weights_version:
            self.set_weights(*weights)
        self.step = max(self.step, int(global_step))
        for g in self.groups:
            g.replay.entries = []
        self.collector.records = []
        start = self.step
        while self.step - start < n_steps:
            self.env_step()
        entries = [e for g in self.groups for e in g.replay.entries]
        return Rollout(self.index, self.step - start, entries, self.collector.records, self.incarnation)


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

    def submit(self, actor: int, n_steps: int, global_step: int, weights: Any) -> None:
        self.calls.append((actor, (n_steps, global_step, weights)))

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
                root = str(Path(__file__).resolve().parents[1])
                path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
                ray.init(num_cpus=max(config.actors, os.cpu_count() or 1), include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
            self.started = True
        remote = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=-1)(RayActorProcess)
        self.handles = [remote.remote(config.to_dict(), i, env_spec) for i in range(config.actors)]
        self.pending: dict[Any, int] = {}  # object ref -> actor

    def submit(self, actor: int, n_steps: int, global_step: int, weights: Any) -> None:
        ref = self.handles[actor].rollout.remote(n_steps, global_step, weights)
        self.pending[ref] = actor

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


class RayActorProcess:
    """The Ray actor: an :class:`Actor` built inside the actor process (reseeded when Ray rebuilds it)."""

    def __init__(self, config_dict: dict[str, Any], index: int, env_spec: str):
        import ray

        torch.set_num_threads(1)
        reseed = 0
        if ray.get_runtime_context().was_current_actor_reconstructed:
            reseed = int(np.random.default_rng().integers(1, 2**20)) * 1000  # fresh episodes, not a replay of old ones
        self.actor = Actor(config_dict, index, env_spec, reseed)

    def rollout(self, n_steps: int, global_step: int, weights: Any) -> Rollout:
        import ray

        if weights[0] > self.actor.weights_version:  # fetch only a newer version (a rebuilt actor has none)
            weights = (weights[0], ray.get(weights[1]))
        return self.actor.rollout(n_steps, global_step, weights)

    def pid(self) -> int:
        return os.getpid()


class DistributedTrainer(Trainer):
    """The learner of a distributed run: ``Trainer``'s groups, ``learn`` and hooks, fed by an actor pool.

    Holds no envs itself (``envs``, ``slots`` are empty: checkpoints carry networks, optimizers,
    counters and RNGs; a resumed run's actors start fresh episodes). ``pool``: ``"ray"`` or
    ``"inline"`` (actors in this process, for tests).
    """

    def __init__(self, config: Config, env: Any = None, hooks: Iterable[Hook] = (), pool: str = "ray"):
        if config.overlap:
            raise MadqnError("backend = 'ray' learns in this process while the actors act: overlap must be false")
        if config.video_freq:
            raise MadqnError("backend = 'ray' does not record training videos (video_freq = 0); "
                             "record them afterwards with: madqn video RUN_DIR")
        self.config = config
        self.hooks = list(hooks)
        self.device = resolve_device(config.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.env_spec = config.env if env is None else env
        self.pool = InlinePool(config, env) if pool == "inline" else RayPool(config, self.env_spec)
        probe = self._probe_env()
        self.agents = list(probe.possible_agents)
        self.observation_specs = observation_specs(probe, config)  # raw observation -> network input (checkpoints)
        self.action_starts = action_starts(probe)
        self.has_masks = self._probe_masks
        self.step = 0
        self.episodes = 0
        self.learn_from = config.learn_start
        self.start_time = time.time()
        per_actor = self.config.num_envs
        self.config = config.replace(num_envs=per_actor * config.actors)  # replay streams for every actor's copies
        self.groups = self._build_groups(probe)
        self.config = config
        self.group_of = {a: g for g in self.groups for a in g.agents}
        self.group_index = {a: k for k, g in enumerate(self.groups) for a in g.agents}
        self.streams_per_actor = [len(g.agents) * per_actor for g in self.groups]
        # stream order inside a group: agent-major over all copies (Trainer); actor a's local stream s of
        # agent k maps to agent k's block, copy a * num_envs + (s % num_envs)
        self.envs, self.slots, self.observations, self.infos = [], {}, [], []
        self.held: dict[tuple[int, int], Entry] = {}  # newest entry per stream, added when its successor arrives
        self.stop_requested = False
        self.failed = False
        self.background = None
        self.weights_version = 0
        self.rounds_since_sync = 0
        self._published: tuple[int, Any] | None = None
        self.incarnations: dict[int, str] = {}  # actor -> id of the actor object its last batch came from
        self.actor_restarts = 0
        self.lost_batches = 0
        if hasattr(probe, "close") and probe is not getattr(self.pool, "actors", [None])[0]:
            probe.close()

    def _probe_env(self) -> Any:
        """The spaces and agent names, read from one env built here (inline pool: its first actor)."""
        if isinstance(self.pool, InlinePool):
            actor = self.pool.actors[0]
            self._probe_masks = actor.has_masks
            return actor.envs[0]
        from madqn.env import make_env

        env = make_env(self.env_spec, self.config, seed=self.config.seed)
        _, infos = env.reset()
        self._probe_masks = any("action_mask" in info for info in infos.values())
        return env

    def global_stream(self, group: int, actor: int, local: int) -> int:
        n = self.config.num_envs
        agent_block, copy = divmod(local, n)
        return agent_block * n * self.config.actors + actor * n + copy

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        c = self.config
        for h in self.hooks:
            h.on_start(self)
        try:
            for _ in range(c.max_in_flight):
                for a in range(c.actors):
                    self.pool.submit(a, c.rollout_len, self.step, self._current_weights())
            while self.step < c.steps and not self.stop_requested:
                result = self.pool.next(timeout=0 if self._may_float() else None)
                if result is None:
                    if not self._may_float():
                        raise MadqnError("no actor has a batch outstanding (internal error)")
                    self._learn_rounds(1)  # float ratio: no batch waiting, the learner keeps going
                    continue
                if isinstance(result, ActorLost):  # out of restarts, or no task retries on this cluster
                    self._close_streams(result.actor, f"was lost ({result.reason})")
                    self.pool.submit(result.actor, c.rollout_len, self.step, self._current_weights())
                    continue
                prev = self.step
                self._ingest(result)
                self.step = prev + result.steps
                if c.update_ratio == "fixed" and self.learn_from < self.step:
                    self._learn_rounds(learning_rounds(prev, self.step, self.learn_from, c.update_freq), prev)
                self.pool.submit(result.actor, c.rollout_len, self.step, self._current_weights())
                for h in self.hooks:
                    h.on_step(self)
        except BaseException:
            self.failed = True
            raise
        finally:
            for h in self.hooks:
                h.on_end(self)

    def _may_float(self) -> bool:
        return self.config.update_ratio == "float" and self.learn_from < self.step

    def _learn_rounds(self, rounds: int, prev: int | None = None) -> None:
        """``rounds`` DQN3.0 learning rounds (n_replay updates per learner), target sync on ``target_q``
        crossings (or, floating, every target_q / update_freq rounds), weights published every sync_every."""
        c = self.config
        for _ in range(rounds):
            for _ in range(c.n_replay):
                self.learn(self.step)
            self.rounds_since_sync += 1
            if c.update_ratio == "float" and c.target_q > 0:
                g0 = self.groups[0]
                if (g0.updates // c.n_replay) % max(1, c.target_q // c.update_freq) == 0:
                    for g in self.groups:
                        g.learner.sync_target()
        if c.update_ratio == "fixed" and prev is not None and c.target_q > 0 and \
                self.step // c.target_q > prev // c.target_q:
            for g in self.groups:
                g.learner.sync_target()
        if self.rounds_since_sync >= c.sync_every:
            self.rounds_since_sync = 0
            self.weights_version += 1
            self._published = None

    def _current_weights(self) -> tuple[int, list]:
        if getattr(self, "_published", None) is None or self._published[0] != self.weights_version:
            weights = [{k: v.detach().to("cpu", copy=True) for k, v in g.learner.online_network.state_dict().items()}
                       for g in self.groups]
            payload = (self.weights_version, weights)
            if isinstance(self.pool, RayPool):
                payload = (self.weights_version, self.pool.ray.put(weights))  # one copy in the object store
            self._published = payload
        return self._published

    def _ingest(self, batch: Rollout) -> None:
        known = self.incarnations.get(batch.actor)
        if known is not None and known != batch.incarnation:  # Ray rebuilt the actor; its lost batch never came
            self._close_streams(batch.actor, "was restarted by Ray")
        self.incarnations[batch.actor] = batch.incarnation
        for group, local, frame, action, reward, terminal, episode_end, mask in batch.entries:
            g = self.groups[group]
            stream = self.global_stream(group, batch.actor, local)
            entry = (frame, action, reward, terminal, episode_end, mask)
            g.learner.r_max = max(g.learner.r_max, reward)  # DQN3.0: running max of the clipped reward
            held = self.held.pop((group, stream), None)
            if held is not None:
                self._add(g, stream, *held)
            if episode_end:
                self._add(g, stream, *entry)
            else:
                self.held[(group, stream)] = entry
        for r in batch.episodes:
            self.episodes += 1
            record = EpisodeRecord(self.step + batch.steps, self.episodes, batch.actor * self.config.num_envs
                                   + r.env_index, r.scores, r.lengths, r.truncated)
            for h in self.hooks:
                h.on_episode(self, record)

    def _add(self, g: Group, stream: int, frame, action, reward, terminal, episode_end, mask) -> None:
        g.replay.add(stream, frame, action, reward, terminal, episode_end, **self._mask_kw(mask))

    def _close_streams(self, actor: int, what: str) -> None:
        """An actor process died: end its open episodes in replay at their last received frame (truncated),
        as the Trainer does for an env copy reset mid-episode. Its unfinished batch was never received, so
        never counted; the new actor fetches the current weights with its first call."""
        self.actor_restarts += 1
        for group, stream in list(self.held):
            if self._stream_actor(group, stream) == actor:
                frame, _, _, _, _, mask = self.held.pop((group, stream))
                self._add(self.groups[group], stream, frame, 0, 0.0, False, True, mask)
        print(f"madqn: actor {actor} {what} before step {self.step}; its unfinished batch is dropped "
              f"(not counted), its episodes end in replay, training continues", file=sys.stderr, flush=True)

    def _stream_actor(self, group: int, stream: int) -> int:
        n = self.config.num_envs
        return (stream % (n * self.config.actors)) // n

    def close(self) -> None:
        self.pool.close()
