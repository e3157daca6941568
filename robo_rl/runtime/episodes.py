"""The one episode loop: every closed-loop episode runs here, on the twin and on real arms alike.

    run_episodes(robots, sources, config, hooks, lockstep=...)

- `robots`: one or more Robots (robo_rl.hardware.robot.Robot: `observe()`, `act()`), each with
  what it has of `RobotExtras` (looked up once per run). A robot that also knows its task (the
  twin's TaskTwin) says after each step where the episode stands (`outcome()`: stage, success,
  time limit); a real robot does not, and its episodes end by time, by the source (RaC's END, a
  playback done) or by the caller's `stop`.
- `sources`: who commands each robot (`Sources` below; every kind is in robo_rl/runtime/sources.py).
  A policy in lockstep (`LockstepChunks`: one batched network call per tick for every robot that
  needs a new chunk), a policy thinking in its own thread (`PolicyChunks`), a human
  (`OperatorCommands`), a recording (`RecordedActions`), or a policy with a human who may take
  over (`Interventions`: the RaC protocol, each step labelled). `as_sources` makes Sources of one
  robot's source or of a bare `predict`.
- `hooks`: the caller's side (`EpisodeHooks`): which episode starts next on robot i (the
  twin's scene, the time limit, the safety filter), what to do with each recorded step, and
  each episode's end.
- the clock: real time or `lockstep` (virtual time, no waiting: the twin as fast as it steps).
  Real time ticks at `hz` against absolute deadlines (t0 + k / hz), so a late tick never shifts
  the ones after it; the loop sleeps until just before a deadline and spins the rest. Recording
  (`hooks.step`) runs on its own clock at `record_hz`, so a dataset is written at its declared
  fps whatever the command rate.

Each tick, for each robot running an episode: stop checks (e-stop, the caller's stop), observe,
the robot's own fault check (`fault()`, where it has one: a ROS 2 arm with a second writer on
its command topic), the tracking check (a robot that does not follow its commands stops the run), the watchdog; one
`sources.actions` call for all robots; then per robot the safety filter, `act`, the recording
(at `record_hz`), and the end check. An ended robot starts its next episode at once (the twin's
evaluation keeps all its envs busy), or goes idle; the loop ends when every robot is idle.

Evaluation (robo_rl/sim/rollout.py), intervention collection (robo_rl/sim/interventions.py),
critic rollouts (robo_rl/sim/critic_data.py), `robo-rl record`, `deploy`, `teleop` and `replay`
(through runtime.controller.Controller) all run here. The loop's config (`ControllerConfig`) and
its report (`ControllerReport`: the timing table, the counts of every stop) are here too.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from robo_rl.data.schema import IMAGE_PREFIX, Segment
from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Outcome, extras_of
from robo_rl.hardware.safety import TrackingMonitor


# ---------------------------------------------------------------------- the loop's config and report
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


def wait_until(deadline: float, spin_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep to just before `deadline` (sleep wakes late by up to a millisecond or so), then spin."""
    remaining = deadline - clock()
    if remaining > spin_s:
        time.sleep(remaining - spin_s)
    while clock() < deadline:
        pass



# ---------------------------------------------------------------------- what the loop is told
@dataclass
class Episode:
    """An episode about to start on one robot, as the caller's `start` hook describes it."""
    max_ticks: int | None = None            # time limit in ticks; None: the task's, the source's or `stop`
    stop: Callable[[], bool] | None = None  # checked every tick; True ends the episode
    safety: Any = None                      # a SafetyFilter (a TrackingMonitor comes with it)
    watchdog: Any = None
    end_on_success: bool = True             # the twin's task succeeded: the episode ends
    end_on_time_limit: bool = True          # the twin's task ran out of time: the episode ends


class EpisodeHooks(Protocol):
    def start(self, i: int) -> Episode | None:
        """Robot i's next episode, or None when it has no more: sets the scene (the twin resets
        from a seed). May block (a human presses a key to start)."""
        ...

    def step(self, i: int, obs: Any, executed: np.ndarray, segment: Segment, outcome: Outcome | None) -> None:
        """A recorded tick: the observation the action was chosen from, and the action as executed."""
        ...

    def end(self, i: int, report: ControllerReport, outcome: Outcome | None) -> None:
        """Robot i's episode ended (report.stopped_reason / interrupted say if it was cut short)."""
        ...


