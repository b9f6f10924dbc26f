"""The benchmarks behind ``madqn bench``: every speed figure next to the limit it is measured against, in the same run.

Every timed figure is a *probe* (a function returning a rate). All probes of a bench run, the
components and the end-to-end training runs alike, are timed in ONE measurement window: round after
round, each probe once per round, the order reversed every other round. A ratio is taken inside
each round (a figure and its limit ran minutes apart at most, under the same load) and the table
reports the median over rounds, next to the median figures. When a row's per-round ratios disagree
by more than ``NOISY_SPREAD`` (or an end-to-end run beats the bound the component rows allow), the
machine was too noisy: the row shows "noisy" instead of a ratio and a pass/MISS.

- env: ``AtariEnv.step`` decisions/s vs the bare emulator (ALE's C ``actMulti``, ``action_repeat``
  frames per decision, no screen read);
- peak: a large fp32 and a large bf16 matmul, the arithmetic the core can do at best;
- learner: ``LearnerSet.learn`` (replay sampling, uint8 tensors, DQN3.0 targets, gradient injection,
  DQN3RMSprop, bookkeeping) in fp32 and bf16 vs a bare PyTorch fp32 update of the same network, batch
  and threads (float input ready, target forward, Huber loss, backward, ``torch.optim.RMSprop``), and
  its achieved GFLOP/s as a fraction of the peak; the bare update also in bf16 and channels_last;
- replay: allocated bytes per transition per agent vs one 84x84 frame, and minibatch sampling time;
- extensions beyond DQN3.0 (Double, dueling, n-step, prioritized, Adam, all five): the update time of
  each vs the DQN3.0 update, prioritized sampling vs an update, the sum-tree's bytes per transition;
- acting: time to choose the actions of all agents of one env step, independent vs shared, and
  shared under bf16 autocast;
- end-to-end: agent steps/s of a pong_v3 training run (learning on, epsilon 0.1) vs the bound
  computed from the rows above, fp32 and bf16.

The rows run on CPU and, when CUDA is present, the learner and end-to-end rows again on CUDA.

One module per section (``env``, ``peak``, ``learner``, ``replay``, ``extensions``, ``acting``, ``e2e``,
``distributed``), the measuring in ``measure``, the table in ``table``, and ``run.run_bench`` putting the
sections into one window. A new figure is a :class:`Section` (a new module, or a function beside its
kin) added to ``run_bench``: its probes join the window, its ``rows`` turn the medians into rows. The
sections reach madqn only through its public API (configs, ``Trainer``, ``LearnerSet.learn``,
``ReplayMemory``, ``AtariEnv``). The command itself is ``madqn.cli.bench``.
"""

from __future__ import annotations

from madqn.bench.acting import acting_section
from madqn.bench.distributed import _RateProbe, bench_distributed
from madqn.bench.e2e import (BOUND_SLACK, CLEANRL_STEPS_PER_S, E2E_VARIANTS, bounds, e2e_key, e2e_rows, e2e_section,
                             e2e_trainer)
from madqn.bench.env import bench_pettingzoo_raw, env_section
from madqn.bench.extensions import EXTENSIONS, _extension_trainer, extensions_section
from madqn.bench.learner import _filled_trainer, bare_update, learner_rows, learner_section, update_flops
from madqn.bench.measure import Section, Timings, _sync, _threads, compared, interleaved, rate, spread
from madqn.bench.peak import peak_gflops, peak_section
from madqn.bench.replay import bench_prioritized_bytes, bench_replay_bytes
from madqn.bench.run import run_bench
from madqn.bench.table import NOISY_SPREAD, Row, _fmt, format_table, machine_description, verdict

__all__ = ["BOUND_SLACK", "CLEANRL_STEPS_PER_S", "E2E_VARIANTS", "EXTENSIONS", "NOISY_SPREAD", "Row", "Section",
           "Timings", "acting_section", "bare_update", "bench_distributed", "bench_pettingzoo_raw",
           "bench_prioritized_bytes", "bench_replay_bytes", "bounds", "compared", "e2e_key", "e2e_rows", "e2e_section",
           "e2e_trainer", "env_section", "extensions_section", "format_table", "interleaved", "learner_rows",
           "learner_section", "machine_description", "peak_gflops", "peak_section", "rate", "run_bench", "spread",
           "update_flops", "verdict"]
