"""The learner set: every learner of a run, its replay memory and DQN3.0's learning schedule.

A *group* is one learner (online/target network, optimizer: ``madqn.core.learner.Learner``) and the
replay memory of the agents it serves: one agent (``sharing = "independent"``) or all of them
(``"shared"``, told which agent it plays by the agent indicator). Its replay memory holds one
stream per (agent, env copy): ``stream(agent, copy)``, agent-major. The learner set is also the
acting loop's sink (``add``): transitions go straight into their stream.

The schedule follows DQN3.0's ``perceive``: when the agent step count advances from ``prev`` to
``step``, :meth:`LearnerSet.due` says how many updates to run (``n_replay`` per learning round,
a round at every multiple of ``update_freq`` past ``learn_from``) and whether the target networks
sync (a multiple of ``target_q`` crossed); :meth:`LearnerSet.run_round` runs them. The in-process
trainer, overlap mode (a thread) and the Ray learner all use these two.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from madqn.config import Config
from madqn.core.device_frames import DeviceFrames, Stager
from madqn.core.learner import Learner
from madqn.core.networks import build_q_network
from madqn.core.prioritized import annealed_beta
from madqn.core.replay import ReplayMemory, available_memory, replay_nbytes, stream_capacity
from madqn.core.rng import generator_state, set_generator_state
from madqn.errors import CheckpointError, MadqnError

SHARED = "shared"
UPDATE_STAT_KEYS = ("abs_delta", "q_mean", "q2_max")  # Learner.update statistics, in this column order


def learning_rounds(prev: int, step: int, learn_from: int, update_freq: int) -> int:
    """DQN3.0 perceive: a learning round at every step > learn_from that is a multiple of update_freq;
    how many such steps lie in (prev, step] (several when one call advances several agent steps)."""
    if step <= learn_from:
        return 0
    return step // update_freq - max(prev, learn_from) // update_freq


def group_members(config: Config, agents: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(learner name, agents it serves): one shared learner, or one per agent."""
    if config.sharing == SHARED:
        return [(SHARED, list(agents))]
    return [(a, [a]) for a in agents]


def q_network_for(config: Config, obs_shape: tuple[int, ...], n_actions: int, n_agents: int) -> torch.nn.Module:
    """The Q-network a run's config describes for one learner (training, actors and loaded agents alike)."""
    n_indicator = n_agents if (config.sharing == SHARED and config.agent_indicator) else 0
    return build_q_network(tuple(obs_shape), n_actions, config.hist_len, n_indicator, kind=config.network,
                           hidden=tuple(config.mlp_hidden), dueling=config.dueling)


def replay_seeds_and_acting_rng(seed: int, n_groups: int) -> tuple[list[int], np.random.Generator]:
    """A run's numpy randomness: ``default_rng(seed)`` seeds the replay memories (one draw per learner,
    in order), then drives acting (epsilon-greedy). A Ray actor follows the same rule with its own seed,
    so actor 0 of a one-actor run acts exactly as the in-process trainer."""
    rng = np.random.default_rng(seed)
    return [int(rng.integers(2**31)) for _ in range(n_groups)], rng


