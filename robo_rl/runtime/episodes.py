"""The one episode loop: every closed-loop episode runs here, on the twin and on real arms alike.

    run_episodes(robots, sources, config, hooks, lockstep=...)

- `robots`: one or more Robots (robo_rl.hardware.robot.Robot: `observe()`, `act()`). A robot
  that also knows its task (the twin's TaskTwin) says after each step where the episode stands
  (`outcome()`: stage, success, time limit); a real robot does not, and its episodes end by
  time, by the source (RaC's END, a playback done) or by the caller's `stop`.
- `sources`: who commands each robot (`Sources` below). A policy in lockstep (`LockstepChunks`:
  one batched network call per tick for every robot that needs a new chunk), a policy thinking in
  its own thread (runtime.controller.PolicyChunks), a human (runtime.sources.OperatorCommands),
  a recording (RecordedActions), or a policy with a human who may take over
  (runtime.sources.Interventions: the RaC protocol, each step labelled).
- `hooks`: the caller's side (`EpisodeHooks`): which episode starts next on robot i (the
  twin's scene, the time limit, the safety filter), what to do with each recorded step, and
  each episode's end.
- the clock: real time (absolute deadlines t0 + k / hz, spin before each; late ticks counted)
  or `lockstep` (virtual time, no waiting: the twin as fast as it steps).

Each tick, for each robot running an episode: stop checks (e-stop, the caller's stop), observe,
the robot's own fault check (`fault()`, where it has one: a ROS 2 arm with a second writer on
its command topic), the tracking check (a robot that does not follow its commands stops the run), the watchdog; one
`sources.actions` call for all robots; then per robot the safety filter, `act`, the recording
(at `record_hz`), and the end check. An ended robot starts its next episode at once (the twin's
evaluation keeps all its envs busy), or goes idle; the loop ends when every robot is idle.

Evaluation (robo_rl/sim/rollout.py), intervention collection (robo_rl/sim/interventions.py),
critic rollouts (robo_rl/sim/critic_data.py), `robo-rl record`, `deploy`, `teleop` and `replay`
(through runtime.controller.Controller) all run here.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from robo_rl.data.schema import IMAGE_PREFIX, Segment
from robo_rl.errors import ConfigError
from robo_rl.hardware.safety import TrackingMonitor
from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig
from robo_rl.runtime.controller import ControllerConfig, ControllerReport, PolicyChunks, wait_until


# ---------------------------------------------------------------------- what the loop is told
@dataclass
class Outcome:
    """What a robot that knows its task (the twin) says after a step."""
    stage: int
    max_stage: int
    success: bool          # the task is done now
    truncated: bool        # the task's time limit is reached
    disturbed: bool = False  # the task's disturbance struck this episode (PackCube: the cube slipped)


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


# ---------------------------------------------------------------------- sources
class PerRobot:
    """Single-robot action sources (each with `action(deadline, history, report)`, and optionally
    `segment`, `ended`, `latencies`), one per robot, as Sources."""

    asynchronous = True  # a thread-predicting policy: ask it every tick, it answers when ready

    def __init__(self, sources: Sequence[Any]):
        self.sources = list(sources)

    def begin(self, i: int) -> None:
        begin = getattr(self.sources[i], "begin", None)
        if begin is not None:
            begin()

    def actions(self, deadline, histories, reports):
        return {i: self.sources[i].action(deadline, h, reports[i]) for i, h in histories.items()}

    def segment(self, i: int) -> Segment:
        return getattr(self.sources[i], "segment", Segment.POLICY)

    def ended(self, i: int) -> bool:
        return bool(getattr(self.sources[i], "ended", False))

    def end(self, i: int, task_done: bool) -> None:
        pass

    def latencies(self) -> list[float]:
        return [x for s in self.sources if hasattr(s, "latencies") for x in s.latencies()]

    def close(self) -> None:
        for s in self.sources:
            s.close()


class LockstepChunks:
    """A policy for robots stepped in lockstep: one batched `predict(window) -> (B, H, A)` call per
    tick for the robots whose chunk schedule (ChunkExecutor) needs a new chunk, on windows of
    `keys` from the loop's history padded with the episode's first observation (as the sampler pads)."""

    asynchronous = False  # computed in the tick: a robot it was not asked for replans when it comes back

    def __init__(self, predict: Callable[[Mapping[str, np.ndarray]], np.ndarray], chunking: ChunkingConfig,
                 horizon: int, n_robots: int, keys: Sequence[str], n_obs: int):
        self.predict, self.keys, self.n_obs = predict, list(keys), n_obs
        self.execs = [ChunkExecutor(chunking, horizon) for _ in range(n_robots)]

    def begin(self, i: int) -> None:
        self.execs[i].reset()

    def actions(self, deadline, histories, reports):
        need = [i for i in histories if self.execs[i].needs_prediction()]
        if need:
            windows = [[histories[i][0]] * (self.n_obs - len(histories[i])) + histories[i] for i in need]
            batch = {k: np.stack([np.stack([observation_value(o, k) for o in w]) for w in windows]) for k in self.keys}
            for chunk, i in zip(self.predict(batch), need):
                self.execs[i].push(chunk)
                reports[i].chunks += 1
        return {i: self.execs[i].next().astype(np.float32) for i in histories}

    def segment(self, i: int) -> Segment:
        return Segment.POLICY

    def ended(self, i: int) -> bool:
        return False

    def end(self, i: int, task_done: bool) -> None:
        pass

    def latencies(self) -> list[float]:
        return []

    def close(self) -> None:
        pass


def as_sources(source: Any, config: ControllerConfig, n_robots: int = 1,
               make_window: Callable[[list[Any]], dict[str, np.ndarray]] | None = None) -> Any:
    """Sources from what a caller has: Sources as they are; one robot's action source (`action`);
    or a bare `predict(window)` function, which becomes a thread-predicting PolicyChunks."""
    if callable(getattr(source, "actions", None)):  # (RecordedActions keeps its recording in `.actions`)
        return source
    if hasattr(source, "action"):
        return PerRobot([source])
    kwargs = {} if make_window is None else {"make_window": make_window}
    return PerRobot([PolicyChunks(source, config, **kwargs) for _ in range(n_robots)])


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
    sources = as_sources(sources, config, len(robots))
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
        for robot in robots:
            wait_for_fresh = getattr(robot, "wait_for_fresh", None)
            if wait_for_fresh is not None:
                wait_for_fresh(collected, timeout_s=0.5)
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
                fault = robots[i].fault() if hasattr(robots[i], "fault") else None
                if fault:
                    run.report.stopped_reason = fault
                    finish(i)
                    continue
                lost = None if run.tracking is None else run.tracking.check(obs.qpos, run.command, now)
                if lost is not None:
                    hint = getattr(robots[i], "not_following_hint", None)
                    run.report.tracking_stops += 1
                    run.report.stopped_reason = lost + (f". {hint()}" if hint is not None else "")
                    finish(i)
                    continue
                if run.episode.watchdog is not None:
                    # A robot fed by messages says when its newest joint state arrived (`last_update`,
                    # this clock); one that is read directly is always fresh.
                    fresh = getattr(robots[i], "last_update", None)
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
                    outcome = robot.outcome() if hasattr(robot, "outcome") else None
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
