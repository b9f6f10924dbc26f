"""madqn.envs.vecenv: env copies in worker processes give the transitions of the inline copies, their observations
through shared memory (the pipe for those that do not fit), which nothing leaves behind; crashes are errors."""

from __future__ import annotations

import os
import signal
import textwrap

import numpy as np
import pytest

from madqn.config import make_config
from madqn.envs.adapters import make_env
from madqn.training.trainer import Trainer
from madqn.envs.vecenv import EnvWorkerError, WorkerEnv, make_envs
from madqn.errors import MadqnError

from test_train import SMOKE

ATARI = dict(env="pong_v3", num_envs=2, max_cycles=40, random_starts=30, seed=5)


def _play(envs, n_steps, seed):
    """Step every copy with the same seeded random actions; record everything the envs return."""
    rng = np.random.default_rng(seed)
    log = []
    for i, env in enumerate(envs):
        obs, infos = env.reset()
        log.append((i, "reset", obs, infos))
    for _ in range(n_steps):
        for i, env in enumerate(envs):
            if not env.agents:
                log.append((i, "reset", *env.reset()))
                continue
            actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
            log.append((i, "step", actions, *env.step(actions), list(env.agents)))
    return log


def _same(x, y) -> bool:
    """Equal values, arrays bit for bit with their dtype, dicts in the same key order, at any depth."""
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and list(x) == list(y) and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return type(x) is type(y) and x == y


def _assert_same(log_a, log_b):
    assert len(log_a) == len(log_b)
    for k, (ea, eb) in enumerate(zip(log_a, log_b)):
        assert _same(ea, eb), (k, ea, eb)


def _observations(log):
    return sum(len(e[2]) if e[1] == "reset" else len(e[3]) for e in log)


def _shm_names(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"madqn_{pid}_")]


def _mapped(name: str) -> bool:
    return any(name in line for line in open("/proc/self/maps"))


def test_worker_copies_equal_single_envs_seeded_like_them():
    """'Same' = copy i in a worker returns, for the same actions, exactly what a lone env built with
    copy i's seed (config.seed + 1000 * i) returns: frames bit for bit, rewards, flags, infos, agents;
    over 300 steps, across episode ends (max_cycles 40) and the resets after them. Every frame came through
    shared memory (none pickled), and the frames compared at the end were all held while the copies kept
    stepping: what a step returned is a copy, not a view the next step overwrites."""
    cfg = make_config(None, {**ATARI, "vector_env": "process"})
    workers = make_envs("pong_v3", cfg)
    try:
        assert all(isinstance(e, WorkerEnv) for e in workers)
        got = _play(workers, 300, seed=0)
        assert [e.observations_piped for e in workers] == [0, 0]
        assert sum(e.observations_shared for e in workers) == _observations(got) > 1000
    finally:
        for e in workers:
            e.close()
    singles = [make_env("pong_v3", cfg, seed=cfg.seed + 1000 * i) for i in range(2)]
    expected = _play(singles, 300, seed=0)
    _assert_same(got, expected)
    assert sum(1 for e in expected if e[1] == "reset") > 4  # both copies ended episodes and restarted
    # as inline, both players are handed the one screen (one copy out of shared memory, not two)
    assert all(e[3]["first_0"] is e[3]["second_0"] for e in got if e[1] == "step" and len(e[3]) == 2)
    # the two copies are seeded differently: their frames differ somewhere
    assert any(not np.array_equal(a[3]["first_0"], b[3]["first_0"])
               for a, b in zip(expected[2::2], expected[3::2]) if a[1] == b[1] == "step")


def test_trainer_with_worker_envs_stores_the_inline_transitions():
    """A run with num_envs=2 in worker processes equals the same run with the copies stepped inline:
    every replay stream (frames, actions, rewards, flags), the updates and the final weights."""
    runs = []
    for mode in ("inline", "process"):
        cfg = make_config(SMOKE, {"steps": 120, "learn_start": 88, "num_envs": 2, "vector_env": mode,
                                  "sharing": "independent", "seed": 11, "max_cycles": 50})
        with Trainer(cfg) as trainer:
            trainer.run()
            runs.append(trainer)
    inline, process = runs
    assert isinstance(process.acting.envs[0], WorkerEnv) and not isinstance(inline.acting.envs[0], WorkerEnv)
    for g_in, g_pr in zip(inline.groups, process.groups):
        assert g_in.updates == g_pr.updates == 120 // 4 - 88 // 4
        a, b = g_in.replay.state_dict(), g_pr.replay.state_dict()
        for key in ("frames", "actions", "rewards", "terminal", "episode_end", "written"):
            assert np.array_equal(a[key], b[key]), key
        assert (a["written"] > 50).all() and a["episode_end"].any()  # both copies' streams filled, episodes ended
        for p, q in zip(g_in.learner.online_network.parameters(), g_pr.learner.online_network.parameters()):
            assert np.array_equal(p.detach().numpy(), q.detach().numpy())


