"""Episodes over ROS 2: how `robo-rl deploy episodes=N` and a twin that serves a task
(`robo-rl sim-bridge task=...`) agree on where an episode starts and ends, and how the twin
reports what happened in it.

Both topics carry std_msgs/String holding one JSON object.

    REQUEST_TOPIC, from deploy:
        {"event": "start", "run": r, "episode": k}   before episode k: the twin resets its task to its next seed
        {"event": "end", "run": r, "episode": k}     deploy's time for episode k ran out
    STATUS_TOPIC, from the twin:
        {"event": "started", "run": r, "episode": k, "seed": s, "max_s": T}   the reset is in the physics
        {"event": "ended", "run": r, "episode": k, "seed": s, "success": b, "stage": "...",
         "max_stage": i, "ticks": n, "reason": "success" | "time limit" | "ended by deploy"}

`run` names one deploy process, so a second deploy against the same twin starts afresh.

A real robot has no one answering `start`: deploy then runs its episodes back to back (or waits
for the operator between them), and the outcome is for the operator to judge.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from robo_rl.hardware.ros2.messages import String

REQUEST_TOPIC = "/robo_rl/episode/request"
STATUS_TOPIC = "/robo_rl/episode/status"


def encode(**fields: Any) -> String:
    return String(json.dumps(fields))


def decode(msg: Any) -> dict[str, Any] | None:
    """The JSON object a message holds, or None for anything else (a stray publisher's text)."""
    try:
        out = json.loads(msg.data)
    except (TypeError, ValueError):
        return None
    return out if isinstance(out, dict) and "event" in out else None


class EpisodeClient:
    """deploy's side: ask for an episode, learn whether a twin started it, and how it ended."""

    def __init__(self, transport: Any):
        self.run = f"{os.getpid()}-{time.time_ns()}"
        self._publish = transport.publisher(REQUEST_TOPIC, String)
        self._lock = threading.Lock()
        self._status: dict[tuple[str, int], dict[str, Any]] = {}
        transport.subscribe(STATUS_TOPIC, String, self._on_status)

    def _on_status(self, msg: Any) -> None:
        status = decode(msg)
        if status is not None and status.get("run") == self.run and isinstance(status.get("episode"), int):
            with self._lock:
                self._status[(str(status["event"]), status["episode"])] = status

    def start(self, episode: int, timeout_s: float = 2.0, retry_s: float = 0.25) -> dict[str, Any] | None:
        """Ask for episode `episode` and wait for the twin's `started` (None when nothing answers
        within `timeout_s`: a real robot). The request is repeated every `retry_s` because a
        publisher's first messages can go out before DDS has matched it with the subscriber."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._publish(encode(event="start", run=self.run, episode=episode))
            answered = self._wait(("started", episode), min(retry_s, max(0.0, deadline - time.monotonic())))
            if answered is not None:
                return answered
        return None

    def ended(self, episode: int) -> dict[str, Any] | None:
        """The twin's `ended` status of `episode` once it has arrived, else None (never blocks)."""
        with self._lock:
            return self._status.get(("ended", episode))

    def end(self, episode: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """Tell the twin deploy's time for `episode` is over; its `ended` status, or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ended(episode) is not None:
                break
            self._publish(encode(event="end", run=self.run, episode=episode))
            self._wait(("ended", episode), min(0.25, max(0.0, deadline - time.monotonic())))
        return self.ended(episode)

    def _wait(self, key: tuple[str, int], timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if key in self._status:
                    return self._status[key]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)


class EpisodeServer:
    """The twin's side: requests arrive on the transport's thread and are queued for the control
    loop, which owns the physics (`take_requests`); statuses are published from there."""

    def __init__(self, transport: Any):
        self._publish = transport.publisher(STATUS_TOPIC, String)
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        transport.subscribe(REQUEST_TOPIC, String, self._on_request)

    def _on_request(self, msg: Any) -> None:
        request = decode(msg)
        if (request is not None and request["event"] in ("start", "end") and isinstance(request.get("episode"), int)
                and isinstance(request.get("run"), str)):
            with self._lock:
                self._requests.append(request)

    def take_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._requests = self._requests, []
        return out

    def publish(self, **status: Any) -> None:
        self._publish(encode(**status))
