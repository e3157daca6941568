"""The real-time parts of the control loop: a robot commanded every tick by an action source: a
policy thinking in its own thread (PolicyChunks), a human on a teleop device, or both under the
RaC intervention protocol (robo_rl/runtime/sources.py). The loop itself is the episode loop
(robo_rl/runtime/episodes.py); a `Controller` run is one episode of it on the real-time clock.

Three cadences, kept apart:
- command: the loop ticks at `hz` against absolute deadlines (t0 + k / hz), so a late tick never
  shifts the ones after it; it sleeps until just before a deadline and spins the rest.
- inference (PolicyChunks): a worker thread predicts a chunk from the newest observation window
  whenever the current chunk has `n_action_steps` or fewer actions left to run. The loop never
  waits for it.
- recording: `on_record(obs, executed)` is called at `record_hz` (default: `hz`), on the record
  clock, so a dataset is written at its declared fps whatever the command rate.

Chunks carry absolute time: action i of a chunk predicted from the observation taken at time t is
meant for t + i / hz. When a chunk arrives, the actions whose time has passed while the policy
was thinking are dropped (and counted), and execution starts at the one due now. The first
`blend_steps` commands after a hand-over move linearly from the old chunk's continuation to the
new chunk, so the commanded joints do not jump.

Temporal ensembling (`ensemble=True`, ACT's; the camera recipe's default): the worker predicts
again as soon as it is idle (at most every `query_every` ticks), and each tick's command is the
weighted mean of the actions due now in every chunk that still covers it, each on its own
absolute time; there is no hand-over to blend.

Real-time chunking (`rtc=True`, robo_rl/policies/rtc.py): each request also hands the predictor
the current chunk's actions from the request's tick on and the delay d in ticks, estimated from
the slowest recent inference; the new chunk then agrees with the old one where they overlap (its
first d actions are the old ones, which run while it is computed), so there is no blend.

At the end, `ControllerReport` has the timing table: tick period p50/p99/max, overruns, inference
latency, late chunks (not there by the tick after their request), dropped and missing actions, the largest joint jump at a chunk hand-over, watchdog
holds/stops and the safety filter's counts.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.runtime.chunking import ensemble_mean


@dataclass
class ControllerConfig:
    hz: float = 50.0                 # command rate
    record_hz: float | None = None   # recording rate (None: the command rate)
    n_obs: int = 2                   # observation frames per policy window
    n_action_steps: int = 8          # predict again when this many actions or fewer are left
    blend_steps: int = 4             # hand-over ramp (ticks); unused with rtc
    rtc: bool = False                # real-time chunking: the predictor takes (window, previous, delay)
    rtc_latency_window: int = 5      # rtc: the delay is the slowest of the last this many inferences
    # ACT's temporal ensembling: a chunk as often as inference allows (at most every query_every
    # ticks), each tick's command the mean of every chunk covering it, the i-th oldest weighted
    # exp(-ensemble_decay * i); n_action_steps and blend_steps are then unused
    ensemble: bool = False
    query_every: int = 1
    ensemble_decay: float = 0.01
    spin_s: float = 0.002            # busy-wait this long before each deadline (sleep is coarse)

    def validate(self) -> None:
        if self.hz <= 0 or (self.record_hz is not None and not 0 < self.record_hz <= self.hz):
            raise ConfigError(f"controller: hz={self.hz}, record_hz={self.record_hz}; need hz > 0 and 0 < record_hz <= hz")
        if self.n_obs < 1 or self.n_action_steps < 1 or self.blend_steps < 0:
            raise ConfigError("controller: n_obs and n_action_steps must be >= 1, blend_steps >= 0")
        if self.ensemble and (self.rtc or self.query_every < 1):
            raise ConfigError("controller: temporal ensembling needs query_every >= 1 and does not combine with rtc "
                              "(rtc makes each chunk agree with the one running instead of averaging them)")


@dataclass
class TimedChunk:
    start: float          # the time action 0 is for (the observation's time)
    actions: np.ndarray   # (H, A)


@dataclass
class ControllerReport:
    ticks: int = 0
    period_ms: list[float] = field(default_factory=list)
    overruns: int = 0                 # ticks that started more than one period late
    inference_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    dropped_actions: int = 0          # actions whose time passed before their chunk arrived
    late_chunks: int = 0              # chunks that missed their deadline: not there by the tick after their request
    missing_actions: int = 0          # ticks with no action due (no chunk yet, or a chunk ran out): held
    handover_jumps: list[float] = field(default_factory=list)  # per hand-over: the largest joint change (rad) that tick
    recorded: int = 0
    watchdog_holds: int = 0
    watchdog_stops: int = 0
    tracking_stops: int = 0           # runs stopped because the robot did not follow its commands
    stopped_reason: str = ""
    interrupted: bool = False         # Ctrl-C ended the run (a normal way to stop teleop)
    safety: dict[str, int] = field(default_factory=dict)

    def add(self, other: "ControllerReport") -> "ControllerReport":
        """Fold in the report of a later run (the next episode): counts add up, samples join."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, dict):
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0) + v
            elif isinstance(mine, bool):
                setattr(self, f.name, mine or theirs)
            elif isinstance(mine, int):
                setattr(self, f.name, mine + theirs)
            elif theirs:  # the stop reason: the latest
                setattr(self, f.name, theirs)
        return self

    def summary(self) -> dict[str, Any]:
        def pct(x: list[float], q: float) -> float:
            return float(np.percentile(x, q)) if x else float("nan")

        return {"ticks": self.ticks, "period_p50_ms": pct(self.period_ms, 50), "period_p99_ms": pct(self.period_ms, 99),
                "period_max_ms": max(self.period_ms, default=float("nan")), "overruns": self.overruns,
                "inference_p50_ms": pct(self.inference_ms, 50), "inference_p99_ms": pct(self.inference_ms, 99),
                "chunks": self.chunks, "late_chunks": self.late_chunks, "dropped_actions": self.dropped_actions,
                "missing_actions": self.missing_actions,
                "handover_jump_max": max(self.handover_jumps, default=0.0),
                "recorded": self.recorded, "watchdog_holds": self.watchdog_holds,
                "watchdog_stops": self.watchdog_stops, "tracking_stops": self.tracking_stops,
                "stopped_reason": self.stopped_reason,
                "interrupted": self.interrupted, **self.safety}


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


