"""The acting loop: env copies -> epsilon-greedy -> transitions and episode records into a sink.

One *slot* is one agent seat in one env copy: its recent history, the transition waiting for its
reward and successor, its episode score and length. The loop owns the envs, the slots and the
epsilon-greedy randomness; it knows no learner. What it produces goes into a *sink*:

- ``sink.add(agent, copy, frame, action, reward, terminal, episode_end, mask)``: one replay entry
  (one frame, never a stack; see madqn.core.replay) of ``agent`` in env copy ``copy``, in the order a
  replay stream stores them: an entry when its reward and successor are known, a final frame with
  ``episode_end`` (its action and reward ignored);
- ``sink.episode(record)``: an :class:`EpisodeRecord` when an env copy's episode ends.

The in-process trainer's sink stores into the learner set's replay and calls the hooks; a Ray actor's
sink records what it gets (:class:`RecordingSink`) and ships it to the learner. One step
(:meth:`ActingLoop.send` then :meth:`ActingLoop.collect`) advances every env copy by one joint action;
steps count agent steps (see ``madqn.config``): one per parallel env copy, and in a turn-based env one
per round of turns (:func:`starts_round`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np
import torch

from madqn.core.actor import RecentHistory, epsilon_greedy, linear_epsilon
from madqn.config import Config
from madqn.errors import ConfigError
from madqn.training.learners import group_members
from madqn.core.policy import ActingNetworks
from madqn.core.rng import generator_state, set_generator_state
from madqn.training.pool import OpponentPool


@dataclass
class Slot:
    """One agent seat in one env copy."""

    env_index: int
    agent: str
    agent_id: int  # index of the agent in possible_agents (the agent indicator)
    history: RecentHistory
    pending: tuple[np.ndarray, int, Any] | None = None  # (frame, action, legal mask) awaiting reward and successor
    reward: float = 0.0  # clipped reward accumulated for the pending transition
    score: float = 0.0  # raw (unclipped) score of the current episode
    length: int = 0  # agent steps in the current episode
    random: bool = False  # this episode the seat acts uniformly at random (config.random_opponent)
    snapshot: int | None = None  # this episode a snapshot of the opponent pool plays the seat: its agent step
    snapshot_networks: list[torch.nn.Module] | None = field(default=None, repr=False)  # that snapshot's networks


@dataclass
class EpisodeRecord:
    step: int
    episode: int
    env_index: int
    scores: dict[str, float]
    lengths: dict[str, int]
    truncated: bool
    epsilon: float  # what the network seats acted with at the episode's last step (ActingLoop.epsilon)
    random_seats: tuple[str, ...] = ()  # seats that acted uniformly at random (config.random_opponent)
    snapshot_seats: dict[str, int] = field(default_factory=dict)  # seat -> step of the pool snapshot that played it

    def opponent_seats(self) -> set[str]:
        """Seats not played by the current networks this episode (random players, pool snapshots)."""
        return set(self.random_seats) | set(self.snapshot_seats)


class Entry(NamedTuple):
    """One replay entry as a sink receives it (``Sink.add``'s arguments; madqn.core.replay for what each
    field means): the frame of ``agent`` in env copy ``copy``, the action taken at it, the reward that
    followed, whether the frame is terminal and whether it ends its episode, its legal-action mask."""

    agent: str
    copy: int
    frame: np.ndarray
    action: int
    reward: float
    terminal: bool
    episode_end: bool
    mask: np.ndarray | None = None


class Sink(Protocol):
    def add(self, agent: str, copy: int, frame: np.ndarray, action: int, reward: float, terminal: bool,
            episode_end: bool, mask: Any = None) -> None: ...
    def episode(self, record: EpisodeRecord) -> None: ...


class RecordingSink:
    """Keeps what an acting loop emits: ``entries`` (:class:`Entry`, frames copied) and ``episodes``."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.episodes: list[EpisodeRecord] = []

    def add(self, agent: str, copy: int, frame: np.ndarray, action: int, reward: float, terminal: bool,
            episode_end: bool, mask: Any = None) -> None:
        self.entries.append(Entry(agent, int(copy), np.array(frame, copy=True), int(action), float(reward),
                                  bool(terminal), bool(episode_end), None if mask is None else np.asarray(mask, bool)))

    def episode(self, record: EpisodeRecord) -> None:
        self.episodes.append(record)

    def take(self) -> tuple[list[Entry], list[EpisodeRecord]]:
        """Everything recorded since the last call."""
        out = (self.entries, self.episodes)
        self.entries, self.episodes = [], []
        return out


