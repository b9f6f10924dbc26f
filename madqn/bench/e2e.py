"""End-to-end rows: agent steps/s of pong_v3 training runs against the bound the component rows allow."""

from __future__ import annotations

import statistics
import time

from madqn.bench.measure import Section, Timings, _threads, compared, spread
from madqn.bench.table import Row
from madqn.config import make_config
from madqn.training.trainer import Trainer

CLEANRL_STEPS_PER_S = 84.0  # CleanRL dqn_atari on Pong, 2-core CPU (issue 5), the peer to beat by 1.3x
BOUND_SLACK = 1.15  # an end-to-end run faster than this x the bound contradicts the component rows

E2E_VARIANTS = (("fp32", False), ("fp32", True), ("bf16", False))  # (precision, overlap)


def e2e_trainer(sharing: str, device: str, overlap: bool, num_envs: int, precision: str = "fp32", **settings):
    cfg = make_config(None, {"env": "pong_v3", "sharing": sharing, "device": device, "overlap": overlap,
                             "num_envs": num_envs, "replay_memory": 20_000, "learn_start": 400,
                             "ep_start": 0.1, "ep_end": 0.1, "target_q": 10_000, "steps": 10**9, "seed": 0,
                             "precision": precision, "num_threads": _threads(), **settings})
    trainer = Trainer(cfg)
    while trainer.step <= cfg.learn_start + 8:
        trainer.env_step()
    return trainer


def bounds(env_rate: float, act_ms: dict[str, float], updates: float, num_envs: int,
           n_agents: int = 2, update_freq: int = 4) -> dict[str, tuple[float, float, float]]:
    """Agent steps/s each sharing mode could reach: ``(bound, learner bound, env+acting bound)``.

    Agent steps count the decisions of all agents (``n_agents`` per counter step). The learner bound:
    every learner does 1 update per ``update_freq`` counter steps, so the shared learner allows
    updates/s x update_freq x n_agents agent steps/s and each of the n_agents independent learners
    (run one after another) 1/n_agents of that. Env+acting: n_agents decisions per env step, one env
    step and 1/num_envs of a batched action choice at a time.
    """
    out = {}
    for sharing, ms in act_ms.items():
        env_acting = n_agents / (1 / env_rate + ms / 1e3 / num_envs)
        learner = updates * update_freq * n_agents / (1 if sharing == "shared" else n_agents)
        out[sharing] = (min(env_acting, learner), learner, env_acting)
    return out


def e2e_section(device: str, n: int, num_envs: int) -> Section:
    trainers = {(sharing, precision, overlap): e2e_trainer(sharing, device, overlap, num_envs, precision)
                for sharing in ("shared", "independent") for precision, overlap in E2E_VARIANTS}

    def measure(key) -> float:
        t = trainers[key]
        start_step, start = t.step, time.perf_counter()
        while t.step < start_step + n:
            t.env_step()
        t.settle()  # overlap: the rounds still queued count in the time
        return (t.step - start_step) * len(t.agents) / (time.perf_counter() - start)

    on_cuda = device.startswith("cuda")
    if on_cuda:  # the GPU settings of configs/pong_gpu.toml: captured update, replay on the GPU, Nature's ratio
        trainers[("shared", "fp32", "graph")] = e2e_trainer("shared", device, False, num_envs, "fp32", **GPU_SETTINGS)
    probes = {e2e_key(device, *k): (lambda k=k: measure(k)) for k in trainers}

    def rows(t: Timings) -> list[Row]:
        return e2e_rows(t, device, num_envs) + (gpu_rows(t, device, num_envs) if on_cuda else [])

    return Section(probes, rows, [t.close for t in trainers.values()])


def e2e_key(device: str, sharing: str, precision: str, overlap: bool | str) -> str:
    mode = overlap if isinstance(overlap, str) else "overlap" if overlap else "serial"
    return f"e2e[{device}]/{sharing}/{precision}/{mode}"


# configs/pong_gpu.toml's learner settings (Nature's replay ratio of 8 with two agents: update_freq 2)
GPU_SETTINGS = {"cuda_graph": True, "replay_device": "learner", "update_freq": 2, "double": True}


def gpu_rows(t: Timings, device: str, num_envs: int) -> list[Row]:
    """CUDA: the pong_gpu settings end to end (agent steps/s at the replay ratio of 8), and what a 1M agent
    step pong_v3 run takes at that rate."""
    key = e2e_key(device, "shared", "fp32", "graph")
    value = t.median(key)
    return [Row(f"end-to-end [{device}]: shared, pong_gpu settings (cuda_graph, replay on the GPU, ratio 8), "
                f"{num_envs} env{'s' if num_envs > 1 else ''}", value, "agent steps/s", None, ">= 4000",
                value >= 4000, f"1M agent steps of pong_v3 in {1e6 / value / 60:.0f} min at this rate")]


def e2e_rows(t: Timings, device: str, num_envs: int) -> list[Row]:
    """The bound rows (from the env, acting and learner rates) and the end-to-end rows against them, each
    bound taken per round; a run above ``BOUND_SLACK`` x its bound contradicts the component rows and is
    marked noisy."""
    def bound_in(r: dict[str, float], precision: str, sharing: str) -> tuple[float, float, float]:
        act = {k: 1e3 / r[f"acting/{k}"] for k in ("shared", "independent")}
        return bounds(r["env/pipeline"], act, r[f"learner[{device}]/madqn-{precision}"], num_envs)[sharing]

    rows = []
    for precision in ("fp32", "bf16"):
        for sharing in ("shared", "independent"):
            per_round = t.per_round(lambda r: bound_in(r, precision, sharing)[0])
            learner = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[1]))
            env_acting = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[2]))
            rows.append(Row(f"bound [{device}]: {sharing}, {precision}", statistics.median(per_round), "agent steps/s",
                            note=f"learner {learner:,.0f}, env+acting {env_acting:,.0f}", spread=spread(per_round)))
        for sharing in ("shared", "independent"):
            for p, overlap in E2E_VARIANTS:
                if p != precision:
                    continue
                key = e2e_key(device, sharing, precision, overlap)
                ratios = t.per_round(lambda r: r[key] / bound_in(r, precision, sharing)[0])
                ratio, value = statistics.median(ratios), t.median(key)
                bound = statistics.median(t.per_round(lambda r: bound_in(r, precision, sharing)[0]))
                rows.append(Row(f"end-to-end [{device}]: {sharing}, {precision}, "
                                f"{'overlap' if overlap else 'serial'}, {num_envs} env{'s' if num_envs > 1 else ''}",
                                value, "agent steps/s", bound, ">= 0.9 x bound and >= 110",
                                ratio >= 0.9 and value >= 1.3 * CLEANRL_STEPS_PER_S,
                                "bound: min(learner, env+acting) rows; CleanRL: 84", spread(ratios),
                                inconsistent=ratio > BOUND_SLACK, round_ratio=ratio))
    for sharing in ("shared", "independent"):
        keys = [e2e_key(device, sharing, p, False) for p in ("bf16", "fp32")]
        rows.append(compared(t, f"end-to-end [{device}]: {sharing}, bf16 vs fp32 (serial)", *keys, "agent steps/s",
                             target=">= 1.5 x limit", check=lambda ratio: ratio >= 1.5,
                             note="limit: the fp32 serial run of the same window"))
    return rows
