"""Progress on the terminal: a live tqdm bar on a TTY, plain log lines everywhere else.

DQN3.0 printed a status line every ``prog_freq`` steps; that is what a log file or CI gets here
(``step N/T (p%) | S steps/s | ETA h:mm:ss | field value | ...``). On a terminal the same numbers
live in one tqdm bar (done/total, rate and ETA from tqdm, the fields as its postfix) instead.
``Progress`` knows nothing about training, so evaluation and comparison loops can use it too;
``ProgressHook`` feeds it from a ``Trainer``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from typing import Any, Callable, Mapping, TextIO

from madqn.training.trainer import EpisodeRecord, Hook, Trainer

Fields = Mapping[str, str]


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (``?`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_number(x: float) -> str:
    """Four significant digits; ``nan`` for a statistic with no data yet."""
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4g}"


def format_rate(x: float) -> str:
    """A rate with the digits that matter: ``812``, ``4.2``, ``0.35`` (``?`` when unknown)."""
    if x is None or not math.isfinite(x):
        return "?"
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


class WindowRate:
    """Rate of a counter over the last ``window_s`` seconds: it follows the current phase (the
    acting-only steps before ``learn_start`` run ten times faster than learning ones), where a mean
    since the start, or an exponential average fed at irregular times, lags for minutes."""

    def __init__(self, window_s: float = 15.0):
        self.window_s = window_s
        self.points: deque[tuple[float, float]] = deque()

    def add(self, t: float, done: float) -> None:
        self.points.append((t, done))
        while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:
            self.points.popleft()  # keep one point at or beyond the window's start

    def rate(self) -> float:
        if len(self.points) < 2:
            return math.nan
        (t0, d0), (t1, d1) = self.points[0], self.points[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else math.nan


def _windowed_tqdm():
    """tqdm whose rate (and so its ETA) is ``Progress``'s windowed rate, not tqdm's own average."""
    from tqdm import tqdm

    class WindowedTqdm(tqdm):
        window: WindowRate | None = None

        @property
        def format_dict(self):
            d = super().format_dict
            rate = self.window.rate() if self.window is not None else math.nan
            if math.isfinite(rate) and rate > 0:
                d["rate"] = rate
            return d

    return WindowedTqdm


def _terminal_width(out: TextIO) -> int:
    """Columns of the terminal behind ``out``; 0 when unknown (a pseudo-terminal nobody sized)."""
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


class Progress:
    """Progress of a counted loop (``done`` out of ``total`` steps).

    ``update(done, fields)`` moves to ``done`` (absolute). On a terminal (``tty``; default: ``out``
    is a TTY) a tqdm bar shows done/total, steps/s, ETA and ``fields`` as ``key=value``, refreshed
    at most every ``refresh_s`` seconds. Otherwise one line per ``every`` steps, and one whenever
    ``quiet_s`` seconds passed without a line (a slow learning phase must not look hung), and a final
    one in ``close``: done/total, steps/s since the previous line, ETA at that rate, then the fields.
    ``fields`` may be a zero-argument callable, called only when something is shown.
    """

    def __init__(self, total: int, *, every: int, desc: str = "", initial: int = 0, unit: str = "step",
                 out: TextIO | None = None, tty: bool | None = None, refresh_s: float = 0.5,
                 quiet_s: float | None = 60.0):
        self.quiet_s = quiet_s
        self.total = int(total)
        self.every = max(int(every), 1)
        self.desc = desc
        self.unit = unit
        self.out = sys.stdout if out is None else out
        self.tty = bool(getattr(self.out, "isatty", lambda: False)()) if tty is None else tty
        self.refresh_s = refresh_s
        self.initial = self.done = self.shown = int(initial)
        self.start = self.last_time = time.monotonic()
        self.last_done = self.done
        self.next_line = (self.done // self.every + 1) * self.every
        self.bar = None
        self.last_fields = -math.inf
        self.window = WindowRate()
        self.window.add(self.start, self.done)
        if self.tty:
            width = _terminal_width(self.out)
            # miniters=1: refresh on time alone (tqdm's adaptive miniters, tuned in a fast phase, would
            # refresh a slow phase only every few tens of seconds)
            self.bar = _windowed_tqdm()(total=self.total, initial=self.done, desc=desc or None, unit=unit,
                                        file=self.out, dynamic_ncols=width > 0, ncols=None if width > 0 else 120,
                                        nrows=None if width > 0 else 24, mininterval=refresh_s, miniters=1)
            self.bar.window = self.window

    def update(self, done: int, fields: Fields | Callable[[], Fields] | None = None) -> None:
        self.done = int(done)
        self.window.add(time.monotonic(), self.done)
        if self.bar is not None:
            self.bar.update(self.done - self.bar.n)
            now = time.monotonic()
            if fields is not None and now - self.last_fields >= self.refresh_s:
                self.last_fields = now
                self.bar.set_postfix_str(self._postfix(fields), refresh=False)
        elif self.done >= self.next_line or (self.quiet_s is not None and self.done > self.shown
                                             and time.monotonic() - self.last_time >= self.quiet_s):
            self.print_line(fields)
            self.next_line = (self.done // self.every + 1) * self.every

    def print_line(self, fields: Fields | Callable[[], Fields] | None = None) -> None:
        """Print the plain status line now (on a terminal: above the bar)."""
        now = time.monotonic()
        rate = (self.done - self.last_done) / max(now - self.last_time, 1e-9)  # since the previous line
        eta = (self.total - self.done) / rate if rate > 0 else math.inf  # at the current phase's rate
        pct = 100.0 * self.done / self.total if self.total else 100.0
        parts = [f"{self.desc + ' ' if self.desc else ''}{self.unit} {self.done}/{self.total} ({pct:.0f}%)",
                 f"{format_rate(rate)} {self.unit}s/s", f"ETA {format_duration(eta)}"]
        resolved = fields() if callable(fields) else (fields or {})
        parts += [f"{k} {v}" for k, v in resolved.items()]
        line = " | ".join(parts)
        if self.bar is not None:
            self.bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)
        self.last_done, self.last_time, self.shown = self.done, now, self.done

    def close(self, fields: Fields | Callable[[], Fields] | None = None) -> None:
        if self.bar is not None:
            if fields is not None:
                self.bar.set_postfix_str(self._postfix(fields), refresh=False)
            self.bar.close()
            self.bar = None
        elif self.done > self.shown:
            self.print_line(fields)

    @staticmethod
    def _postfix(fields: Fields | Callable[[], Fields]) -> str:
        resolved = fields() if callable(fields) else fields
        return " ".join(f"{k}={v}" for k, v in resolved.items())


class ProgressHook(Hook):
    """Training progress: agent steps done/total, steps/s, ETA, epsilon, learner updates, recent score per agent.

    Plain lines (no TTY) come every ``prog_freq`` agent steps, as DQN3.0 printed them, and also show
    each learner's mean |clipped delta| and Q(s, a) published by ``MetricsHook``'s report (register
    this hook after it). ``window``: episodes in the recent mean score.
    """

    def __init__(self, out: TextIO | None = None, tty: bool | None = None, window: int = 20):
        self.out, self.tty, self.window = out, tty, window
        self.progress: Progress | None = None
        self.recent: dict[str, deque] = {}
        self.learner_stats: dict[str, dict[str, float]] = {}

    def on_start(self, trainer: Trainer) -> None:
        c = trainer.config
        self.recent = {a: deque(maxlen=self.window) for a in trainer.agents}
        self.trainer = trainer
        self.progress = Progress(c.steps, every=c.prog_freq, initial=trainer.step, out=self.out, tty=self.tty,
                                 desc="train")

    def on_episode(self, trainer: Trainer, record: EpisodeRecord) -> None:
        for agent, score in record.scores.items():
            if agent not in record.opponent_seats():  # the recent scores are the networks'
                self.recent[agent].append(score)

    def on_scalars(self, trainer: Trainer, step: int, scalars: dict[str, float]) -> None:
        for g in trainer.groups:
            for key, label in (("td_error", "td_error"), ("q_mean", "Q")):
                if f"{key}/{g.name}" in scalars:
                    self.learner_stats.setdefault(g.name, {})[label] = scalars[f"{key}/{g.name}"]

    def on_step(self, trainer: Trainer) -> None:
        self.progress.update(trainer.step, self.fields)

    def on_end(self, trainer: Trainer) -> None:
        if self.progress is not None:
            self.progress.update(trainer.step, self.fields)
            self.progress.close(self.fields)

    def fields(self) -> dict[str, str]:
        t = self.trainer
        out = {"eps": f"{t.epsilon():.3f}"}
        counts = [g.updates for g in t.groups]
        scores = {a: sum(d) / len(d) for a, d in self.recent.items() if d}
        if self.progress.tty:  # compact, for the bar
            same = len(set(counts)) == 1
            out["updates"] = (f"{counts[0]}" + (f"x{len(counts)}" if len(counts) > 1 else "")) if same \
                else "/".join(map(str, counts))
            out.update({a: f"{s:.2f}" for a, s in scores.items()})
            return out
        for g in t.groups:
            stats = self.learner_stats.get(g.name, {})
            out[f"{g.name}: updates"] = f"{g.updates}" + "".join(
                f" {label} {format_number(v)}" for label, v in stats.items())
        if scores:
            out[f"score({self.window} ep)"] = " ".join(f"{a} {s:.2f}" for a, s in scores.items())
        return out



def eval_eta(elapsed: float, episodes: int, steps: int, *, total_episodes: int | None = None,
             max_steps: int | None = None, max_seconds: float | None = None) -> float:
    """Seconds until an evaluation ends: the first of its bounds (episodes, agent steps, seconds) that
    the rates so far reach; ``inf`` when none is set or no rate is known yet."""
    etas = [math.inf]
    if total_episodes is not None and episodes > 0:
        etas.append((total_episodes - episodes) * elapsed / episodes)
    if max_steps is not None and steps > 0:
        etas.append((max_steps - steps) * elapsed / steps)
    if max_seconds is not None:
        etas.append(max_seconds - elapsed)
    return max(min(etas), 0.0)


class EvalProgress:
    """Progress of an evaluation, one update per finished episode (call the object with the episode's
    agent steps, or with the ``madqn.evaluation.EvalResult`` that just completed one).

    Prints ``desc: episode k/N | e episodes/s | s agent steps | ETA h:mm:ss`` through ``tqdm.write``
    (a live training bar stays intact), at most every ``interval_s`` seconds, and always for the
    last episode. The ETA is that of the first bound reached (``eval_eta``).
    """

    def __init__(self, desc: str, *, episodes: int | None = None, max_steps: int | None = None,
                 max_seconds: float | None = None, out: TextIO | None = None, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.desc, self.total, self.max_steps, self.max_seconds = desc, episodes, max_steps, max_seconds
        self.out, self.interval_s, self.clock = out, interval_s, clock
        self.start = self.last_line = clock()
        self.episodes = self.steps = self.shown = 0

    def __call__(self, episode: Any) -> None:
        steps = episode.steps[-1] if hasattr(episode, "steps") else int(episode)
        self.episodes += 1
        self.steps += int(steps)
        now = self.clock()
        if now - self.last_line >= self.interval_s or self.episodes == self.total:
            self.print_line(now)

    def line(self, now: float | None = None) -> str:
        elapsed = max((self.clock() if now is None else now) - self.start, 1e-9)
        eta = eval_eta(elapsed, self.episodes, self.steps, total_episodes=self.total, max_steps=self.max_steps,
                       max_seconds=self.max_seconds)
        of = f"/{self.total}" if self.total is not None else ""
        return (f"{self.desc}: episode {self.episodes}{of} | {format_rate(self.episodes / elapsed)} episodes/s | "
                f"{self.steps:,} agent steps | ETA {format_duration(eta)}")

    def print_line(self, now: float | None = None) -> None:
        from tqdm import tqdm

        out = self.out if self.out is not None else sys.stdout
        tqdm.write(self.line(now), file=out)
        out.flush()
        self.last_line, self.shown = self.clock() if now is None else now, self.episodes

    def close(self) -> None:
        """Print the last line if the last episodes were not shown."""
        if self.episodes > self.shown:
            self.print_line()