@dataclass
class Sent:
    """What :meth:`ActingLoop.send` started: (env copy, joint actions) per copy to collect, and the agent
    steps the step adds to the counter."""

    stepping: list[tuple[int, dict[str, int]]]
    agent_steps: int


def clip_reward(r: float, lo: float, hi: float) -> float:
    return min(max(float(r), lo), hi)


def starts_round(moves: int, all_moves: list[int]) -> bool:
    """Turn-based envs: a seat that has made ``moves`` moves this episode starts a new round of turns by
    moving now when no seat has moved more often (``all_moves``: every seat's count, its own included)."""
    return moves >= max(all_moves)


class ActingLoop:
    """Env copies, slots and epsilon-greedy acting with the given online networks (one per learner).

    ``started``: each env's ``reset()`` result when the caller already reset them (it needed the
    infos); ``fixed_epsilon``: act with this epsilon instead of DQN3.0's schedule (Ape-X actors);
    ``own_snapshots = False``: the opponent pool's snapshots come from elsewhere (an actor process gets the
    learner's through :meth:`OpponentPool.apply`) instead of from these networks on this loop's schedule.

    With ``config.random_opponent`` > 0 an episode may start with one seat drawn to act uniformly at random
    throughout (epsilon 1 for its slot), so that the other seats also learn from games against a random player;
    with ``config.pool_every`` > 0, one played by a snapshot of the networks (madqn.training.pool).
    """

    def __init__(self, config: Config, envs: Sequence[Any], networks: Sequence[torch.nn.Module], sink: Sink,
                 rng: np.random.Generator, device: torch.device, *, started: Sequence[tuple] | None = None,
                 fixed_epsilon: float | None = None, own_snapshots: bool = True):
        self.config = config
        self.envs = list(envs)
        self.turn_based = [bool(getattr(env, "turn_based", False)) for env in self.envs]  # AEC: counter counts rounds
        self.sink = sink
        self.rng = rng
        self.fixed_epsilon = fixed_epsilon
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        if config.random_opponent > 0 and len(self.agents) < 2:
            raise ConfigError(f"config key 'random_opponent' needs at least two agents; the env has {len(self.agents)}")
        self.pool = OpponentPool(config.pool_every, config.pool_size, config.pool_sampling) \
            if config.pool_every > 0 else None
        self.own_snapshots = own_snapshots  # False in an actor process: the learner's pool sends its snapshots
        if self.pool is not None and len(self.agents) < 2:
            raise ConfigError(f"config key 'pool_every' (the opponent pool) needs at least two agents; the env has "
                              f"{len(self.agents)}")
        members = group_members(config, self.agents)
        self.group_index = {a: k for k, (_, agents) in enumerate(members) for a in agents}
        self.n_actions = [int(first.action_space(agents[0]).n) for _, agents in members]
        self.policy = ActingNetworks(networks, device, snapshot=config.overlap)
        self.step = 0  # agent steps taken (the epsilon schedule's clock)
        self.episodes = 0  # episodes finished
        self.slots: dict[tuple[int, str], Slot] = {}
        for _, agents in members:
            for a in agents:
                space = first.observation_space(a)
                for i in range(len(self.envs)):
                    self.slots[(i, a)] = Slot(i, a, self.agents.index(a),
                                              RecentHistory(config.hist_len, space.shape, space.dtype))
        self.observations: list[dict[str, np.ndarray]] = [{} for _ in self.envs]
        self.infos: list[dict[str, Any]] = [{} for _ in self.envs]
        started = [env.reset() for env in self.envs] if started is None else started
        for i, (obs, infos) in enumerate(started):
            self._begin_episode(i, obs, infos)

    # ---- one step: send, then collect ------------------------------------------------------------
    def epsilon(self) -> float:
        """The epsilon the network seats act with now: the one owner of a run's acting epsilon (DQN3.0's
        schedule at this loop's step, or the fixed one of an Ape-X actor); hooks read it through the trainer."""
        if self.fixed_epsilon is not None:
            return self.fixed_epsilon
        c = self.config
        return linear_epsilon(self.step, ep_start=c.ep_start, ep_end=c.ep_end, ep_endt=c.ep_endt,
                              learn_start=c.learn_start)

    def step_envs(self) -> None:
        """One step of every env copy (act, then the emulators advance)."""
        self.collect(self.send())

    def send(self) -> Sent:
        """Choose every live agent's action; worker env copies start emulating (``step_async``)."""
        acting = [self.slots[(i, a)] for i, obs in enumerate(self.observations) for a in obs
                  if a in self.envs[i].agents]
        actions = self.act(acting, self.epsilon())
        per_env: list[dict[str, int]] = [{} for _ in self.envs]
        for slot, action in zip(acting, actions):
            mask = self.infos[slot.env_index].get(slot.agent, {}).get("action_mask")
            slot.pending = (self.observations[slot.env_index][slot.agent], int(action), mask)
            slot.reward = 0.0
            per_env[slot.env_index][slot.agent] = int(action)
        stepping = [(i, per_env[i]) for i, env in enumerate(self.envs) if per_env[i] or env.agents]
        for i, actions_i in stepping:
            if hasattr(self.envs[i], "step_async"):
                self.envs[i].step_async(actions_i)
        return Sent(stepping, sum(self._agent_steps(i, per_env[i]) for i in range(len(self.envs))))

    def collect(self, sent: Sent) -> None:
        """The results of :meth:`send`: transitions and finished episodes into the sink; the step count advances."""
        for i, actions in sent.stepping:
            self._step_env(i, actions)
        prev, self.step = self.step, self.step + sent.agent_steps
        if self.pool is not None and self.own_snapshots and self.pool.due(prev, self.step):
            self.pool.add(self.step, self.policy.networks)

    def _agent_steps(self, i: int, actions: dict[str, int]) -> int:
        """What this step of env copy ``i`` adds to the counter (madqn.config): 1 in a parallel env; in a
        turn-based env 1 when the move starts a round of turns, so that a full round counts as one step."""
        if not self.turn_based[i]:
            return 1
        moves = [self.slots[(i, a)].length for a in self.agents]
        return int(any(starts_round(self.slots[(i, a)].length, moves) for a in actions))

    def act(self, slots: list[Slot], epsilon: float) -> np.ndarray:
        """Epsilon-greedy actions for ``slots``: the greedy rows of all agents in one batched forward.

        Shared network: one forward with agent ids. Independent networks of one architecture: one
        vmapped forward over their stacked parameters (madqn.core.policy). Learners whose states cannot
        be stacked together (different action counts, observation shapes or dtypes) are served one
        after another.
        """
        actions = np.zeros(len(slots), dtype=np.int64)
        if not slots:
            return actions
        snapshot_rows = [k for k, s in enumerate(slots) if s.snapshot is not None]
        if snapshot_rows:  # seats played by pool snapshots: their own networks, at the evaluation epsilon
            live = [k for k, s in enumerate(slots) if s.snapshot is None]
            actions[live] = self.act([slots[k] for k in live], epsilon)
            for step in sorted({slots[k].snapshot for k in snapshot_rows}):
                rows = [k for k in snapshot_rows if slots[k].snapshot == step]
                actions[rows] = self._act_snapshot([slots[k] for k in rows])
            return actions
        groups = np.array([self.group_index[s.agent] for s in slots], dtype=np.int64)
        ids = np.array([s.agent_id for s in slots], dtype=np.int64)
        kinds = {(self.n_actions[self.group_index[s.agent]], s.history.frames.shape, s.history.frames.dtype)
                 for s in self.slots.values()}
        parts = [np.arange(len(slots))] if len(kinds) == 1 else \
            [np.flatnonzero(groups == k) for k in range(len(self.n_actions))]
        for rows in parts:
            if not len(rows):
                continue
            members = [slots[k] for k in rows]

            def q_fn(sel: np.ndarray, members=members, rows=rows) -> np.ndarray:
                states = np.stack([members[k].history.state() for k in sel])
                return self.policy.q_values(states, groups[rows[sel]], ids[rows[sel]])

            n = self.n_actions[groups[rows[0]]]
            eps = np.array([1.0 if s.random else epsilon for s in members])
            actions[rows] = epsilon_greedy(q_fn, len(members), eps, self.rng, n, self._masks(members, n))
        return actions

    def _act_snapshot(self, slots: list[Slot]) -> np.ndarray:
        """Epsilon-greedy actions (``config.eval_ep``) of seats played by one pool snapshot."""
        networks = slots[0].snapshot_networks
        actions = np.zeros(len(slots), dtype=np.int64)
        for g in sorted({self.group_index[s.agent] for s in slots}):
            rows = np.array([k for k, s in enumerate(slots) if self.group_index[s.agent] == g])
            members = [slots[k] for k in rows]
            net = networks[g]

            def q_fn(sel: np.ndarray, members=members, net=net) -> np.ndarray:
                x = torch.from_numpy(np.stack([members[k].history.state() for k in sel]))
                ids = torch.as_tensor([members[k].agent_id for k in sel]) if getattr(net, "n_agents", 0) else None
                with torch.no_grad():
                    return net(x, ids).float().numpy()

            n = self.n_actions[g]
            eps = np.full(len(members), self.config.eval_ep)
            actions[rows] = epsilon_greedy(q_fn, len(members), eps, self.rng, n, self._masks(members, n))
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
                frame, action, mask = slot.pending
                self.sink.add(agent, i, frame, action, slot.reward, False, False, mask)
                slot.pending, slot.reward = None, 0.0
            if done or life_lost:
                # the final frame closes the episode (for learning) in this stream
                self.sink.add(agent, i, o, 0, 0.0, bool(terms.get(agent, False)) or life_lost, True,
                              infos.get(agent, {}).get("action_mask"))
                slot.history.reset()
            if not done:
                slot.history.push(o)
                next_obs[agent] = o
        self.observations[i] = next_obs
        self.infos[i] = infos
        if not env.agents:
            self._end_episode(i, truncated=any(truncs.values()))
            self._reset_env(i)

    def _end_episode(self, i: int, truncated: bool) -> None:
        slots = [self.slots[(i, a)] for a in self.agents]
        self.episodes += 1
        record = EpisodeRecord(self.step, self.episodes, i, {s.agent: s.score for s in slots},
                               {s.agent: s.length for s in slots}, truncated, self.epsilon(),
                               tuple(s.agent for s in slots if s.random),
                               {s.agent: s.snapshot for s in slots if s.snapshot is not None})
        if self.pool is not None:  # the networks' points against the snapshot (PFSP's statistics)
            self.pool.record(record.scores, record.snapshot_seats, record.random_seats)
        self.sink.episode(record)

    def _reset_env(self, i: int) -> None:
        for a in self.agents:
            slot = self.slots[(i, a)]
            if slot.pending is not None:  # an agent the env never finished: close its stream's episode
                self.sink.add(a, i, slot.pending[0], 0, 0.0, False, True, slot.pending[2])
                slot.pending = None
        self._begin_episode(i, *self.envs[i].reset())

    def _begin_episode(self, i: int, obs: dict[str, np.ndarray], infos: dict[str, Any]) -> None:
        for a in self.agents:
            slot = self.slots[(i, a)]
            slot.history.reset()
            slot.score, slot.length, slot.reward, slot.random = 0.0, 0, 0.0, False
            slot.snapshot, slot.snapshot_networks = None, None
        c = self.config
        if c.random_opponent > 0 or (self.pool is not None and len(self.pool)):
            u = self.rng.random()
            if u < c.random_opponent:
                self.slots[(i, self.agents[int(self.rng.integers(len(self.agents)))])].random = True
            elif self.pool is not None and len(self.pool) and u < c.random_opponent + c.pool_prob:
                slot = self.slots[(i, self.agents[int(self.rng.integers(len(self.agents)))])]
                self._play_snapshot(slot, self.pool.draw(self.rng))
        for a, o in obs.items():
            self.slots[(i, a)].history.push(o)
        self.observations[i] = dict(obs)
        self.infos[i] = infos

    def _play_snapshot(self, slot: Slot, step: int) -> None:
        slot.snapshot, slot.snapshot_networks = step, self.pool.networks(step, self.policy.networks)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The epsilon-greedy generator and what continues the current episodes: per env copy the emulator
        state (None when the env cannot capture it), per slot history, pending transition, score (the
        counters ``step`` and ``episodes`` are the run's, saved with it)."""
        return {"rng": generator_state(self.rng),
                "envs": [env.get_state() if hasattr(env, "get_state") else None for env in self.envs],
                "slots": [_slot_state(slot) for slot in self.slots.values()],
                "observations": [dict(obs) for obs in self.observations],
                "action_masks": [{a: np.asarray(info["action_mask"], bool) for a, info in infos.items()
                                  if isinstance(info, dict) and info.get("action_mask") is not None}
                                 for infos in self.infos],
                **({"pool": self.pool.state_dict()} if self.pool is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore (after ``step``); True when every env copy continues its episode exactly. Otherwise (an env
        cannot set its state) every env copy starts a fresh episode, seeded from the step."""
        set_generator_state(self.rng, state["rng"])
        if self.pool is not None and "pool" in state:
            self.pool.load_state_dict(state["pool"])
        envs = state["envs"]
        exact = len(envs) == len(self.envs) and all(
            s is not None and hasattr(env, "set_state") for s, env in zip(envs, self.envs))
        if not exact:
            for i, env in enumerate(self.envs):
                self._begin_episode(i, *env.reset(seed=self.config.seed + 1000 * i + self.step))
            return False
        for env, s in zip(self.envs, envs):
            env.set_state(s)
        for saved in state["slots"]:
            slot = self.slots[(int(saved["env"]), saved["agent"])]
            np.copyto(slot.history.frames, saved["history"])
            p = saved["pending"]
            slot.pending = None if p is None else (p["frame"], int(p["action"]), p["mask"])
            slot.reward, slot.score, slot.length = float(saved["reward"]), float(saved["score"]), int(saved["length"])
            slot.random = bool(saved.get("random", False))  # checkpoints before random_opponent have no such key
            snapshot = saved.get("snapshot")
            if self.pool is not None and snapshot is not None and self.pool.get(int(snapshot)) is not None:
                self._play_snapshot(slot, int(snapshot))
        self.observations = [dict(obs) for obs in state["observations"]]
        self.infos = [{a: {"action_mask": m} for a, m in masks.items()} for masks in state["action_masks"]]
        return True

    def close_interrupted_episodes(self, state: dict[str, Any]) -> None:
        """After a resume into fresh episodes (replay restored): end each stream's interrupted episode.

        The newest frame each agent had in ``state`` (its waiting transition's frame, else its current
        observation) goes to the sink as a truncated final frame, so the next episode's frames are never
        stacked onto it.
        """
        for saved in state["slots"]:
            i, agent = int(saved["env"]), saved["agent"]
            frame = saved["pending"]["frame"] if saved["pending"] is not None else state["observations"][i].get(agent)
            if frame is not None:
                self.sink.add(agent, i, frame, 0, 0.0, False, True, None)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _slot_state(slot: Slot) -> dict[str, Any]:
    pending = None
    if slot.pending is not None:
        frame, action, mask = slot.pending
        pending = {"frame": frame, "action": int(action), "mask": None if mask is None else np.asarray(mask, bool)}
    return {"env": slot.env_index, "agent": slot.agent, "history": slot.history.frames.copy(), "pending": pending,
            "reward": float(slot.reward), "score": float(slot.score), "length": int(slot.length),
            "random": bool(slot.random), "snapshot": slot.snapshot}
