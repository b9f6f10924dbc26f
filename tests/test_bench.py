"""madqn bench's arithmetic on synthetic timings: bounds, ratios, the noise verdict and the FLOP count.

No timing is asserted here: every rate below is made up, so each check is exact.
"""

import pytest

from madqn.bench import (NOISY_SPREAD, Timings, bounds, compared, e2e_key, e2e_rows, format_table, interleaved,
                         learner_rows, spread, update_flops, verdict)
from madqn.core.learner import Learner
from madqn.core.networks import DQN3ConvNet

CPU = "cpu"


def steady(value, spread=0.02):
    """Three repeats around ``value``, (max - min) / median = ``spread``."""
    return [value * (1 - spread / 2), value, value * (1 + spread / 2)]


def window(e2e=None, learner_fp32=25.0, noisy=()):
    """Synthetic rates of every probe the env/acting/learner/peak/e2e rows read.

    env pipeline 2000 decisions/s; acting 1 ms (shared) and 2 ms (independent) per env step;
    LearnerSet.learn 25 updates/s in fp32 (``learner_fp32``), 40 in bf16; bare updates 26 (fp32), 45 (bf16),
    30 (fp32 channels_last), 44 (bf16 channels_last); the compiled bf16 learner 60 against a compiled bare
    update of 64; matmul peaks 100 / 200 GFLOP/s.
    """
    rates = {"env/raw": 3000.0, "env/pipeline": 2000.0, "acting/shared": 1000.0, "acting/independent": 500.0,
             "acting/shared-bf16": 900.0, "peak[cpu]/fp32": 100e9, "peak[cpu]/bf16": 200e9,
             "learner[cpu]/madqn-fp32": learner_fp32, "learner[cpu]/madqn-bf16": 40.0,
             "learner[cpu]/bare-fp32": 26.0, "learner[cpu]/bare-bf16": 45.0,
             "learner[cpu]/bare-fp32-cl": 30.0, "learner[cpu]/bare-bf16-cl": 44.0,
             "learner[cpu]/madqn-bf16-compiled": 60.0, "learner[cpu]/bare-bf16-compiled": 64.0}
    e2e = e2e or {}
    for sharing, default in (("shared", 190.0), ("independent", 95.0)):
        for precision, overlap in (("fp32", False), ("fp32", True), ("bf16", False)):
            key = e2e_key(CPU, sharing, precision, overlap)
            rates[key] = e2e.get(key, default * (1.5 if precision == "bf16" else 1.0))
    return Timings({k: (steady(v, 0.6) if k in noisy else steady(v)) for k, v in rates.items()})


def by_name(rows):
    return {r.name: r for r in rows}


def test_bounds_by_hand():
    # env+acting: 2 agents / (1/2000 s + 1 ms) = 1333; (1/2000 + 2 ms) = 800 agent steps/s.
    # learner: 25 updates/s x 4 counter steps x 2 agents = 200 (shared); each independent learner 100.
    b = bounds(2000.0, {"shared": 1.0, "independent": 2.0}, 25.0, num_envs=1)
    assert b["shared"] == pytest.approx((200.0, 200.0, 2 / (1 / 2000 + 1e-3)))
    assert b["independent"] == pytest.approx((100.0, 100.0, 800.0))
    # 4 env copies share one batched action choice: 2 / (1/2000 + 2 ms / 4) = 2000
    assert bounds(2000.0, {"independent": 2.0}, 1e6, num_envs=4)["independent"][0] == pytest.approx(2000.0)


def test_quiet_window_reports_ratios_and_results():
    rows = by_name(e2e_rows(window(), CPU, num_envs=1))
    shared = rows["end-to-end [cpu]: shared, fp32, serial, 1 env"]
    assert shared.limit == pytest.approx(200.0) and shared.ratio == pytest.approx(0.95)
    assert shared.passed and not shared.noisy
    indep_bf16 = rows["end-to-end [cpu]: independent, bf16, serial, 1 env"]
    assert indep_bf16.limit == pytest.approx(160.0)  # bf16 learner: 40 x 4 x 2 / 2
    assert indep_bf16.value == pytest.approx(142.5) and indep_bf16.passed is False  # 0.89 x bound < 0.9
    speedup = rows["end-to-end [cpu]: shared, bf16 vs fp32 (serial)"]
    assert speedup.ratio == pytest.approx(1.5) and speedup.passed
    table = format_table(list(rows.values()))
    assert table.splitlines()[0].startswith("Repeats agreed")
    assert "noisy" not in table and "| 0.95 |" in table


