"""`Controller`: one episode of the episode loop (robo_rl/runtime/episodes.py) on the real-time
clock, for the verbs that drive one robot until a time or a stop (`teleop`, `replay robot=`) and
for benchmarks. Its source is an ActionSource, Sources, or a bare `predict` function, which
becomes a thread-predicting PolicyChunks (robo_rl/runtime/sources.py).

At the end, `ControllerReport` has the timing table: tick period p50/p99/max, overruns, inference
latency, late chunks (not there by the tick after their request), dropped and missing actions,
the largest joint jump at a chunk hand-over, watchdog holds/stops and the safety filter's counts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from robo_rl.runtime.episodes import ControllerConfig, ControllerReport, Episode, run_episodes
from robo_rl.runtime.sources import as_sources, observation_window


class Controller:
    """Runs `robot` at `config.hz` with commands from `source` (an ActionSource, Sources, or a bare
    `predict` function, which becomes PolicyChunks), through `safety` (a SafetyFilter) and
    `watchdog` if given; `estop` (an EStop) ends the run at the next tick. With `safety`, a
    TrackingMonitor on the same limits stops the run when the robot does not follow (its message
    names the joints, and the robot's own advice where it has one, `not_following_hint()`: e.g.
    the topics the commands went to). One run is one episode of the episode loop
    (robo_rl/runtime/episodes.py), on the real-time clock."""

    def __init__(self, robot: Any, source: Any, config: ControllerConfig,
                 safety: Any = None, watchdog: Any = None, estop: Any = None,
                 on_record: Callable[[Any, np.ndarray], None] | None = None,
                 make_window: Callable[[list[Any]], dict[str, np.ndarray]] = observation_window,
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        self.robot, self.config, self.safety, self.watchdog, self.estop = robot, config, safety, watchdog, estop
        self.on_record, self.clock = on_record, clock
        self.source = as_sources(source, config, 1, make_window)

    def run(self, duration_s: float | None = None, stop: Callable[[], bool] | None = None) -> ControllerReport:
        """Run for `duration_s` (None: until `stop()` is true, checked every tick) and report.
        Ctrl-C ends the run with `report.interrupted` set."""
        ticks = None if duration_s is None else int(round(duration_s * self.config.hz))
        # the caller's limits rule a Controller run: a twin's task verdict does not end it
        episode = Episode(max_ticks=ticks, stop=stop, safety=self.safety, watchdog=self.watchdog,
                          end_on_success=False, end_on_time_limit=False)
        hooks = _OneEpisode(episode, self.on_record)
        return run_episodes([self.robot], self.source, self.config, hooks, estop=self.estop, clock=self.clock)


class _OneEpisode:
    """The episode loop's hooks for one Controller run: one episode, each recorded tick to `on_record`."""

    def __init__(self, episode: Any, on_record: Callable[[Any, np.ndarray], None] | None):
        self.episode, self.on_record = episode, on_record

    def start(self, i: int) -> Any:
        episode, self.episode = self.episode, None
        return episode

    def step(self, i: int, obs: Any, executed: np.ndarray, segment: Any, outcome: Any) -> None:
        if self.on_record is not None:
            self.on_record(obs, executed)

    def end(self, i: int, report: ControllerReport, outcome: Any) -> None:
        pass