class Sources(Protocol):
    """Who commands the robots: asked once per tick for every robot running an episode."""

    def begin(self, i: int) -> None: ...  # robot i starts an episode
    def actions(self, deadline: float, histories: Mapping[int, list[Any]],
                reports: Mapping[int, ControllerReport]) -> dict[int, np.ndarray | None]:
        """The command due at `deadline` for each robot in `histories` (None: hold the last)."""
        ...
    def segment(self, i: int) -> Segment: ...   # the label of robot i's last command
    def ended(self, i: int) -> bool: ...        # the source ends robot i's episode (RaC's END, playback done)
    def end(self, i: int, task_done: bool) -> None: ...  # robot i's episode ended (task_done: on success)
    def latencies(self) -> list[float]: ...     # inference latencies, ms
    def close(self) -> None: ...


# ---------------------------------------------------------------------- observations as policy input
def observation_value(obs: Any, key: str) -> np.ndarray:
    """One observation's value for a store key: obs/qpos, obs/qvel, obs/images/<camera> or an extra key."""
    if key == "obs/qpos":
        return obs.qpos
    if key == "obs/qvel":
        return obs.qvel
    if key.startswith(IMAGE_PREFIX):
        return obs.images[key[len(IMAGE_PREFIX):]]
    if key not in obs.extra:
        raise ConfigError(f"the policy reads {key!r}, which the robot's observation does not have "
                          f"({sorted(['obs/qpos', 'obs/qvel', *obs.extra, *(IMAGE_PREFIX + c for c in obs.images)])})")
    return obs.extra[key]


def store_step(obs: Any, executed: np.ndarray, cameras: Sequence[str]) -> dict[str, np.ndarray]:
    """One store step: the observation an action was chosen from (joints, the extra keys such as
    the twin's obs/env_state, the cameras a policy or a dataset wants) and the action as executed."""
    step = {"obs/qpos": obs.qpos, "obs/qvel": obs.qvel, "action": executed, **obs.extra}
    step.update({f"{IMAGE_PREFIX}{cam}": obs.images[cam] for cam in cameras})
    return step


# ---------------------------------------------------------------------- the loop
@dataclass
class _Running:
    episode: Episode
    report: ControllerReport
    history: deque
    command: np.ndarray
    tracking: TrackingMonitor | None
    ticks: int = 0
    next_record: float = 0.0
    outcome: Outcome | None = None