def wait_until(deadline: float, spin_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep to just before `deadline` (sleep wakes late by up to a millisecond or so), then spin."""
    remaining = deadline - clock()
    if remaining > spin_s:
        time.sleep(remaining - spin_s)
    while clock() < deadline:
        pass


def observation_window(history: list[Any]) -> dict[str, np.ndarray]:
    """The default policy input from the last To observations: joint positions, camera frames and
    any extra keys, each (1, To, ...)."""
    window = {"obs/qpos": np.stack([o.qpos for o in history])[None]}
    for cam in history[-1].images:
        window[f"obs/images/{cam}"] = np.stack([o.images[cam] for o in history])[None]
    for key in history[-1].extra:
        window[key] = np.stack([o.extra[key] for o in history])[None]
    return window


class ActionSource(Protocol):
    """Who commands the robot. The Controller asks once per tick, after observing."""

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        """The command due at `deadline` (the tick's scheduled time) given the newest observations,
        or None to hold the last command."""
        ...

    def close(self) -> None: ...


class PolicyChunks:
    """A policy as an action source: chunks predicted in an InferenceWorker thread from the newest
    observation window, executed on absolute time (late actions dropped), blended at hand-over,
    or with `config.rtc` made to agree with the old chunk by the predictor itself."""

    def __init__(self, predict: Callable[[Mapping[str, np.ndarray]], np.ndarray], config: ControllerConfig,
                 make_window: Callable[[list[Any]], dict[str, np.ndarray]] = observation_window):
        self.config, self.make_window = config, make_window
        self.period = 1.0 / config.hz
        self.worker = InferenceWorker(predict)
        self.current: TimedChunk | None = None
        self._blend_from: TimedChunk | None = None
        self._blend_left = 0
        self._last_action: np.ndarray | None = None
        self._handover = False
        self.live: list[TimedChunk] = []      # ensemble: the chunks still covering a tick, oldest first
        self._last_request: float | None = None

    def begin(self) -> None:
        """A new episode: no chunk, no blend, and nothing the worker computed before counts."""
        self.worker.discard()
        self.current, self._blend_from, self._blend_left = None, None, 0
        self._last_action, self._handover = None, False
        self.live, self._last_request = [], None

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        if self.config.ensemble:
            return self._ensembled(deadline, history, report)
        cfg, period = self.config, self.period
        # a new chunk: drop what is already past, blend from the old one's continuation
        chunk = self._take(deadline, report)
        if chunk is not None:
            if self.current is not None and cfg.blend_steps > 0 and not cfg.rtc:
                self._blend_from, self._blend_left = self.current, cfg.blend_steps
            self._handover = self.current is not None
            self.current = chunk
        current = self.current
        index = None if current is None else int(round((deadline - current.start) / period))
        due = current is None or len(current.actions) - index <= cfg.n_action_steps
        if len(history) == cfg.n_obs and due and self.worker.idle:  # no window built while one is computing
            extra = {}
            if cfg.rtc and current is not None:  # the old plan from this tick on, and how late the new one will be
                delay = int(math.ceil(self.worker.slowest_recent(cfg.rtc_latency_window) / 1e3 / period))
                extra = {"previous": current.actions[max(index, 0):][None], "delay": delay}
            self.worker.request(deadline, self.make_window(history), **extra)
        if current is None or not 0 <= index < len(current.actions):
            return None
        action = current.actions[index]
        if self._blend_left > 0:
            j = int(round((deadline - self._blend_from.start) / period))
            if 0 <= j < len(self._blend_from.actions):
                w = self._blend_left / (cfg.blend_steps + 1)
                action = w * self._blend_from.actions[j] + (1 - w) * action
            self._blend_left -= 1
        if self._handover and self._last_action is not None:  # the first tick on a new chunk
            report.handover_jumps.append(float(np.abs(np.asarray(action) - self._last_action).max()))
        self._handover, self._last_action = False, np.asarray(action, np.float64)
        return action

    def _take(self, deadline: float, report: ControllerReport) -> TimedChunk | None:
        """The chunk the worker finished, if any, counted with the actions whose time has passed."""
        chunk = self.worker.take()
        if chunk is not None:
            report.chunks += 1
            passed = int(np.floor((deadline - chunk.start) / self.period + 1e-6))
            report.dropped_actions += max(0, min(passed, len(chunk.actions)))
            # asked for at one tick, a chunk is due at the next: ensembling wants a fresh one every tick
            report.late_chunks += passed > 1
        return chunk

    def _ensembled(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        """Temporal ensembling on absolute time: every chunk that has an action due at `deadline`
        takes part, so a slow inference only means fewer chunks in the mean, never a held tick."""
        cfg, period = self.config, self.period
        chunk = self._take(deadline, report)
        if chunk is not None:
            self._handover = bool(self.live)
            self.live.append(chunk)
        due = [(c, int(round((deadline - c.start) / period))) for c in self.live]
        due = [(c, i) for c, i in due if i < len(c.actions)]
        self.live = [c for c, _ in due]
        wait = cfg.query_every * period - 1e-6
        if (len(history) == cfg.n_obs and self.worker.idle
                and (self._last_request is None or deadline - self._last_request >= wait)):
            self.worker.request(deadline, self.make_window(history))
            self._last_request = deadline
        actions = [c.actions[i] for c, i in due if i >= 0]
        if not actions:
            return None
        action = ensemble_mean(actions, cfg.ensemble_decay)  # self.live is oldest first, as ACT weights it
        if self._handover and self._last_action is not None:  # the first tick a new chunk joins the mean
            report.handover_jumps.append(float(np.abs(action - self._last_action).max()))
        self._handover, self._last_action = False, np.asarray(action, np.float64)
        return action

    def close(self) -> None:
        self.worker.close()

    def latencies(self) -> list[float]:
        return self.worker.latencies()


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
        from robo_rl.runtime.episodes import as_sources  # episodes.py is built on this module's parts

        config.validate()
        self.robot, self.config, self.safety, self.watchdog, self.estop = robot, config, safety, watchdog, estop
        self.on_record, self.clock = on_record, clock
        self.source = as_sources(source, config, 1, make_window)

    def run(self, duration_s: float | None = None, stop: Callable[[], bool] | None = None) -> ControllerReport:
        """Run for `duration_s` (None: until `stop()` is true, checked every tick) and report.
        Ctrl-C ends the run with `report.interrupted` set."""
        from robo_rl.runtime.episodes import Episode, run_episodes

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
