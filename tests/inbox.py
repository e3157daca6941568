"""What a subscription delivered, for tests of real DDS traffic (callbacks come on DDS's thread)."""

from __future__ import annotations

import threading
import time
from typing import Any


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def __call__(self, msg: Any) -> None:  # the subscription callback
        with self._lock:
            self._items.append(msg)

    def items(self) -> list[Any]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def wait_for(self, n: int, timeout_s: float) -> list[Any]:
        """The messages once `n` have arrived, or whatever arrived within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while len(self) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.items()

    def stays_quiet(self, settle_s: float, window_s: float) -> bool:
        """After `settle_s` for what was in flight, does nothing arrive for `window_s`?"""
        time.sleep(settle_s)
        n = len(self)
        time.sleep(window_s)
        return len(self) == n
