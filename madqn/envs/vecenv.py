"""Env copies stepped in worker processes, so that emulation runs in parallel with acting and learning.

``make_envs(spec, config)`` returns ``config.num_envs`` objects with the internal ``MultiAgentEnv``
interface (docs/architecture.md): local envs (``vector_env = "inline"``) or :class:`WorkerEnv`
proxies, each driving one env in its own process (``"process"``). Copy ``i`` is always built by
``make_env(spec, config, seed=config.seed + 1000 * i)``, so a worker copy produces exactly the
transitions of the inline copy for the same actions (tests/test_vecenv.py).

A proxy adds ``step_async(actions)`` / ``step_wait()``: the trainer sends every copy its joint action,
runs the learning round while the workers emulate, then collects the results (DQN3.0's ``perceive``
order: act, learn, then the emulator advances). A worker that raises or dies surfaces as a
:class:`EnvWorkerError` naming the copy, never as a hang.

Observations travel through shared memory, the rest through the pipe (:class:`SharedObservations`): the
parent maps one segment per copy with a slot per agent whose observation space is a fixed-shape ``Box``,
the worker writes each observation into its agent's slot and the pipe carries only rewards, flags, infos,
the agent list and where each observation lies. The parent copies the frames out before it returns them
(the acting loop keeps an observation past the next step, as the frame of its pending transition), so
what a caller holds never changes under it. An observation that does not fit its slot (not an array of
the space's shape and dtype) and every agent without a slot go through the pipe, pickled, as before.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import traceback
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from gymnasium import spaces

from madqn.config import Config
from madqn.envs.adapters import make_env
from madqn.errors import MadqnError

# seconds between liveness checks while waiting for a worker's answer
_POLL_S = 1.0
# memory one env worker process holds [bytes]: 200 pong_v3 workers held 5.7 GB (28.5 MB each), with a margin
WORKER_MEMORY = 32_000_000
# more worker processes than this per core only take turns on the cores
WORKERS_PER_CORE = 4


def worker_context() -> Any:
    """Workers are forked from a clean forkserver that imported madqn once (fast starts, and no fork
    of this process, whose torch/OpenMP and cv2 thread pools would not survive it); spawn elsewhere."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["madqn.envs.vecenv", "madqn.envs.adapters", "madqn.envs.atari"])
        return ctx
    return mp.get_context("spawn")


class EnvWorkerError(MadqnError):
    """An env worker process raised, died or could not start."""


def use_processes(spec: Any, config: Config) -> bool:
    """Whether ``config.vector_env`` asks for worker processes (``auto``: when num_envs > 1)."""
    mode = config.vector_env
    if mode == "inline":
        return False
    picklable = isinstance(spec, str)
    if mode == "process":
        if not picklable:
            raise MadqnError("vector_env = 'process' needs the env as a spec string (an Atari name, "
                             "'package.module:callable' or 'file.py:callable'), not a Python object")
        return True
    return picklable and config.num_envs > 1


def make_envs(spec: Any, config: Config) -> list[Any]:
    """The ``num_envs`` env copies of a run, copy ``i`` seeded ``config.seed + 1000 * i``."""
    seeds = [config.seed + 1000 * i for i in range(config.num_envs)]
    if not use_processes(spec, config):
        return [make_env(spec, config, seed=s) for s in seeds]
    envs: list[WorkerEnv] = []
    try:
        for i, s in enumerate(seeds):  # start all workers, then wait: they import in parallel
            envs.append(WorkerEnv(spec, config, s, index=i))
        for env in envs:
            env.wait_ready()
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


Layout = dict[str, tuple[int, tuple[int, ...], str]]  # agent -> (byte offset, shape, dtype name) of its slot
Placement = list[tuple[str, "str | None"]]  # (agent, the agent whose slot holds its observation, or None: piped)


