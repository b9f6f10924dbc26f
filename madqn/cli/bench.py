"""``madqn bench``: the speed table of madqn.bench (docs/benchmarks.md), printed and optionally written."""

from __future__ import annotations

import argparse
import time

import torch

from madqn.bench import format_table, machine_description, run_bench
from madqn.cli.registry import command
from madqn.errors import MadqnError


@command
def _bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure madqn's speed against the machine's limits (one table)",
                       description="Times the env pipeline, learner, replay, acting and end-to-end training, each "
                                   "next to its limit measured in the same run (medians of interleaved repeats).")
    p.add_argument("--quick", action="store_true", help="fewer repeats and shorter runs (about 3 minutes on 2 cores)")
    p.add_argument("--device", default="auto", help="auto (also CUDA rows when a GPU is present), cpu, cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--num-envs", type=int, default=1, help="env copies for the acting and end-to-end rows")
    p.add_argument("--distributed", action="store_true",
                   help="add the Ray backend rows (1 and 2 actors vs the local backend; needs madqn[ray])")
    p.add_argument("--only-distributed", action="store_true", help="only the distributed rows")
    p.add_argument("--out", help="also write the table (markdown, with the machine) to this file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.num_envs < 1:
        raise MadqnError("--num-envs must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description(args.device)
    start = time.time()
    rows = run_bench(args)
    text = (f"Machine: {machine}\n\n{format_table(rows)}\n\n"
            f"(`madqn bench{' --quick' if args.quick else ''}`, {time.time() - start:.0f} s)\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0