def test_noisy_repeats_replace_ratio_and_result():
    key = e2e_key(CPU, "shared", "fp32", False)
    rows = e2e_rows(window(noisy=(key,)), CPU, num_envs=1)
    row = by_name(rows)["end-to-end [cpu]: shared, fp32, serial, 1 env"]
    # per-round ratios 0.7 x 190 / (0.99 x 200), 190 / 200, 1.3 x 190 / (1.01 x 200)
    assert row.spread == pytest.approx((1.3 / 1.01 - 0.7 / 0.99) * 190 / 200 / 0.95) and row.noisy
    line = next(line for line in format_table(rows).splitlines() if line.startswith(f"| {row.name} |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[4] == "" and cells[6] == "noisy (58%)"  # no ratio, no pass/MISS
    assert "too noisy" in verdict(rows) and f"{100 * NOISY_SPREAD:.0f}%" in verdict(rows)
    # a noisy learner probe makes every bound and end-to-end row that rests on it noisy too
    rows = by_name(e2e_rows(window(noisy=("learner[cpu]/madqn-bf16",)), CPU, num_envs=1))
    assert rows["bound [cpu]: shared, bf16"].noisy and rows["end-to-end [cpu]: shared, bf16, serial, 1 env"].noisy
    assert not rows["end-to-end [cpu]: shared, fp32, serial, 1 env"].noisy


def test_end_to_end_above_the_component_bound_is_not_reported_as_a_pass():
    """The contradiction issue 14 saw: a learner row at 2.11 updates/s (bound 16.9 agent steps/s) next to an
    end-to-end run of 181, with steady repeats each."""
    rows = e2e_rows(window(learner_fp32=2.11, e2e={e2e_key(CPU, "shared", "fp32", False): 181.0}), CPU, 1)
    row = by_name(rows)["end-to-end [cpu]: shared, fp32, serial, 1 env"]
    assert row.limit == pytest.approx(2.11 * 8) and row.inconsistent and row.noisy
    table = format_table(rows)
    assert "noisy (above bound)" in table and "beat the bound" in table.splitlines()[0]
    assert "10.7" not in table  # the contradictory ratio is not printed


def test_learner_rows_peak_fraction_and_channels_last():
    flops = 2.18e9
    rows = by_name(learner_rows(window(), CPU, flops, threads=1, sample_ms=0.1))
    fp32 = rows["learner [cpu]: LearnerSet.learn fp32 (sample, convert, DQN3.0 update)"]
    assert fp32.ratio == pytest.approx(25 / 26) and fp32.passed
    assert rows['learner [cpu]: LearnerSet.learn bf16 (precision = "bf16")'].ratio == pytest.approx(40 / 26)
    arith = rows["learner [cpu]: achieved arithmetic, bf16"]
    assert arith.value == pytest.approx(40 * 2.18) and arith.limit == pytest.approx(200.0)
    assert arith.passed is False  # 87 of 200 GFLOP/s is under half the peak
    assert rows["learner [cpu]: bare update, fp32 channels_last"].ratio == pytest.approx(30 / 26)
    assert rows["learner [cpu]: bare update, bf16 channels_last"].ratio == pytest.approx(44 / 45)
    assert rows["replay: sample(32) (one gather of 32x5 frames)"].note == "0.2% of an fp32 update"
    compiled = rows["learner [cpu]: LearnerSet.learn bf16, compile = true"]
    assert compiled.ratio == pytest.approx(60 / 64) and compiled.passed  # within 0.9x of the compiled bare update
    assert rows["learner [cpu]: LearnerSet.learn bf16, compiled vs eager"].ratio == pytest.approx(60 / 40)


def test_compared_in_milliseconds_with_the_ratio_taken_per_round():
    t = Timings({"a": [500.0, 500.0, 500.0], "b": [1000.0, 800.0, 1250.0]})
    row = compared(t, "acting", "a", "b", "ms/step", inverse=True, check=lambda ratio: ratio <= 2.0)
    assert (row.value, row.limit) == pytest.approx((2.0, 1.0))  # medians of 2, 2, 2 ms and 1, 1.25, 0.8 ms
    assert row.ratio == pytest.approx(2.0) and row.passed  # median of 2/1, 2/1.25, 2/0.8
    assert row.spread == pytest.approx((2.5 - 1.6) / 2.0)


def test_a_load_change_that_slows_a_figure_and_its_limit_alike_is_not_noise():
    """Round 2 ran at half speed for both probes: each probe's repeats differ by 2x, their ratio does not."""
    t = Timings({"value": [100.0, 50.0, 100.0], "limit": [200.0, 100.0, 200.0]})
    row = compared(t, "x", "value", "limit", "updates/s")
    assert spread(t.rates["value"]) == pytest.approx(0.5) and row.spread == 0.0 and not row.noisy
    assert row.ratio == pytest.approx(0.5)


def test_interleaved_runs_every_probe_once_per_round_in_alternating_order():
    calls = []
    fns = {k: (lambda k=k: calls.append(k) or float(len(calls))) for k in ("a", "b", "c")}
    t = interleaved(fns, repeats=3)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert t.rates == {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]}
    assert t.median("a") == t["a"] == 6.0 and spread(t.rates["a"]) == pytest.approx(1.0)


@pytest.mark.parametrize("double", [False, True])
def test_update_flops_match_the_layer_shapes(double):
    """convnet_atari3 with 6 actions, one state: multiply-accumulates per layer (output size x fan-in)."""
    macs = {"conv1": 32 * 20 * 20 * (4 * 8 * 8), "conv2": 64 * 9 * 9 * (32 * 4 * 4), "conv3": 64 * 7 * 7 * (64 * 3 * 3),
            "fc": 512 * 3136, "out": 6 * 512}
    forward = 2 * sum(macs.values())  # FLOPs of one forward of one state
    assert forward == 18_692_096
    batch = 32
    # forwards: target on s2 (+ online on s2 for double DQN) and online on s; backward: weight gradients
    # of every layer, input gradients of every layer but conv1 (the frames need none)
    expected = batch * ((3 if double else 2) * forward + forward + (forward - 2 * macs["conv1"]))
    learner = Learner(DQN3ConvNet(6, 4, n_agents=2), lr=1e-4, lr_end=1e-4, lr_endt=1, learn_start=0, discount=0.99,
                      clip_delta=1.0, rescale_r=False, r_max=1.0, weight_cost=0.0, device="cpu", double=double)
    before = [p.detach().clone() for p in learner.online_network.parameters()]
    assert update_flops(learner, batch) == expected  # 2.18 GFLOP without double DQN
    assert all((p == b).all() for p, b in zip(learner.online_network.parameters(), before))  # weights untouched


def test_actor_scaling_rows_against_n_times_one_actor():
    from madqn.bench.distributed import actor_scaling_rows

    rows = actor_scaling_rows({1: 1000.0, 2: 1500.0, 3: 2000.0})
    assert [r.limit for r in rows] == [1000.0, 2000.0, 3000.0]
    assert rows[0].passed is None and rows[1].passed is True and rows[1].ratio == pytest.approx(0.75)
    assert rows[2].passed is False  # 2000 < 0.7 x 3000



def test_cuda_graph_rows_judge_the_captured_learner_against_the_captured_bare_update_and_2000_updates():
    from madqn.bench.learner import graph_rows
    from madqn.bench.e2e import gpu_rows

    k = "learner[cuda]"
    t = Timings({key: steady(v) for key, v in {
        f"{k}/madqn-fp32-graph": 2400.0, f"{k}/bare-fp32-graph": 4000.0, f"{k}/madqn-fp32": 235.0,
        f"{k}/madqn-bf16-graph": 1800.0, f"{k}/bare-bf16-graph": 3000.0, f"{k}/madqn-bf16": 200.0,
        e2e_key("cuda", "shared", "fp32", "graph"): 5000.0}.items()})
    rows = by_name(graph_rows(t, "cuda"))
    fp32 = rows["learner [cuda]: LearnerSet.learn fp32, cuda_graph + replay on the GPU"]
    assert fp32.ratio == pytest.approx(0.6) and fp32.passed  # 0.6 of the limit and 2400 >= 2000 updates/s
    bf16 = rows["learner [cuda]: LearnerSet.learn bf16, cuda_graph + replay on the GPU"]
    assert bf16.ratio == pytest.approx(0.6) and bf16.passed is False  # 1800 < 2000 updates/s
    assert rows["learner [cuda]: LearnerSet.learn fp32, captured vs eager"].ratio == pytest.approx(2400 / 235)
    (e2e,) = gpu_rows(t, "cuda", 8)
    assert e2e.passed and e2e.value == pytest.approx(5000.0) and "in 3 min" in e2e.note  # 1e6 / 5000 s = 3.3 min