ODD_ENV = textwrap.dedent('''
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    class Odd(ParallelEnv):
        """'a' sees 84x84 frames as its space says; 'b' is handed a 40x40 frame every other step (its space
        says 84x84: the adapter keeps unscaled frames as they come) and leaves the game at step 5, 'a' at 8."""
        metadata = {"name": "odd"}
        possible_agents = ["a", "b"]

        def __init__(self):
            self.agents = []

        def observation_space(self, agent):
            return spaces.Box(0, 255, (84, 84), np.uint8)

        def action_space(self, agent):
            return spaces.Discrete(3)

        def reset(self, seed=None, options=None):
            if seed is not None:  # the adapter seeds the first reset only
                self.rng = np.random.default_rng(seed)
            self.agents, self.t = list(self.possible_agents), 0
            return {a: self._frame(a) for a in self.agents}, {a: {} for a in self.agents}

        def _frame(self, agent):
            side = 40 if agent == "b" and self.t % 2 else 84
            return self.rng.integers(0, 256, (side, side), dtype=np.uint8)

        def step(self, actions):
            self.t += 1
            obs = {a: self._frame(a) for a in self.agents}
            rewards = {a: float(actions[a]) for a in self.agents}
            terms = {a: (a == "b" and self.t == 5) or self.t == 8 for a in self.agents}
            truncs = {a: False for a in self.agents}
            self.agents = [a for a in self.agents if not terms[a]]
            return obs, rewards, terms, truncs, {a: {} for a in obs}

    def make():
        return Odd()
''')


def test_observations_that_do_not_fit_their_slot_come_through_the_pipe(tmp_path):
    """An observation of another shape than its space's goes through the pipe, the others through shared
    memory; an agent that left the game is absent as inline. Everything equals the inline copies."""
    path = tmp_path / "odd_env.py"
    path.write_text(ODD_ENV)
    cfg = make_config(None, {"env": f"{path}:make", "num_envs": 2, "vector_env": "process", "seed": 3})
    workers = make_envs(f"{path}:make", cfg)
    try:
        got = _play(workers, 30, seed=1)
        shared, piped = sum(e.observations_shared for e in workers), sum(e.observations_piped for e in workers)
    finally:
        for e in workers:
            e.close()
    expected = _play([make_env(f"{path}:make", cfg, seed=cfg.seed + 1000 * i) for i in range(2)], 30, seed=1)
    _assert_same(got, expected)
    assert shared + piped == _observations(got) and shared > piped > 10
    assert any(e[1] == "step" and set(e[3]) == {"a"} for e in got)  # b gone, a still playing


def _play_turns(env, n_steps, seed):
    """A turn-based env: the one agent whose turn it is plays a random legal move."""
    rng = np.random.default_rng(seed)
    obs, infos = env.reset()
    log = [("reset", obs, infos)]
    for _ in range(n_steps):
        if not env.agents:
            obs, infos = env.reset()
            log.append(("reset", obs, infos))
            continue
        agent, = [a for a in obs if a in env.agents]
        actions = {agent: int(rng.choice(np.flatnonzero(infos[agent]["action_mask"])))}
        obs, rewards, terms, truncs, infos = env.step(actions)
        log.append(("step", actions, obs, rewards, terms, truncs, infos, list(env.agents)))
    return log


def test_turn_based_worker_copies_equal_inline():
    """Tictactoe (AEC): one agent's board per turn, both players' final boards at a game's end, all through
    shared memory; the same as inline."""
    spec = "pettingzoo.classic.tictactoe_v3:env"
    cfg = make_config(None, {"env": spec, "num_envs": 1, "vector_env": "process", "seed": 2})
    worker = make_envs(spec, cfg)[0]
    try:
        assert isinstance(worker, WorkerEnv) and worker.turn_based
        got = _play_turns(worker, 40, seed=0)
        assert worker.observations_piped == 0
        assert worker.observations_shared == _observations([(0, *e) for e in got]) > 40
    finally:
        worker.close()
    _assert_same(got, _play_turns(make_env(spec, cfg, seed=cfg.seed), 40, seed=0))
    assert any(e[0] == "step" and len(e[2]) == 2 for e in got)  # a game's end: both players' final boards


