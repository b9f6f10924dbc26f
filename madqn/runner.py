"""The training loop: env -> actor -> replay -> learner, with hooks for logging, evaluation, checkpoints.

One *slot* is one agent seat in one env copy: it owns a recent history, a replay stream and the
transition waiting for its successor. A *learner* (online/target network and optimizer) serves
one agent (``sharing = "independent"``) or all of them (``"shared"``, fed by every agent's replay
streams, told which agent it plays by the agent indicator). Steps count agent steps (see
``madqn.config``); learning rounds and target syncs follow DQN3.0's ``perceive``.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from madqn.actor import RecentHistory, epsilon_greedy, linear_epsilon
from madqn.config import Config
from madqn.env import action_starts, is_pettingzoo_env, observation_specs
from madqn.errors import MadqnError
from madqn.learner import Learner
from madqn.networks import build_q_network
from madqn.overlap import BackgroundLearner
from madqn.policy import ActingNetworks
from madqn.prioritized import annealed_beta
from madqn.replay import ReplayMemory, available_memory, replay_nbytes, stream_capacity
from madqn.vecenv import make_envs, use_processes

SHARED = "shared"
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
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    default = TORCH_DEFAULT_THREADS if default is None else default
    for_envs = max(env_workers, 1)
    threads = max(1, min(cores - for_envs, default))
    return threads, f"auto: {cores} cores, {for_envs} for the envs"


@dataclass
class Slot:
    """One agent seat in one env copy."""

    env_index: int
    agent: str
    stream: int  # stream index inside its learner's replay memory
    agent_id: int  # index of the agent in possible_agents (the agent indicator)
    history: RecentHistory
    pending: tuple[np.ndarray, int, Any] | None = None  # (frame, action, legal mask) awaiting reward and successor
    reward: float = 0.0  # clipped reward accumulated for the pending transition
    score: float = 0.0  # raw (unclipped) score of the current episode
    length: int = 0  # agent steps in the current episode


@dataclass
class EpisodeRecord:
    step: int
    episode: int
    env_index: int
    scores: dict[str, float]
    lengths: dict[str, int]
    truncated: bool


@dataclass
class Group:
    """A learner and the agents (slots) it serves."""

    name: str
    agents: list[str]
    learner: Learner
    replay: ReplayMemory
    n_actions: int
    stream_agent_ids: np.ndarray  # (n_streams,) agent id per replay stream
    updates: int = 0
    stats: list[dict[str, torch.Tensor]] = field(default_factory=list)


class Hook:
    """Override what you need; the trainer calls these in order of registration."""

    def on_start(self, trainer: "Trainer") -> None: ...
    def on_step(self, trainer: "Trainer") -> None: ...
    def on_episode(self, trainer: "Trainer", record: EpisodeRecord) -> None: ...
    def on_end(self, trainer: "Trainer") -> None: ...
    def on_scalars(self, trainer: "Trainer", step: int, scalars: dict[str, float]) -> None: ...


def learning_rounds(prev: int, step: int, learn_from: int, update_freq: int) -> int:
    """DQN3.0 perceive: a learning round at every step > learn_from that is a multiple of update_freq;
    how many such steps lie in (prev, step] (several when one call advances several agent steps)."""
    if step <= learn_from:
        return 0
    return step // update_freq - max(prev, learn_from) // update_freq


def starts_round(moves: int, all_moves: list[int]) -> bool:
    """Turn-based envs: a seat that has made ``moves`` moves this episode starts a new round of turns by
    moving now when no seat has moved more often (``all_moves``: every seat's count, its own included)."""
    return moves >= max(all_moves)


def clip_reward(r: float, lo: float, hi: float) -> float:
    return min(max(float(r), lo), hi)


class Trainer:
    """Wires envs, actor, replay and learners for one run; ``run()`` trains ``config.steps`` agent steps."""

    def __init__(self, config: Config, env: Any = None, hooks: Iterable[Hook] = ()):
        self.config = config
        self.hooks = list(hooks)
        self.device = resolve_device(config.device)
        env_spec = config.env if env is None else env
        workers = config.num_envs if use_processes(env_spec, config) else 0
        self.torch_threads, self.threads_reason = resolve_threads(config.num_threads, workers)
        torch.set_num_threads(self.torch_threads)
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        if config.num_envs > 1 and is_pettingzoo_env(env_spec):
            raise MadqnError("num_envs > 1 needs an env spec or a factory (one env per copy), not an env instance")
        self.env_spec = env_spec  # what make_env built the envs from (hooks may build more copies)
        self.envs = make_envs(env_spec, config)  # worker processes or inline copies (madqn.vecenv)
        self.turn_based = [bool(getattr(env, "turn_based", False)) for env in self.envs]  # AEC: counter counts rounds
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        self.observation_specs = observation_specs(first, config)  # raw observation -> network input (checkpoints)
        self.action_starts = action_starts(first)  # each agent's Discrete.start
        self.step = 0
        self.episodes = 0
        self.learn_from = config.learn_start  # learning rounds run once step > learn_from (later after a resume without replay)
        self.start_time = time.time()
        started = [env.reset() for env in self.envs]
        self.has_masks = any("action_mask" in info for _, infos in started for info in infos.values())
        self.groups = self._build_groups(first)
        self.group_of = {a: g for g in self.groups for a in g.agents}
        self.group_index = {a: k for k, g in enumerate(self.groups) for a in g.agents}
        self.policy = ActingNetworks([g.learner.online_network for g in self.groups], self.device,
                                     snapshot=config.overlap)
        self.slots: dict[tuple[int, str], Slot] = {}
        for g in self.groups:
            for stream, (i, a) in enumerate((i, a) for a in g.agents for i in range(config.num_envs)):
                space = first.observation_space(a)
                self.slots[(i, a)] = Slot(i, a, stream, self.agents.index(a),
                                          RecentHistory(config.hist_len, space.shape, space.dtype))
        self.observations: list[dict[str, np.ndarray]] = [{} for _ in self.envs]
        self.infos: list[dict[str, Any]] = [{} for _ in self.envs]
        for i, (obs, infos) in enumerate(started):
            self._begin_episode(i, obs, infos)
        self.stop_requested = False  # set by hooks or signal handlers: stop after the current step
        self.failed = False  # run() ended by an exception: the state may be mid-step, checkpoints must not save it
        self.background = BackgroundLearner(self) if config.overlap else None  # madqn.overlap

    # ---- construction -----------------------------------------------------------------------
    def _build_groups(self, env: Any) -> list[Group]:
        c = self.config
        if c.sharing == SHARED:
            check_shared_spaces(env)
            members = [(SHARED, self.agents)]
        else:
            members = [(a, [a]) for a in self.agents]
        capacity = replay_capacity(c, env, [agents for _, agents in members], self.has_masks)
        groups = []
        for name, agents in members:
            obs_space = env.observation_space(agents[0])
            n_actions = int(env.action_space(agents[0]).n)
            n_indicator = len(self.agents) if (c.sharing == SHARED and c.agent_indicator) else 0
            network = build_q_network(tuple(obs_space.shape), n_actions, c.hist_len, n_indicator,
                                      kind=c.network, hidden=tuple(c.mlp_hidden), dueling=c.dueling).to(self.device)
            learner = Learner(network, lr=c.lr, lr_end=c.lr_end, lr_endt=c.lr_endt, learn_start=c.learn_start,
                              discount=c.discount, clip_delta=c.clip_delta, rescale_r=c.rescale_r, r_max=1.0,
                              weight_cost=c.wc, device=self.device, decay=c.rmsprop_decay, eps=c.rmsprop_eps,
                              use_target=c.target_q > 0, optimizer=c.optimizer, adam_eps=c.adam_eps,
                              double=c.double, precision=c.precision)
            replay = ReplayMemory(capacity, tuple(obs_space.shape), c.hist_len,
                                  n_streams=len(agents) * c.num_envs, frame_dtype=obs_space.dtype,
                                  n_actions=n_actions, store_action_masks=self.has_masks,
                                  seed=int(self.rng.integers(2**31)), n_step=c.n_step, discount=c.discount,
                                  prioritized=c.prioritized, priority_alpha=c.priority_alpha,
                                  priority_eps=c.priority_eps)
            ids = np.array([self.agents.index(a) for a in agents for _ in range(c.num_envs)], dtype=np.int64)
            groups.append(Group(name, list(agents), learner, replay, n_actions, ids))
        return groups

    # ---- the loop ---------------------------------------------------------------------------
    def epsilon(self) -> float:
        c = self.config
        return linear_epsilon(self.step, ep_start=c.ep_start, ep_end=c.ep_end, ep_endt=c.ep_endt,
                              learn_start=c.learn_start)

    def run(self) -> None:
        for h in self.hooks:
            h.on_start(self)
        try:
            self.policy.refresh()  # overlap mode: act with the weights as they are now (e.g. restored)
            while self.step < self.config.steps and not self.stop_requested:
                prev = self.step
                self.env_step()
                if self.background is not None and self._hooks_due(prev):
                    self.background.drain()  # hooks that log or checkpoint see settled learners
                for h in self.hooks:
                    h.on_step(self)
            if self.background is not None:
                self.background.drain()
        except BaseException:
            self.failed = True
            raise
        finally:
            for h in self.hooks:
                h.on_end(self)

    def env_step(self) -> None:
        """One step of every env copy in DQN3.0 ``perceive`` order: act, learn, then the emulators advance.

        Worker envs receive their joint actions before the learning round and emulate while it runs;
        inline envs step after it. Either way the learning round samples the replay as it was
        before this step's transitions, and the result is the same.
        """
        c = self.config
        acting = [self.slots[(i, a)] for i, obs in enumerate(self.observations) for a in obs
                  if a in self.envs[i].agents]
        actions = self.act(acting, self.epsilon())
        per_env: list[dict[str, int]] = [{} for _ in self.envs]
        for slot, action in zip(acting, actions):
            mask = self.infos[slot.env_index].get(slot.agent, {}).get("action_mask")
            slot.pending = (self.observations[slot.env_index][slot.agent], int(action), mask)
            slot.reward = 0.0
            per_env[slot.env_index][slot.agent] = int(action)
        stepping = [i for i, env in enumerate(self.envs) if per_env[i] or env.agents]
        for i in stepping:
            if hasattr(self.envs[i], "step_async"):
                self.envs[i].step_async(per_env[i])
        prev, step = self.step, self.step + sum(self._agent_steps(i, per_env[i]) for i in range(len(self.envs)))
        # learn_from: learn_start, or later after a resume without replay
        n_updates = learning_rounds(prev, step, self.learn_from, c.update_freq) * c.n_replay
        sync_target = c.target_q > 0 and step // c.target_q > prev // c.target_q
        if self.background is not None:
            self.background.submit(n_updates, step, sync_target)
        else:
            for _ in range(n_updates):
                self.learn(step)
            if sync_target:
                for g in self.groups:
                    g.learner.sync_target()
        with self.background.replay_lock if self.background is not None else nullcontext():
            for i in stepping:
                self._step_env(i, per_env[i])
        self.step = step

    def _agent_steps(self, i: int, actions: dict[str, int]) -> int:
        """What this step of env copy ``i`` adds to the counter (madqn.config): 1 in a parallel env; in a
        turn-based env 1 when the move starts a round of turns, so that a full round counts as one step."""
        if not self.turn_based[i]:
            return 1
        moves = [self.slots[(i, a)].length for a in self.agents]
        return int(any(starts_round(self.slots[(i, a)].length, moves) for a in actions))

    def _hooks_due(self, prev: int) -> bool:
        """Whether this step crossed a multiple of prog_freq, save_freq or eval_freq (where hooks act)."""
        c = self.config
        return any(k > 0 and self.step // k > prev // k for k in (c.prog_freq, c.save_freq, c.eval_freq))

    def log_scalars(self, scalars: dict[str, float], step: int | None = None) -> None:
        """Publish named scalars (TensorBoard-style tags, e.g. ``td_error/first_0``) to every hook's ``on_scalars``."""
        step = self.step if step is None else int(step)
        for h in self.hooks:
            h.on_scalars(self, step, scalars)

    def act(self, slots: list[Slot], epsilon: float) -> np.ndarray:
        """Epsilon-greedy actions for ``slots``: the greedy rows of all agents in one batched forward.

        Shared network: one forward with agent ids. Independent networks of one architecture: one
        vmapped forward over their stacked parameters (madqn.policy). Learners whose states cannot
        be stacked together (different action counts, observation shapes or dtypes) are served one
        after another.
        """
        actions = np.zeros(len(slots), dtype=np.int64)
        if not slots:
            return actions
        groups = np.array([self.group_index[s.agent] for s in slots], dtype=np.int64)
        ids = np.array([s.agent_id for s in slots], dtype=np.int64)
        kinds = {(self.group_of[s.agent].n_actions, s.history.frames.shape, s.history.frames.dtype)
                 for s in self.slots.values()}
        parts = [np.arange(len(slots))] if len(kinds) == 1 else \
            [np.flatnonzero(groups == k) for k in range(len(self.groups))]
        for rows in parts:
            if not len(rows):
                continue
            members = [slots[k] for k in rows]

            def q_fn(sel: np.ndarray, members=members, rows=rows) -> np.ndarray:
                states = np.stack([members[k].history.state() for k in sel])
                return self.policy.q_values(states, groups[rows[sel]], ids[rows[sel]])

            n = self.groups[groups[rows[0]]].n_actions
            actions[rows] = epsilon_greedy(q_fn, len(members), epsilon, self.rng, n, self._masks(members, n))
        return actions

    def _masks(self, slots: list[Slot], n_actions: int) -> np.ndarray | None:
        masks = [self.infos[s.env_index].get(s.agent, {}).get("action_mask") for s in slots]
        if all(m is None for m in masks):
            return None
        return np.stack([np.ones(n_actions, bool) if m is None else np.asarray(m, bool) for m in masks])

    def _step_env(self, i: int, actions: dict[str, int]) -> None:
        c = self.config
        env = self.envs[i]
        obs, rewards, terms, truncs, infos = env.step_wait() if hasattr(env, "step_async") else env.step(actions)
        for agent, r in rewards.items():
            slot = self.slots[(i, agent)]
            slot.score += float(r)
            if slot.pending is not None:
                slot.reward += clip_reward(r, c.min_reward, c.max_reward)
        for agent in actions:
            self.slots[(i, agent)].length += 1
        next_obs: dict[str, np.ndarray] = {}
        for agent, o in obs.items():
            slot = self.slots[(i, agent)]
            done = bool(terms.get(agent, False) or truncs.get(agent, False))
            life_lost = bool(infos.get(agent, {}).get("life_lost", False)) and c.terminal_on_life_loss
            if slot.pending is not None:
                self._store(slot)
            if done or life_lost:
                # the final frame closes the episode (for learning) in this stream
                g = self.group_of[agent]
                g.replay.add(slot.stream, o, 0, 0.0, bool(terms.get(agent, False)) or life_lost, True,
                             **self._mask_kw(infos.get(agent, {}).get("action_mask")))
                slot.history.reset()
            if not done:
                slot.history.push(o)
                next_obs[agent] = o
        self.observations[i] = next_obs
        self.infos[i] = infos
        if not env.agents:
            self._end_episode(i, truncated=any(truncs.values()))
            self._reset_env(i)

    def _mask_kw(self, mask: Any) -> dict:
        return {"action_mask": mask} if self.has_masks else {}

    def _store(self, slot: Slot) -> None:
        frame, action, mask = slot.pending
        g = self.group_of[slot.agent]
        g.learner.r_max = max(g.learner.r_max, slot.reward)  # DQN3.0: running max of the clipped reward
        g.replay.add(slot.stream, frame, action, slot.reward, False, False, **self._mask_kw(mask))
        slot.pending = None
        slot.reward = 0.0

    def _end_episode(self, i: int, truncated: bool) -> None:
        slots = [self.slots[(i, a)] for a in self.agents]
        self.episodes += 1
        record = EpisodeRecord(self.step, self.episodes, i, {s.agent: s.score for s in slots},
                               {s.agent: s.length for s in slots}, truncated)
        for h in self.hooks:
            h.on_episode(self, record)

    def _reset_env(self, i: int) -> None:
        for a in self.agents:
            slot = self.slots[(i, a)]
            if slot.pending is not None:  # an agent the env never finished: close its stream's episode
                g = self.group_of[a]
                g.replay.add(slot.stream, slot.pending[0], 0, 0.0, False, True, **self._mask_kw(slot.pending[2]))
                slot.pending = None
        self._begin_episode(i, *self.envs[i].reset())

    def _begin_episode(self, i: int, obs: dict[str, np.ndarray], infos: dict[str, Any]) -> None:
        for a in self.agents:
            slot = self.slots[(i, a)]
            slot.history.reset()
            slot.score, slot.length, slot.reward = 0.0, 0, 0.0
        for a, o in obs.items():
            self.slots[(i, a)].history.push(o)
        self.observations[i] = dict(obs)
        self.infos[i] = infos

    def learn(self, step: int | None = None, replay_lock: Any = None) -> None:
        """One minibatch update of every learner whose replay can give one (``step``: the agent step for
        the lr schedule; ``replay_lock``: held while sampling, in overlap mode). With a small
        ``learn_start`` the first rounds find no complete transition yet and wait, as DQN3.0 learns
        only from a table that can be sampled."""
        c = self.config
        step = self.step if step is None else step
        beta = annealed_beta(step, beta_start=c.priority_beta, learn_start=c.learn_start,
                             anneal_steps=c.priority_beta_endt or c.steps - c.learn_start)
        for g in self.groups:
            with replay_lock if replay_lock is not None else nullcontext():
                if not g.replay.can_sample():
                    continue
                batch = g.replay.sample(c.minibatch_size, beta=beta)
            to = self._to_device
            states, next_states = self._state_stacks(batch)
            stats = g.learner.update(
                states, to(batch.actions), to(batch.rewards), next_states,
                to(batch.terminals), agent_ids=to(g.stream_agent_ids[batch.streams]),
                next_action_masks=None if batch.next_action_masks is None else to(batch.next_action_masks),
                step=step, discounts=None if batch.discounts is None else to(batch.discounts),
                weights=None if batch.weights is None else to(batch.weights))
            delta = stats.pop("delta")
            if g.replay.tree is not None:  # prioritized replay: the new |clipped delta| of each sampled transition
                deltas = delta.float().cpu().numpy()
                with replay_lock if replay_lock is not None else nullcontext():
                    g.replay.update_priorities(batch.streams, batch.indices, deltas)
            g.updates += 1
            g.stats.append(stats)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        """A minibatch array as a device tensor (no copy on CPU); frames stay uint8 until the network.

        On CUDA the copy goes through pinned (page-locked) memory and does not block the host; the
        caching host allocator keeps the pinned block until the copy has finished.
        """
        t = torch.from_numpy(array)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _state_stacks(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, s2) tensors; when the replay returned them as views of one (B, h+1, ...) array, that
        array crosses to the device once and s, s2 are its two overlapping slices."""
        whole = batch.states.base
        h = batch.states.shape[1]
        if (isinstance(whole, np.ndarray) and whole.shape == (batch.states.shape[0], h + 1, *batch.states.shape[2:])
                and batch.next_states.base is whole):
            t = self._to_device(whole)
            return t[:, :h], t[:, 1:]
        return self._to_device(batch.states), self._to_device(batch.next_states)

    def close(self) -> None:
        if self.background is not None:
            self.background.close()
        for env in self.envs:
            env.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def replay_capacity(config: Config, env: Any, members: list[list[str]], masks: bool) -> int:
    """Entries per replay stream: each agent's ``replay_memory`` split over its ``num_envs`` env copies
    (the Ray learner's num_envs counts every actor's copies). Refuses, before anything is allocated,
    a split too small to sample from and replays (one per learner serving ``members``) that once
    full would not fit in the memory available now: they fill lazily, so the run would die hours in."""
    c = config
    capacity = stream_capacity(c.replay_memory, c.num_envs)
    if capacity < c.hist_len + c.minibatch_size:
        raise MadqnError(f"replay_memory = {c.replay_memory} split over {c.num_envs} env copies leaves {capacity} "
                         f"entries per copy; each needs at least hist_len + minibatch_size "
                         f"({c.hist_len + c.minibatch_size}): raise replay_memory")
    need = sum(replay_nbytes(capacity, len(agents) * c.num_envs, env.observation_space(agents[0]).shape,
                             env.observation_space(agents[0]).dtype, n_actions=int(env.action_space(agents[0]).n),
                             store_action_masks=masks, prioritized=c.prioritized) for agents in members)
    available = available_memory()
    if available is not None and need > available:
        raise MadqnError(f"the replay memory needs {need / 1e9:.2f} GB when full, but only {available / 1e9:.2f} GB "
                         f"of memory is available: lower replay_memory (now {c.replay_memory} transitions per agent)")
    return capacity


def check_shared_spaces(env: Any) -> None:
    """A shared network needs every agent to have the same observation and action spaces."""
    agents = list(env.possible_agents)
    ref = agents[0]
    for a in agents[1:]:
        o0, o1 = env.observation_space(ref), env.observation_space(a)
        a0, a1 = env.action_space(ref), env.action_space(a)
        if o0.shape != o1.shape or o0.dtype != o1.dtype:
            raise MadqnError(f"sharing = shared needs equal observation spaces, but {ref} has {o0} and {a} has {o1}; "
                             "use --sharing independent")
        if a0 != a1:
            raise MadqnError(f"sharing = shared needs equal action spaces, but {ref} has {a0} and {a} has {a1}; "
                             "use --sharing independent")


def default_run_dir(config: Config) -> Path:
    env = config.env.replace("/", "_").replace(":", "_").replace(".py", "")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{env}-{config.sharing}-s{config.seed}-{stamp}"