def run_episodes(robots: Sequence[Any], sources: Any, config: ControllerConfig, hooks: EpisodeHooks, *,
                 lockstep: bool = False, estop: Any = None, clock: Callable[[], float] = time.monotonic) -> ControllerReport:
    """Run episodes on `robots` until every robot's `hooks.start` says no more (or the e-stop, a
    watchdog or tracking stop, or Ctrl-C ends the run); returns the whole run's report (every
    episode's added up; `hooks.end` had each one's)."""
    config.validate()
    if not callable(getattr(sources, "actions", None)):
        raise TypeError(f"run_episodes: sources must be Sources (runtime/sources.py as_sources makes them), got "
                        f"{type(sources).__name__}")
    extras = [extras_of(robot) for robot in robots]  # what each robot offers beyond Robot, looked up once
    period = 1.0 / config.hz
    record_period = 1.0 / (config.record_hz or config.hz)
    total = ControllerReport()
    running: dict[int, _Running] = {}
    over = False  # the run stops: e-stop, a safety stop, Ctrl-C
    ended_now: list[int] = []  # robots whose episode ended this tick

    def start(i: int, now: float) -> None:
        episode = hooks.start(i)
        if episode is None:
            return
        sources.begin(i)
        command = np.asarray(robots[i].observe().qpos, dtype=np.float32)
        if episode.safety is not None:
            episode.safety.reset(command)
        tracking = None if episode.safety is None else TrackingMonitor(episode.safety.spec, episode.safety.config)
        running[i] = _Running(episode, ControllerReport(), deque(maxlen=config.n_obs), command, tracking,
                              next_record=now)

    def finish(i: int) -> None:
        nonlocal over
        run = running.pop(i)
        report = run.report
        sources.end(i, run.outcome is not None and run.outcome.success)
        if run.episode.watchdog is not None:
            report.watchdog_holds, report.watchdog_stops = run.episode.watchdog.holds, run.episode.watchdog.stops
        if run.episode.safety is not None:
            report.safety = run.episode.safety.report()
        hooks.end(i, report, run.outcome)
        total.add(report)
        ended_now.append(i)
        over = over or bool(report.stopped_reason) or report.interrupted

    # Python hands the GIL between threads every 5 ms by default: a policy thread running Python
    # code could hold a real-time loop up for that long. A fraction of a period bounds it.
    switch = sys.getswitchinterval()
    if not lockstep:
        sys.setswitchinterval(min(switch, period / 20))
        # A full garbage collection walks every object torch and the policy made (95 ms with torch
        # imported, AMD EPYC): it held a 50 Hz recording loop for 20 ms (bench/data.py, real
        # cameras). Frozen before the first tick, the collector's passes see only new objects.
        gc.collect()
        gc.freeze()
        # The collection holds the GIL throughout, so a robot fed by messages handled none while
        # it ran: its newest joint state is as old as the collection was long (345 ms with a big
        # heap), and the watchdog stopped the first tick. Let its message threads catch up first;
        # a robot that has really gone quiet still meets the watchdog at the first tick.
        collected = time.monotonic()  # the robots' clock (`last_update`), whatever `clock` is
        for extra in extras:
            if extra.wait_for_fresh is not None:
                extra.wait_for_fresh(collected, timeout_s=0.5)
    try:
        for i in range(len(robots)):
            start(i, 0.0)
        t0 = clock()  # after the starts, which may have waited for a key
        for run in running.values():
            run.next_record = t0
        k, last_start = -1, None
        while running and not over:
            k += 1
            deadline = t0 + k * period
            if lockstep:
                now = deadline
            else:
                wait_until(deadline, config.spin_s, clock)
                now = clock()
                if last_start is not None:
                    for run in running.values():
                        run.report.period_ms.append((now - last_start) * 1e3)
                last_start = now
                if now - deadline > period:
                    for run in running.values():
                        run.report.overruns += 1
            if estop is not None and estop.tripped:
                for i in list(running):
                    running[i].report.stopped_reason = f"e-stop: {estop.reason}"
                    finish(i)
                break
            histories: dict[int, list[Any]] = {}
            for i in list(running):
                run = running[i]
                if run.episode.stop is not None and run.episode.stop():
                    finish(i)
                    continue
                obs = robots[i].observe()
                run.history.append(obs)
                # a robot that must not be commanded on (ROS 2: another writer on its command topic)
                fault = extras[i].fault() if extras[i].fault is not None else None
                if fault:
                    run.report.stopped_reason = fault
                    finish(i)
                    continue
                lost = None if run.tracking is None else run.tracking.check(obs.qpos, run.command, now)
                if lost is not None:
                    hint = extras[i].not_following_hint
                    run.report.tracking_stops += 1
                    run.report.stopped_reason = lost + (f". {hint()}" if hint is not None else "")
                    finish(i)
                    continue
                if run.episode.watchdog is not None:
                    # A robot fed by messages says when its newest joint state arrived (`last_update`,
                    # this clock); one that is read directly is always fresh.
                    fresh = extras[i].last_update() if extras[i].last_update is not None else None
                    run.episode.watchdog.observation_received(now if fresh is None else fresh)
                histories[i] = list(run.history)
            if histories:
                actions = sources.actions(deadline, histories, {i: running[i].report for i in histories})
                for i in histories:
                    run, robot = running[i], robots[i]
                    action, watchdog = actions.get(i), run.episode.watchdog
                    if action is None:
                        run.report.missing_actions += 1
                        action = run.command  # hold
                    elif watchdog is not None:
                        watchdog.command_received(now)
                    state = watchdog.check() if watchdog is not None else None
                    if state is not None and state.action == "stop":
                        run.report.stopped_reason = state.message
                        finish(i)
                        continue
                    if state is not None and state.action == "hold":
                        action = run.command
                    safety = run.episode.safety
                    sent = safety.filter(action) if safety is not None else np.asarray(action, np.float32)
                    run.command = np.asarray(robot.act(sent), dtype=np.float32)
                    run.report.ticks += 1
                    run.ticks += 1
                    outcome = extras[i].outcome() if extras[i].outcome is not None else None
                    run.outcome = outcome
                    if now >= run.next_record - 1e-6:
                        hooks.step(i, run.history[-1], run.command, sources.segment(i), outcome)
                        run.report.recorded += 1
                        run.next_record += record_period
                    done = sources.ended(i) or (run.episode.max_ticks is not None and run.ticks >= run.episode.max_ticks)
                    if outcome is not None:
                        done = (done or (outcome.truncated and run.episode.end_on_time_limit)
                                or (outcome.success and run.episode.end_on_success))
                    if done:
                        finish(i)
            # the robots whose episode ended this tick start their next one (the twin's evaluation
            # keeps all its envs busy); a start that waited (a key) gets a fresh clock
            idle = not running
            for i in ended_now:
                if not over:
                    start(i, now)
            ended_now.clear()
            if idle and running and not lockstep:
                t0, k, last_start = clock(), -1, None
                for run in running.values():
                    run.next_record = t0
    except KeyboardInterrupt:  # Ctrl-C: stop commanding at once and still report
        for i in list(running):
            running[i].report.interrupted = True
            finish(i)
    finally:
        sys.setswitchinterval(switch)
        if not lockstep:
            gc.unfreeze()  # objects dropped later (a RaC round's policy) can be collected again
        running.clear()  # an error mid-tick: the episodes still open are dropped, never half-recorded
        sources.close()
    total.inference_ms = sources.latencies()
    return total
