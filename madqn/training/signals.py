"""Graceful stops: SIGINT/SIGTERM end a run after the current step, with a checkpoint."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from madqn.training.trainer import TrainerBase


class StopOnSignal:
    """SIGINT/SIGTERM: the first asks the trainer to stop after the current step (the hooks then
    write a checkpoint and flush the metrics); a second exits at once with 128 + signal number.
    Checkpoints are written atomically, so exiting mid-write keeps the last complete one.
    Installed only in the main thread; the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer: TrainerBase):
        self.trainer = trainer
        self.received: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            self.trainer.stop_requested = True
            print(f"madqn: {name} received: finishing the current step, then writing a checkpoint "
                  "(send it again to exit at once)", file=sys.stderr, flush=True)
            return
        print(f"madqn: second {name}: exiting now without a new checkpoint; the last complete one is kept",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)


class NoSignals:
    """``StopOnSignal``'s stand-in when signals are left alone (``madqn.train(handle_signals=False)``)."""

    received = None

    def __enter__(self) -> "NoSignals":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