class UpdateStats:
    """Running sums of a learner's per-update statistics since the last report (constant memory, no host sync).

    ``add`` takes ``Learner.update``'s 0-dim tensors; ``means`` and ``finite_flags`` (one host sync each) read
    them; the metrics report clears them. A NaN/Inf in any update stays in the sum.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.sums = torch.zeros(len(UPDATE_STAT_KEYS), device=device)
        self.count = 0

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        self.sums += torch.stack([torch.as_tensor(stats[k]).float() for k in UPDATE_STAT_KEYS]).to(self.sums.device)
        self.count += 1

    def means(self) -> dict[str, float]:
        if self.count == 0:
            return {k: float("nan") for k in UPDATE_STAT_KEYS}
        return dict(zip(UPDATE_STAT_KEYS, (self.sums / self.count).tolist()))

    def finite_flags(self) -> list[bool]:
        """Per statistic: no update since the last report had a NaN/Inf in it (one host sync)."""
        return torch.isfinite(self.sums).tolist()

    def clear(self) -> None:
        self.sums.zero_()
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums.detach().cpu().clone(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums.copy_(torch.as_tensor(state["sums"], dtype=torch.float32))
        self.count = int(state["count"])


@dataclass
class Group:
    """A learner, the agents it serves and their replay memory."""

    name: str
    agents: list[str]
    learner: Learner
    replay: ReplayMemory
    n_actions: int
    stream_agent_ids: np.ndarray  # (n_streams,) agent id per replay stream
    updates: int = 0
    update_stats: UpdateStats = field(default_factory=UpdateStats)
    device_frames: DeviceFrames | None = None  # replay_device = "learner": the replay's frames on the learner's device


class LearnerSet:
    """Every learner of a run, its replay memory and DQN3.0's learning schedule (see the module docstring).

    ``env`` gives the spaces (internal env interface); ``n_copies``: env copies per agent (streams per
    agent in each replay memory: ``num_envs``, times the actors in a Ray run); ``has_masks``: whether
    legal-action masks are stored; ``replay_seeds``: one per learner.
    """

    def __init__(self, config: Config, env: Any, n_copies: int, has_masks: bool, replay_seeds: Sequence[int],
                 device: torch.device):
        c = self.config = config
        self.device = device
        self.agents = list(env.possible_agents)
        self.n_copies = n_copies
        self.has_masks = has_masks
        self.learn_from = c.learn_start  # rounds run once step > learn_from (later after a resume without replay)
        if c.sharing == SHARED:
            check_shared_spaces(env)
        members = group_members(c, self.agents)
        if c.cuda_graph and device.type != "cuda":
            raise MadqnError(f"cuda_graph = true captures the update in a CUDA graph: it needs device = 'cuda' "
                             f"(this run's device is {device}); set cuda_graph = false")
        capacity = replay_capacity(c, env, [agents for _, agents in members], has_masks, n_copies)
        self.groups: list[Group] = []
        for (name, agents), seed in zip(members, replay_seeds):
            obs_space = env.observation_space(agents[0])
            n_actions = int(env.action_space(agents[0]).n)
            network = q_network_for(c, obs_space.shape, n_actions, len(self.agents)).to(device)
            learner = Learner(network, lr=c.lr, lr_end=c.lr_end, lr_endt=c.lr_endt, learn_start=c.learn_start,
                              discount=c.discount, clip_delta=c.clip_delta, rescale_r=c.rescale_r, r_max=1.0,
                              weight_cost=c.wc, device=device, decay=c.rmsprop_decay, eps=c.rmsprop_eps,
                              use_target=c.target_q > 0, optimizer=c.optimizer, adam_eps=c.adam_eps,
                              double=c.double, precision=c.precision, compile=c.compile, cuda_graph=c.cuda_graph)
            replay = ReplayMemory(capacity, tuple(obs_space.shape), c.hist_len,
                                  n_streams=len(agents) * n_copies, frame_dtype=obs_space.dtype,
                                  n_actions=n_actions, store_action_masks=has_masks, seed=seed, n_step=c.n_step,
                                  discount=c.discount, prioritized=c.prioritized, priority_alpha=c.priority_alpha,
                                  priority_eps=c.priority_eps)
            ids = np.array([self.agents.index(a) for a in agents for _ in range(n_copies)], dtype=np.int64)
            self.groups.append(Group(name, list(agents), learner, replay, n_actions, ids, update_stats=UpdateStats(device)))
        if c.replay_device == "learner":
            check_device_memory([g.replay for g in self.groups], device)
            for g in self.groups:
                g.device_frames = DeviceFrames(g.replay, device)
        self.stage = Stager(device)  # each minibatch's arrays to the device in one copy
        self.group_of = {a: g for g in self.groups for a in g.agents}
        self.group_index = {a: k for k, g in enumerate(self.groups) for a in g.agents}

    @property
    def online_networks(self) -> list[torch.nn.Module]:
        return [g.learner.online_network for g in self.groups]

    # ---- the sink: transitions into replay ------------------------------------------------------
    def stream(self, agent: str, copy: int) -> int:
        """The replay stream of ``agent`` in env copy ``copy`` (agent-major inside its learner's memory)."""
        return self.group_of[agent].agents.index(agent) * self.n_copies + copy

    def add(self, agent: str, copy: int, frame: np.ndarray, action: int, reward: float, terminal: bool,
            episode_end: bool, mask: Any = None) -> None:
        """Store one replay entry (one frame, see madqn.core.replay) of ``agent`` in env copy ``copy``."""
        self.note_reward(agent, reward)
        self.store(agent, copy, frame, action, reward, terminal, episode_end, mask)

    def note_reward(self, agent: str, reward: float) -> None:
        """DQN3.0's running max of the clipped reward (``rescale_r``), as transitions arrive."""
        g = self.group_of[agent]
        g.learner.r_max = max(g.learner.r_max, reward)

    def store(self, agent: str, copy: int, frame: np.ndarray, action: int, reward: float, terminal: bool,
              episode_end: bool, mask: Any = None) -> None:
        """The replay write alone (the reward was noted when the transition arrived)."""
        kw = {"action_mask": mask} if self.has_masks else {}
        g, stream = self.group_of[agent], self.stream(agent, copy)
        g.replay.add(stream, frame, action, reward, terminal, episode_end, **kw)
        if g.device_frames is not None:
            g.device_frames.written(stream)

    # ---- the schedule ----------------------------------------------------------------------------
    def due(self, prev: int, step: int) -> tuple[int, bool]:
        """(updates per learner, target sync?) when the agent step count goes from ``prev`` to ``step``."""
        c = self.config
        n_updates = learning_rounds(prev, step, self.learn_from, c.update_freq) * c.n_replay
        sync_target = c.target_q > 0 and step // c.target_q > prev // c.target_q
        return n_updates, sync_target

    def run_round(self, n_updates: int, step: int, sync_target: bool, replay_lock: Any = None) -> None:
        """``n_updates`` minibatch updates of every learner at agent step ``step``, then the target sync."""
        for _ in range(n_updates):
            self.learn(step, replay_lock)
        if sync_target:
            for g in self.groups:
                g.learner.sync_target()

    def learn(self, step: int, replay_lock: Any = None, groups: Sequence[Group] | None = None) -> None:
        """One minibatch update of every learner whose replay can give one (``step``: the agent step for the
        lr and beta schedules; ``replay_lock``: held while touching the replay, in overlap mode; ``groups``:
        only these learners, e.g. one to time it). With a small ``learn_start`` the first rounds find no
        complete transition yet and wait, as DQN3.0 learns only from a table that can be sampled."""
        c = self.config
        lock = replay_lock if replay_lock is not None else nullcontext()
        beta = annealed_beta(step, beta_start=c.priority_beta, learn_start=c.learn_start,
                             anneal_steps=c.priority_beta_endt or c.steps - c.learn_start)
        for g in self.groups if groups is None else groups:
            with lock:
                if not g.replay.can_sample():
                    continue
                batch = g.replay.sample(c.minibatch_size, beta=beta, frames=g.device_frames is None)
                if g.device_frames is not None:
                    g.device_frames.flush()  # the frames written since the last batch
            states, actions, rewards, next_states, terminals, ids, masks, discounts, weights = self.tensors(g, batch)
            stats = g.learner.update(states, actions, rewards, next_states, terminals, agent_ids=ids,
                                     next_action_masks=masks, step=step, discounts=discounts, weights=weights)
            delta = stats.pop("delta")
            if g.replay.tree is not None:  # prioritized replay: the new |clipped delta| of each sampled transition
                deltas = delta.float().cpu().numpy()
                with lock:
                    g.replay.update_priorities(batch.streams, batch.indices, deltas, entries=batch.entries)
            g.updates += 1
            g.update_stats.add(stats)

    def tensors(self, g: Group, batch: Any) -> tuple[torch.Tensor | None, ...]:
        """A minibatch on the learner's device, in one host-to-device copy (:class:`Stager`; none on CPU): ``(states,
        actions, rewards, next_states, terminals, agent ids, next action masks, discounts, weights)``, the last
        three None when the replay has none. Frames stay uint8 until the network. The stacks: gathered on the
        device from its copy of the frames (``replay_device = "learner"``), or the replay's (B, h+1, ...) array
        of which s and s2 are overlapping views, copied once, or (n-step) the two stacks."""
        if g.device_frames is not None:
            stacks = [batch.state_rows, batch.next_rows]
        else:
            whole = batch.states.base
            h = batch.states.shape[1]
            joint = (isinstance(whole, np.ndarray) and batch.next_states.base is whole
                     and whole.shape == (batch.states.shape[0], h + 1, *batch.states.shape[2:]))
            stacks = [whole] if joint else [batch.states, batch.next_states]
        small = [batch.actions, batch.rewards, batch.terminals, g.stream_agent_ids[batch.streams],
                 batch.next_action_masks, batch.discounts, batch.weights]
        out = self.stage(stacks + small)
        if g.device_frames is not None:
            states, next_states = g.device_frames.stacks(out[0]), g.device_frames.stacks(out[1])
        elif len(stacks) == 1:
            states, next_states = out[0][:, :h], out[0][:, 1:]
        else:
            states, next_states = out[0], out[1]
        actions, rewards, terminals, ids, masks, discounts, weights = out[len(stacks):]
        return states, actions, rewards, next_states, terminals, ids, masks, discounts, weights

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, counters, unreported statistics, replay generators (not the replay memory)."""
        return {"learn_from": int(self.learn_from),
                "groups": {g.name: {"agents": list(g.agents), "n_actions": g.n_actions,
                                    "learner": g.learner.state_dict(), "updates": g.updates,
                                    "r_max": float(g.learner.r_max), "update_stats": g.update_stats.state_dict(),
                                    "replay_rng": torch.from_numpy(generator_state(g.replay.rng))}
                           for g in self.groups}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for g in self.groups:
            saved = state["groups"][g.name]
            try:
                g.learner.load_state_dict(saved["learner"])
            except (RuntimeError, KeyError, ValueError) as e:
                raise CheckpointError(f"network of {g.name} does not fit this config "
                                      f"({str(e).strip().splitlines()[0][:200]})") from None
            g.updates = int(saved["updates"])
            g.learner.r_max = float(saved["r_max"])
            g.update_stats.load_state_dict(saved["update_stats"])
            set_generator_state(g.replay.rng, saved["replay_rng"])  # before words: a bit_generator.state dict
        self.learn_from = int(state["learn_from"])

    def replay_state_dict(self) -> dict[str, Any]:
        return {g.name: g.replay.state_dict() for g in self.groups}

    def load_replay_state_dict(self, state: dict[str, Any]) -> None:
        for g in self.groups:
            try:
                g.replay.load_state_dict(state[g.name])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"replay memory of {g.name} does not fit this config ({e})") from None
            if g.device_frames is not None:
                g.device_frames.load()


def check_device_memory(replays: Sequence[ReplayMemory], device: torch.device) -> None:
    """``replay_device = "learner"`` on CUDA: refuse (one line) frame copies that would not fit in the GPU
    memory free now, with a quarter of it left for the networks and the batches."""
    if device.type != "cuda":
        return
    need = sum(DeviceFrames.nbytes(r) for r in replays)
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.75 * free:
        raise MadqnError(f"replay_device = 'learner': the replay frames take {need / 1e9:.1f} GB on {device}, which "
                         f"has {free / 1e9:.1f} GB free; lower replay_memory or use replay_device = 'host'")


def replay_capacity(config: Config, env: Any, members: list[list[str]], masks: bool, copies: int) -> int:
    """Entries per replay stream: each agent's ``replay_memory`` split over its ``copies`` env copies (every
    actor's copies in a Ray run). Refuses, before anything is allocated, a split too small to sample from
    and replays (one per learner serving ``members``) that once full would not fit in the memory available
    now: they fill lazily, so the run would die hours in."""
    c = config
    capacity = stream_capacity(c.replay_memory, copies)
    if capacity < c.hist_len + c.minibatch_size:
        raise MadqnError(f"replay_memory = {c.replay_memory} split over {copies} env copies leaves {capacity} "
                         f"entries per copy; each needs at least hist_len + minibatch_size "
                         f"({c.hist_len + c.minibatch_size}): raise replay_memory")
    need = sum(replay_nbytes(capacity, len(agents) * copies, env.observation_space(agents[0]).shape,
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