def test_shared_memory_leaves_nothing_behind():
    """The segment's name is gone from /dev/shm as soon as the worker maps it; this process's mapping is
    released on close, and on a worker's death with its error."""
    cfg = make_config(None, {**ATARI, "vector_env": "process"})
    envs = make_envs("pong_v3", cfg)
    names = [e._shared.memory.name for e in envs]
    try:
        assert _shm_names(os.getpid()) == [] and all(_mapped(n) for n in names)
        for env in envs:
            env.reset()
        os.kill(envs[1]._process.pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerError, match="env copy 1"):
            envs[1].step({"first_0": 0, "second_0": 0})
        assert _mapped(names[0]) and not _mapped(names[1])
    finally:
        for env in envs:
            env.close()
    assert not any(_mapped(n) for n in names) and _shm_names(os.getpid()) == []


def test_pipe_transport_when_asked():
    """``shared_memory=False``: the transport before shared memory (the benchmark's reference), the same results."""
    cfg = make_config(None, {**ATARI, "vector_env": "process"})
    piped, shared = (WorkerEnv("pong_v3", cfg, cfg.seed, shared_memory=flag) for flag in (False, True))
    try:
        a, b = _play([piped], 20, seed=2), _play([shared], 20, seed=2)
        assert piped._shared is None and piped.observations_shared == 0 and piped.observations_piped > 0
        assert shared.observations_piped == 0 and shared.observations_shared > 0
    finally:
        piped.close()
        shared.close()
    _assert_same(a, b)


CRASHING_ENV = textwrap.dedent('''
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    class Crashing(ParallelEnv):
        metadata = {"name": "crashing"}
        possible_agents = ["a", "b"]

        def __init__(self):
            self.agents = []
            self.t = 0

        def observation_space(self, agent):
            return spaces.Box(-1.0, 1.0, (3,), np.float32)

        def action_space(self, agent):
            return spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            return {a: np.zeros(3, np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            self.t += 1
            if self.t == 3:
                raise RuntimeError("emulator exploded at step 3")
            obs = {a: np.full(3, self.t / 10, np.float32) for a in self.agents}
            zero = {a: 0.0 for a in self.agents}
            false = {a: False for a in self.agents}
            return obs, zero, false, dict(false), {a: {} for a in self.agents}

    def make():
        return Crashing()
''')


def test_worker_exception_is_a_clear_error(tmp_path):
    path = tmp_path / "crashing_env.py"
    path.write_text(CRASHING_ENV)
    cfg = make_config(None, {"env": f"{path}:make", "num_envs": 2, "vector_env": "process"})
    envs = make_envs(f"{path}:make", cfg)
    name = envs[0]._shared.memory.name  # the float vectors travel through shared memory
    try:
        for env in envs:
            env.reset()
        for _ in range(2):
            for env in envs:
                env.step({"a": 0, "b": 1})
        assert envs[0].observations_shared == 6 and envs[0].observations_piped == 0
        with pytest.raises(EnvWorkerError, match=r"env copy 0 .* failed during step: RuntimeError: emulator exploded"):
            envs[0].step({"a": 0, "b": 1})
        assert not _mapped(name)  # released with the error
        with pytest.raises(EnvWorkerError):  # the failed copy stays failed
            envs[0].step({"a": 0, "b": 1})
    finally:
        for env in envs:
            env.close()


def test_killed_worker_is_a_clear_error_not_a_hang():
    cfg = make_config(None, {**ATARI, "vector_env": "process"})
    envs = make_envs("pong_v3", cfg)
    try:
        envs[1].reset()
        os.kill(envs[1]._process.pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerError, match=r"env copy 1 \(worker pid \d+\) was killed by signal 9 during step"):
            envs[1].step({"first_0": 0, "second_0": 0})
    finally:
        for env in envs:
            env.close()
    assert all(not e._process.is_alive() for e in envs)


