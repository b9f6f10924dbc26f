"""Overlap mode (``overlap = true``): learning rounds run in a background thread while the actor acts.

The actor (the trainer's main thread) keeps DQN3.0's schedule: every ``update_freq`` agent steps it
submits ``n_replay`` updates per learner (and the target sync when ``target_q`` is crossed), exactly
the sequence the serial loop runs. Here the rounds queue up for one learner thread, and the actor may
run ahead by at most ``max_lag`` rounds: submitting more blocks until the oldest round is done, so
the update ratio holds over any window and the replay never outruns the learner by more than
``max_lag * update_freq`` steps. Torch kernels, ALE and cv2 release the GIL, so the thread runs
while the actor emulates and acts.

The actor acts with a snapshot of the weights refreshed after every round (madqn.core.policy), i.e. with
weights at most ``max_lag`` rounds old; replay writes and minibatch sampling are serialised by a
lock. Results are no longer bit-for-bit reproducible (thread timing decides which transitions a
round sees): that is why ``overlap`` is off by default.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class BackgroundLearner:
    """One thread running a learner set's rounds (``run_round``) in submission order, at most ``max_lag``
    behind; ``after_round`` (the acting snapshot's refresh) runs in the thread after each round."""

    def __init__(self, learners: Any, after_round: Callable[[], None], max_lag: int = 1):
        self.learners = learners
        self.after_round = after_round
        self.replay_lock = threading.Lock()  # held by the actor while it writes replay, by us while sampling
        self._requests: queue.Queue = queue.Queue()
        self._free = threading.Semaphore(max_lag)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="madqn-learner", daemon=True)
        self._thread.start()

    def submit(self, n_updates: int, step: int, sync_target: bool) -> None:
        """Queue ``n_updates`` updates per learner for agent step ``step`` (then a target sync if asked)."""
        self._raise_error()
        if n_updates == 0 and not sync_target:
            return
        self._free.acquire()  # blocks while max_lag rounds are in flight
        self._raise_error()
        self._requests.put((n_updates, step, sync_target))

    def drain(self) -> None:
        """Wait until every submitted round is done (hooks and checkpoints then see settled weights)."""
        self._requests.join()
        self._raise_error()

    def close(self) -> None:
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            try:
                if item is None:
                    return
                if self._error is not None:
                    continue  # failed: drop the rest, the actor raises on its next call
                n_updates, step, sync_target = item
                self.learners.run_round(n_updates, step, sync_target, replay_lock=self.replay_lock)
                self.after_round()
            except BaseException as e:  # surfaced in the actor's thread
                self._error = e
            finally:
                self._requests.task_done()
                if item is not None:
                    self._free.release()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the background learner failed: {self._error!r}") from self._error
