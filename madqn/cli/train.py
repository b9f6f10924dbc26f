"""``madqn train``: a new run or ``--resume RUN_DIR``, then the run summary."""

from __future__ import annotations

import argparse

from madqn.api import train
from madqn.cli.registry import command
from madqn.cli.summary import format_summary, summarize_run
from madqn.commands import resume_command
from madqn.config import parse_overrides


@command
def _train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train DQN3.0 agents in a PettingZoo env",
                       description="Train DQN3.0 agents (one shared or one Q-network per agent). "
                                   "Writes config.toml, episodes.csv, train.csv and checkpoints/ to the run directory.")
    p.add_argument("--env", help="PettingZoo Atari name (pong_v3), single-player Atari id (ALE/Pong-v5), "
                                 "'package.module:callable' or "
                                 "'path/to/file.py:callable' (default: the config's env, pong_v3)")
    p.add_argument("--config", help="TOML config file (see configs/); defaults are DQN3.0's")
    p.add_argument("--sharing", choices=["shared", "independent"], help="one Q-network for all agents, or one each")
    p.add_argument("--steps", type=int, help="training length in agent steps")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto: cuda when available)")
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"],
                   help="learner arithmetic: fp32 (DQN3.0, the default), bf16 (autocast forwards and backward; "
                        "weights, targets and optimizer stay fp32), auto (bf16 where the CPU/GPU has it natively); "
                        "the run's first line says which")
    p.add_argument("--run-dir", help="run directory (default runs/<env>-<sharing>-s<seed>-<time>)")
    p.add_argument("--force", action="store_true", help="overwrite an existing run directory")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its latest checkpoint, with its config (only steps, "
                        "device, num_threads, prog_freq, save_freq, save_replay and eval_* may change)")
    p.add_argument("--backend", choices=["local", "process", "ray"],
                   help="local (default: act and learn in turn, DQN3.0's order), process (actor processes on this "
                        "machine, this process learns) or ray (actor processes on a Ray cluster, this process "
                        "learns; pip install 'madqn[ray]')")
    p.add_argument("--actors", type=int, help="backend process or ray: number of actor processes")
    p.add_argument("--ray-address", help="backend ray: 'auto' or HOST:PORT joins a running cluster "
                                         "(default: start a local Ray instance)")
    p.add_argument("--learner-device", dest="learner_device", help="backend ray: the learner's device (= --device)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key (TOML value syntax), repeatable, e.g. --set learn_start=1000")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    overrides = parse_overrides(args.overrides)
    if args.learner_device is not None:
        args.device = args.learner_device
    for key in ("sharing", "steps", "seed", "device", "precision", "backend", "actors", "ray_address"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    result = train(args.env, args.config, run_dir=args.run_dir, resume=args.resume, force=args.force, **overrides)
    if result.stopped_by is not None:
        print(f"stopped by {result.stopped_by} at step {result.steps}; checkpoint saved to {result.checkpoint}; "
              f"resume with: {resume_command(result.run_dir)}", flush=True)
        return 0
    print(f"done: {result.steps} agent steps, {result.episodes} episodes, updates {result.updates}, "
          f"{result.wall_time:.1f} s; run directory {result.run_dir}")
    if result.evaluation is not None:
        scores = ", ".join(f"{a} {s:.3g}" for a, s in result.eval_scores.items()) or "no episode completed"
        print(f"final evaluation ({result.evaluation.episodes} episodes, epsilon {result.evaluation.epsilon}): "
              f"mean score {scores}")
    print(format_summary(summarize_run(result.run_dir, wall_time=result.wall_time)))
    return 0
