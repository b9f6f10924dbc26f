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
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any

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


def _worker(conn: Any, spec: str, config_dict: dict[str, Any], seed: int) -> None:
    """Worker process main loop: build the env, answer (command, payload) messages until 'close'."""
    try:
        import cv2

        cv2.setNumThreads(1)  # one core per worker; cv2's own pool would only add contention
        env = make_env(spec, Config(**config_dict), seed=seed)
        agents = list(env.possible_agents)
        conn.send(("ok", (agents, {a: env.observation_space(a) for a in agents},
                          {a: env.action_space(a) for a in agents}, bool(getattr(env, "turn_based", False)))))
        while True:
            command, payload = conn.recv()
            if command == "step":
                result = env.step(payload)
                conn.send(("ok", (result, list(env.agents))))
            elif command == "reset":
                result = env.reset(**payload)
                conn.send(("ok", (result, list(env.agents))))
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


class WorkerEnv:
    """One env copy living in a worker process, with the interface of the env it wraps."""

    def __init__(self, spec: str, config: Config, seed: int, *, index: int = 0):
        self.index = index
        self._pending = False
        self._closed = False
        self.agents: list[str] = []
        ctx = worker_context()
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker, args=(child, spec, config.to_dict(), seed),
                                    name=f"madqn-env-{index}", daemon=True)
        self._process.start()
        child.close()
        self._ready = False

    def wait_ready(self) -> None:
        if not self._ready:
            self._possible_agents, self._obs_spaces, self._act_spaces, self._turn_based = self._receive("start")
            self._ready = True

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
        result, self.agents = self._receive("reset")
        return result

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
        result, self.agents = self._receive("step")
        return result

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

    # -- transport -------------------------------------------------------------------------------
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
            error = EnvWorkerError(f"env copy {self.index} (worker pid {self._process.pid}) failed during "
                                   f"{command}: {payload.splitlines()[0]}")
            error.worker_traceback = payload  # the worker's full traceback, for --debug and bug reports
            raise error
        return payload

    def _died(self, command: str) -> EnvWorkerError:
        self._closed = True
        self._process.join(timeout=5.0)
        code = self._process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return EnvWorkerError(f"env copy {self.index} (worker pid {self._process.pid}) {how} during {command}")

    def __del__(self) -> None:  # best effort; the trainer closes its envs explicitly
        try:
            self.close()
        except Exception:
            pass
