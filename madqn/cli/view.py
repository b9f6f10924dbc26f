"""``madqn plot`` (learning curves of run directories) and ``madqn video`` (trained agents playing)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from madqn.cli.registry import command
from madqn.envs.adapters import make_env
from madqn.errors import MadqnError
from madqn.evaluation.agents import Agents, checkpoint_path, load_for_play
from madqn.evaluation.plot import find_runs, group_variants, load_run, plot_learning_curves
from madqn.evaluation.video import check_video_path, format_score, record_episodes
from madqn.training.trainer import resolve_device


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 1200x450 (width x height in pixels), got {text!r}")
    return w, h


@command
def _plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot learning curves (score vs agent steps, per agent) of run directories",
                       description="Plot learning curves from the episodes.csv of each run: one panel per agent, "
                                   "one colour per variant (runs that differ only in seed), smoothed; several seeds "
                                   "of a variant are drawn as their mean with the spread shaded. A folder of runs "
                                   "(e.g. runs/) stands for every run in it.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or folders of run directories)")
    p.add_argument("--out", help="image file, .png (default RUN_DIR/plots/learning_curves.png for one run, "
                                 "runs/plots/learning_curves.png for several), .svg or .pdf")
    p.add_argument("--smooth", type=int, default=10, metavar="N", help="trailing mean over N episodes (default 10)")
    p.add_argument("--band", choices=["minmax", "std"], default="minmax",
                   help="shade across seeds: min..max (default) or mean +- std")
    p.add_argument("--size", type=parse_size, default=(1200, 450), metavar="WxH", help="pixels (default 1200x450)")
    p.add_argument("--dpi", type=int, default=100, help="dots per inch (default 100)")
    p.add_argument("--title", help="figure title")
    p.add_argument("--source", choices=["episodes", "eval"], default="episodes",
                   help="episodes: training episodes (episodes.csv, default); eval: the periodic evaluations "
                        "(eval.csv: each seat's mean score against random players, or in self-play, per evaluation)")
    p.set_defaults(func=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    if args.smooth < 1:
        raise MadqnError(f"--smooth must be >= 1, got {args.smooth}")
    runs = [load_run(r, source=args.source) for r in find_runs(args.runs)]
    out = Path(args.out) if args.out else (
        runs[0].run_dir / "plots" / "learning_curves.png" if len(runs) == 1 else Path("runs") / "plots" / "learning_curves.png")
    ylabel = None
    if args.source == "eval":
        ylabel = "evaluation score (raw" + (f", {args.smooth}-evaluation mean)" if args.smooth > 1 else ")")
    plot_learning_curves(runs, out, window=args.smooth, size=args.size, dpi=args.dpi, band=args.band,
                         title=args.title, ylabel=ylabel)
    print(f"wrote {out} ({args.size[0]}x{args.size[1]} px)")
    for label, members in group_variants(runs):
        print(f"  {label}: " + ", ".join(str(m.run_dir) for m in members))
    return 0


@command
def _video(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("video", help="record trained agents playing to .mp4 or .gif",
                       description="Load a run's checkpoint and record evaluation episodes (epsilon eval_ep, no "
                                   "life-loss terminals, as DQN3.0 evaluates) with each agent's score as a caption.")
    p.add_argument("run", metavar="RUN_DIR", help="run directory (its checkpoints/latest.pt) or a checkpoint file")
    p.add_argument("--out", help="video file, .mp4 or .gif (default RUN_DIR/videos/eval.mp4)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to record (default 1)")
    p.add_argument("--max-steps", type=int, help="cut each episode after this many steps (default: the run's video_length)")
    p.add_argument("--eps", type=float, help="exploration epsilon (default: the run's eval_ep)")
    p.add_argument("--seed", type=int, default=0, help="seed of the env and the exploration (default 0)")
    p.add_argument("--fps", type=float, help="frames per second (default: the env's render_fps, 15 for Atari)")
    p.add_argument("--env", help="env spec to play in (default: the run's env)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.set_defaults(func=run_video)


def run_video(args: argparse.Namespace) -> int:
    checkpoint = checkpoint_path(args.run)
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    out = check_video_path(args.out if args.out else run_dir / "videos" / "eval.mp4")
    if args.episodes < 1:
        raise MadqnError(f"--episodes must be >= 1, got {args.episodes}")
    state, config, epsilon = load_for_play(checkpoint, args.eps)
    max_steps = config.video_length if args.max_steps is None else args.max_steps
    try:
        env = make_env(args.env or config.env, config.replace(terminal_on_life_loss=False), seed=args.seed,
                       convert=False)
    except MadqnError as e:
        raise MadqnError(f"{e} (the run's env is '{config.env}'; pass --env SPEC to choose the env to play in)") from None
    try:
        agents = Agents.from_state(state, device=resolve_device(args.device), seed=args.seed, source=str(checkpoint))
        agents.check_env(env, str(checkpoint))
        start = time.time()
        recording = record_episodes(env, lambda obs, infos: agents.act(obs, infos, epsilon), out, args.episodes,
                                    max_steps, reset_fn=agents.reset, fps=args.fps)
    finally:
        env.close()
    print(f"wrote {out}: {recording.frames} frames, {args.episodes} episode(s) of {config.env} "
          f"(checkpoint at step {state['step']}, epsilon {epsilon}), {time.time() - start:.1f} s")
    agents = list(recording.episode_scores[0])
    width = max(len(a) for a in agents)
    print("  " + "episode".ljust(8) + "steps".rjust(7) + "".join(a.rjust(width + 2) for a in agents))
    for i, (scores, steps) in enumerate(zip(recording.episode_scores, recording.episode_steps)):
        print("  " + str(i + 1).ljust(8) + str(steps).rjust(7) + "".join(format_score(scores[a]).rjust(width + 2)
                                                                          for a in agents))
    return 0