def observation_layout(observation_spaces: dict[str, Any]) -> tuple[Layout, int]:
    """(the slots, total bytes) for the agents whose observation space is a numpy ``Box`` (a fixed shape and
    dtype); the others have none. Slots start on 64-byte boundaries."""
    layout, offset = {}, 0
    for agent, space in observation_spaces.items():
        if not isinstance(space, spaces.Box) or space.dtype is None or space.dtype.hasobject:
            continue
        nbytes = int(np.prod(space.shape, dtype=np.int64)) * space.dtype.itemsize
        if nbytes == 0:
            continue
        layout[agent] = (offset, tuple(int(n) for n in space.shape), space.dtype.str)
        offset += -(-nbytes // 64) * 64
    return layout, offset


class SharedObservations:
    """One env copy's observations in one shared-memory segment: a slot per agent (:func:`observation_layout`),
    written by the worker, copied out by the parent.

    The parent creates the segment (:meth:`create`), the worker maps it by name (:meth:`attach`), then the
    parent unlinks the name at once: both mappings stay valid, nothing is left in /dev/shm whatever happens
    later, and the kernel frees the memory when the last process holding it closes it or dies.

    :meth:`write` (worker) returns where each observation lies, one ``(agent, slot)`` per observation in the
    env's order: ``slot`` is the agent whose slot holds it (one slot for agents handed the very same array, as
    Atari hands every player its one screen), None for an observation sent through the pipe in ``piped`` (no
    slot, or not an array of the slot's shape and dtype). :meth:`read` (parent) rebuilds the dict: a fresh
    copy per slot, the same copy for agents that were handed one array (as the pipe's pickling gave).
    """

    def __init__(self, memory: shared_memory.SharedMemory, layout: Layout):
        self.memory = memory
        self.layout = layout
        self.linked = True  # the name still exists (until the parent's unlink)
        self.slots = {a: np.ndarray(shape, np.dtype(dtype), buffer=memory.buf, offset=offset)
                      for a, (offset, shape, dtype) in layout.items()}

    @classmethod
    def create(cls, observation_spaces: dict[str, Any], index: int) -> "SharedObservations | None":
        """The parent's segment for ``observation_spaces``; None when no agent has a slot or the system gives
        no shared memory (the copy then uses the pipe)."""
        layout, size = observation_layout(observation_spaces)
        if not layout:
            return None
        try:
            memory = shared_memory.SharedMemory(f"madqn_{os.getpid()}_{index}_{secrets.token_hex(4)}",
                                                create=True, size=size)
        except OSError:
            return None
        return cls(memory, layout)

    @classmethod
    def attach(cls, name: str, layout: Layout) -> "SharedObservations":
        """The worker's mapping of the parent's segment."""
        return cls(shared_memory.SharedMemory(name), layout)

    def write(self, observations: dict[str, Any]) -> tuple[Placement, dict[str, Any]]:
        placement, piped, written = [], {}, {}
        for agent, obs in observations.items():
            slot = written.get(id(obs))
            if slot is None:
                view = self.slots.get(agent)
                if view is not None and isinstance(obs, np.ndarray) and obs.shape == view.shape \
                        and obs.dtype == view.dtype:
                    np.copyto(view, obs)
                    slot = written[id(obs)] = agent
                else:
                    piped[agent] = obs
            placement.append((agent, slot))
        return placement, piped

    def read(self, placement: Placement, piped: dict[str, Any]) -> dict[str, Any]:
        observations, copies = {}, {}
        for agent, slot in placement:
            if slot is None:
                observations[agent] = piped[agent]
                continue
            frame = copies.get(slot)
            if frame is None:
                frame = copies[slot] = self.slots[slot].copy()
            observations[agent] = frame
        return observations

    def unlink(self) -> None:
        """Remove the name (the parent, once the worker has mapped it); the mappings stay valid."""
        if self.linked:
            self.linked = False
            try:
                self.memory.unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Release this process's mapping (the views on it first: a mapping with views cannot close)."""
        self.slots = {}
        self.memory.close()


def _worker(conn: Any, spec: str, config_dict: dict[str, Any], seed: int) -> None:
    """Worker process main loop: build the env, answer (command, payload) messages until 'close'.

    A reply to 'step' or 'reset' is ((placement, piped), the env's result without the observations, the
    agent list): observations in the shared segment once the parent sent 'attach' (:class:`SharedObservations`),
    else all in ``piped`` with placement None."""
    shared = None
    try:
        import cv2

        cv2.setNumThreads(1)  # one core per worker; cv2's own pool would only add contention
        env = make_env(spec, Config(**config_dict), seed=seed)
        agents = list(env.possible_agents)
        conn.send(("ok", (agents, {a: env.observation_space(a) for a in agents},
                          {a: env.action_space(a) for a in agents}, bool(getattr(env, "turn_based", False)))))
        while True:
            command, payload = conn.recv()
            if command in ("step", "reset"):
                obs, *rest = env.step(payload) if command == "step" else env.reset(**payload)
                where = (None, obs) if shared is None else shared.write(obs)
                conn.send(("ok", (where, rest, list(env.agents))))
            elif command == "attach":
                shared = SharedObservations.attach(*payload)
                conn.send(("ok", None))
            elif command == "close":
                env.close()
                conn.send(("ok", None))
                return
            else:  # pragma: no cover - the proxy only sends the commands above
                raise ValueError(f"unknown worker command {command!r}")
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        return
    except BaseException as e:  # report to the parent, which raises EnvWorkerError
        try:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if shared is not None:
            shared.close()


class WorkerEnv:
    """One env copy living in a worker process, with the interface of the env it wraps.

    ``shared_memory=False``: every observation through the pipe (the transport before shared memory; the
    benchmark's reference). ``observations_shared`` / ``observations_piped`` count the observations returned
    each way."""

    def __init__(self, spec: str, config: Config, seed: int, *, index: int = 0, shared_memory: bool = True):
        self.index = index
        self._pending = False
        self._closed = False
        self._use_shared = shared_memory
        self._shared: SharedObservations | None = None
        self.observations_shared = 0
        self.observations_piped = 0
        self.agents: list[str] = []
        ctx = worker_context()
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker, args=(child, spec, config.to_dict(), seed),
                                    name=f"madqn-env-{index}", daemon=True)
        self._process.start()
        child.close()
        self._ready = False

    def wait_ready(self) -> None:
        if self._ready:
            return
        self._possible_agents, self._obs_spaces, self._act_spaces, self._turn_based = self._receive("start")
        self._ready = True
        if self._use_shared:
            self._shared = SharedObservations.create(self._obs_spaces, self.index)
        if self._shared is not None:
            try:
                self._send("attach", (self._shared.memory.name, self._shared.layout))
                self._receive("start")
            finally:
                if self._shared is not None:
                    self._shared.unlink()  # both processes map it now: no name left behind, whatever follows

    # -- MultiAgentEnv -------------------------------------------------------------------------
    @property
    def possible_agents(self) -> list[str]:
        self.wait_ready()
        return self._possible_agents

    @property
    def turn_based(self) -> bool:
        self.wait_ready()
        return self._turn_based

    def observation_space(self, agent: str) -> Any:
        self.wait_ready()
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> Any:
        self.wait_ready()
        return self._act_spaces[agent]

    def reset(self, seed: int | None = None):
        self.wait_ready()
        self._send("reset", {} if seed is None else {"seed": seed})
        where, rest, self.agents = self._receive("reset")
        return (self._observations(*where), *rest)

    def step(self, actions: dict[str, int]):
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: dict[str, int]) -> None:
        """Send the joint action; the worker emulates while the caller does other work."""
        if self._pending:
            raise RuntimeError("step_async() called twice without step_wait()")
        self.wait_ready()
        self._send("step", {a: int(x) for a, x in actions.items()})
        self._pending = True

    def step_wait(self):
        """The result of the step sent by ``step_async`` (observations, rewards, terms, truncs, infos)."""
        if not self._pending:
            raise RuntimeError("step_wait() without step_async()")
        self._pending = False
        where, rest, self.agents = self._receive("step")
        return (self._observations(*where), *rest)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._process.is_alive():
                if self._pending:
                    self._receive("step")
                self._conn.send(("close", None))
                if self._conn.poll(5.0):
                    self._conn.recv()
        except (EnvWorkerError, OSError, EOFError):
            pass
        finally:
            self._conn.close()
            self._process.join(timeout=5.0)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5.0)
            self._release_shared()

    # -- transport -------------------------------------------------------------------------------
    def _observations(self, placement: Placement | None, piped: dict[str, Any]) -> dict[str, Any]:
        """The observations of a reply: copied out of the shared slots, or as they came through the pipe."""
        self.observations_piped += len(piped)
        if placement is None:
            return piped
        self.observations_shared += len(placement) - len(piped)
        return self._shared.read(placement, piped)

    def _release_shared(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.unlink()
            shared.close()

    def _send(self, command: str, payload: Any) -> None:
        if self._closed:
            raise EnvWorkerError(f"env copy {self.index}: the worker was closed")
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, OSError):
            raise self._died(command) from None

    def _receive(self, command: str) -> Any:
        try:
            while not self._conn.poll(_POLL_S):
                if not self._process.is_alive():
                    raise self._died(command)
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(command) from None
        if status == "error":
            self._closed = True
            self._process.join(timeout=5.0)
            self._release_shared()
            error = EnvWorkerError(f"env copy {self.index} (worker pid {self._process.pid}) failed during "
                                   f"{command}: {payload.splitlines()[0]}")
            error.worker_traceback = payload  # the worker's full traceback, for --debug and bug reports
            raise error
        return payload

    def _died(self, command: str) -> EnvWorkerError:
        self._closed = True
        self._process.join(timeout=5.0)
        self._release_shared()
        code = self._process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return EnvWorkerError(f"env copy {self.index} (worker pid {self._process.pid}) {how} during {command}")

    def __del__(self) -> None:  # best effort; the trainer closes its envs explicitly
        try:
            self.close()
        except Exception:
            pass
