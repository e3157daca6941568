"""The policy's own thread: `InferenceWorker` runs `predict(window) -> (H, A) chunk` on the
newest observation window it is handed, so the control loop never waits for a network. Each
chunk comes back stamped with the time of the observation it was predicted from (`TimedChunk`),
which is what lets the loop execute it on absolute time (robo_rl/runtime/sources.py, PolicyChunks)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class TimedChunk:
    start: float          # the time action 0 is for (the observation's time)
    actions: np.ndarray   # (H, A)


class InferenceWorker:
    """Runs `predict(window) -> (H, A) chunk` on the newest window it is handed, in a thread."""

    def __init__(self, predict: Callable[..., np.ndarray]):
        self.predict = predict
        self._request: tuple[float, dict[str, np.ndarray], dict[str, Any]] | None = None
        self._result: TimedChunk | None = None
        self._latencies: list[float] = []
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._busy = False
        self._generation = 0  # bumped by discard(): a result of an older request is dropped
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self._thread.start()

    def request(self, obs_time: float, window: dict[str, np.ndarray], **extra: Any) -> bool:
        """Ask for a chunk from this window (`extra` goes to `predict` too) unless one is being
        computed. True if accepted."""
        with self._cv:
            if self._busy or self._request is not None:
                return False
            self._request = (obs_time, window, extra)
            self._cv.notify()
            return True

    def discard(self) -> None:
        """Forget the request queued, the result waiting and the one being computed (a new episode)."""
        with self._cv:
            self._request, self._result = None, None
            self._generation += 1

    def take(self) -> TimedChunk | None:
        with self._cv:
            if self._error is not None:
                raise self._error
            out, self._result = self._result, None
            return out

    def latencies(self) -> list[float]:
        with self._cv:
            return list(self._latencies)

    @property
    def idle(self) -> bool:
        """Would a request be accepted now (nothing computing or queued)?"""
        with self._cv:
            return not self._busy and self._request is None

    def slowest_recent(self, n: int) -> float:
        """The longest of the last `n` inference latencies, ms (0 before the first)."""
        with self._cv:
            return max(self._latencies[-n:], default=0.0)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._request is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                (obs_time, window, extra), self._request = self._request, None
                self._busy, generation = True, self._generation
            t = time.perf_counter()
            try:
                chunk = np.asarray(self.predict(window, **extra), dtype=np.float32)
                if chunk.ndim == 3:  # a batch of one
                    chunk = chunk[0]
            except BaseException as e:  # surfaced to the loop by take()
                with self._cv:
                    self._error, self._busy = e, False
                return
            with self._cv:
                self._latencies.append((time.perf_counter() - t) * 1e3)
                if generation == self._generation:
                    self._result = TimedChunk(obs_time, chunk)
                self._busy = False

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)