def test_cli_reports_a_worker_crash_in_one_line(tmp_path, madqn_cli):
    import subprocess

    path = tmp_path / "crashing_env.py"
    path.write_text(CRASHING_ENV)
    cmd, env = madqn_cli("train", "--env", f"{path}:make", "--config", SMOKE, "--run-dir", tmp_path / "run",
                         "--set", "num_envs=2", "--set", "vector_env='process'")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "env copy" in lines[0] and "emulator exploded at step 3" in lines[0], proc.stderr


CHILDREN_AFTER_MAIN = """
import pathlib, sys
from madqn.cli import main
code = main(sys.argv[1:])
children = [c for t in pathlib.Path('/proc/self/task').iterdir() for c in (t / 'children').read_text().split()]
print(f'children {len(children)}')
sys.exit(code)
"""


def test_env_copies_that_cannot_fit_in_memory_are_refused_before_any_worker_starts(tmp_path, madqn_cli):
    """Issue 30 E9: 100,000 pong_v3 copies spawned workers until the kernel killed the run. Refused in one line
    before the first worker (no child process at all: not even the forkserver that would start them)."""
    import subprocess
    import sys

    cmd, env = madqn_cli()
    proc = subprocess.run([sys.executable, "-c", CHILDREN_AFTER_MAIN, "train", "--env", "pong_v3", "--steps", "10",
                           "--run-dir", str(tmp_path / "run"), "--set", "num_envs=100000"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("madqn: error: "), proc.stderr
    assert "num_envs = 100000" in proc.stderr and "GB" in proc.stderr and "lower num_envs" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "children 0"
    assert not (tmp_path / "run").exists()


def test_env_copies_check_warns_where_workers_far_exceed_the_cores():
    from madqn.envs.vecenv import WORKER_MEMORY
    from madqn.training.trainer import check_env_copies

    assert check_env_copies(8, cores=2, available=10**12) is None
    warning = check_env_copies(9, cores=2, available=10**12)
    assert warning.startswith("madqn: warning: 9 env worker processes on 2 cores") and "\n" not in warning
    assert check_env_copies(64, cores=16, available=10**12) is None
    assert check_env_copies(10, cores=2, available=None) is not None  # memory unknown: no refusal, still the warning
    with pytest.raises(MadqnError, match=r"num_envs = 10 worker processes need about .* GB"):
        check_env_copies(10, cores=64, available=10 * WORKER_MEMORY - 1)
    assert check_env_copies(10, cores=64, available=10 * WORKER_MEMORY) is None


def test_steps_not_a_multiple_of_num_envs_round_up_once_with_a_line(tmp_path, capsys):
    """One step of the env copies counts num_envs agent steps: --steps 10 with 4 copies trains 12, says so
    before it starts, and config.toml records 12 (the progress never reads 12/10)."""
    from madqn.cli import main
    from helpers import ROOT, read_csv

    run_dir = tmp_path / "run"
    assert main(["train", "--env", f"{ROOT / 'tests' / 'tiny_catch.py'}:make", "--steps", "10", "--run-dir",
                 str(run_dir), "--set", "num_envs=4", "--set", "vector_env='inline'", "--set", "learn_start=4",
                 "--set", "final_eval_episodes=0", "--set", "prog_freq=4", "--set", "num_threads=1"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "rounded up" in line]
    assert lines == ["madqn train: steps = 10 is not a multiple of num_envs = 4 (one step of the 4 env copies is "
                     "4 agent steps): rounded up to 12"], out
    assert out.index("rounded up") < out.index("12 agent steps -> ")  # before the run starts
    assert "steps = 12" in (run_dir / "config.toml").read_text()
    assert "/12 (100%)" in out and "/10 " not in out
    assert "done: 12 agent steps" in out


def test_a_trainer_whose_learner_set_fails_closes_its_env_workers(monkeypatch):
    """Issue 30 E7: the learner set raising (here: a replay too large for the machine) must not leave the
    env worker processes running."""
    from madqn.envs import vecenv

    started = []
    original = vecenv.WorkerEnv.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        started.append(self)

    cfg = make_config(None, {"env": "pong_v3", "num_envs": 2, "vector_env": "process", "replay_memory": 10**12,
                             "device": "cpu"})
    monkeypatch.setattr(vecenv.WorkerEnv, "__init__", record)  # the real workers, recorded as they start
    with pytest.raises(MadqnError, match="the replay memory needs"):
        Trainer(cfg)
    assert len(started) == 2
    for env in started:
        env._process.join(timeout=5)
    assert all(not env._process.is_alive() for env in started), [env._process.pid for env in started]
