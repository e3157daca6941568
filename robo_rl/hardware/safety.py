"""What stands between a policy (or a teleop device) and the motors: a safety filter, a watchdog
and an e-stop. Nothing here knows ROS 2 or MuJoCo; `Ros2Robot` and the controller use them.

SafetyFilter.filter(action) returns the action actually sent:
  - a command with NaN or inf anywhere is rejected whole: the last sent command is held;
  - every joint is clipped to its position limits, grippers to their range;
  - each joint moves at most `max_step` per tick and at most `max_velocity` x the time since the
    last command, so a far target (a policy's first chunk, a takeover) becomes a ramp, not a jump.
Every clip and rejection is counted (`counts`), per reason, for the end-of-run report.

Watchdog: no fresh command for `command_timeout_s` -> hold position; no fresh observation for
`observation_timeout_s` -> stop commanding, and say which.

TrackingMonitor: a robot that does not follow its commands (its controller inactive, commands on
a topic nobody reads, a controller refusing messages of the wrong size) looks alive: joint states
keep coming. When an arm joint stays farther than `tracking_tolerance` from the command sent
before for longer than `tracking_timeout_s`, the loop stops, naming the joints. Grippers are not
watched: a grasp stops the fingers short of their command by design.

EStop: a latch. Once tripped (a key, a ROS 2 topic, a watchdog) it stays tripped until reset.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import RobotSpec, read_robot_yaml


@dataclass(frozen=True)
class SafetyConfig:
    """The `safety:` section of hardware/<robot>.yaml."""

    max_step: float = 0.05               # rad per tick, arm joints
    max_velocity: float = 2.0            # rad/s, arm joints
    gripper_max_step: float = 0.1        # normalised gripper units per tick
    command_timeout_s: float = 0.1       # no fresh command for this long -> hold position
    observation_timeout_s: float = 0.2   # no fresh joint state for this long -> stop commanding
    tracking_tolerance: float = 0.3      # rad: an arm joint this far from its command is not following...
    tracking_timeout_s: float = 1.0      # ...and for this long, the loop stops commanding

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, where: str = "safety") -> "SafetyConfig":
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(names)}")
        try:
            cfg = cls(**{k: float(v) for k, v in d.items()})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
        bad = [f.name for f in fields(cfg) if not getattr(cfg, f.name) > 0]
        if bad:
            raise ConfigError(f"{where}: {', '.join(bad)} must be > 0")
        return cfg

    @classmethod
    def from_yaml(cls, robot: str | Path) -> "SafetyConfig":
        path, d = read_robot_yaml(robot)
        return cls.from_dict(d.get("safety"), f"{path}: safety")


REASONS = ("nonfinite", "position_limit", "gripper_range", "step_limit", "velocity_limit")


class SafetyFilter:
    """Clamps and rejects commands (see the module docstring). Not thread-safe: one control loop
    owns it. `reset(qpos)` before the first command, from the robot's measured position."""

    def __init__(self, spec: RobotSpec, config: SafetyConfig, clock: Callable[[], float] = time.monotonic):
        self.spec, self.config, self.clock = spec, config, clock
        n = spec.action_dim
        is_grip = np.zeros(n, bool)
        is_grip[list(spec.grippers)] = True
        self.is_gripper = is_grip
        self.step = np.where(is_grip, config.gripper_max_step, config.max_step).astype(np.float64)
        self.counts: Counter[str] = Counter()
        self.commands = 0
        self.last: np.ndarray | None = None
        self.last_time: float | None = None

    def reset(self, qpos: np.ndarray) -> None:
        q = np.asarray(qpos, dtype=np.float64).reshape(-1)
        if q.shape != (self.spec.action_dim,) or not np.isfinite(q).all():
            raise ConfigError(f"SafetyFilter.reset: need {self.spec.action_dim} finite joint positions, got {q}")
        self.last, self.last_time = np.clip(q, self.spec.lower, self.spec.upper), self.clock()

    def filter(self, action: np.ndarray) -> np.ndarray:
        """The command to send for `action` (float32, action order)."""
        if self.last is None:
            raise RuntimeError("SafetyFilter.filter before reset(qpos): the filter needs the arm's current position")
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (self.spec.action_dim,):
            raise ConfigError(f"action has {a.size} values; {self.spec.name} takes {self.spec.action_dim}")
        now = self.clock()
        self.commands += 1
        if not np.isfinite(a).all():
            self.counts["nonfinite"] += 1
            self.last_time = now
            return self.last.astype(np.float32)
        clipped = np.clip(a, self.spec.lower, self.spec.upper)
        off = clipped != a
        if off[~self.is_gripper].any():
            self.counts["position_limit"] += 1
        if off[self.is_gripper].any():
            self.counts["gripper_range"] += 1
        # Velocity bound over the real time since the last command (at least one tick's worth, so
        # a late tick is not punished below the per-tick step).
        dt = max(now - (self.last_time or now), 1.0 / self.spec.control_hz)
        vel_step = np.where(self.is_gripper, np.inf, self.config.max_velocity * dt)
        delta = clipped - self.last
        limit = np.minimum(self.step, vel_step)
        clamped = np.abs(delta) > limit
        if clamped.any():  # counted under the bound that bit
            by_velocity = vel_step < self.step
            if (clamped & by_velocity).any():
                self.counts["velocity_limit"] += 1
            if (clamped & ~by_velocity).any():
                self.counts["step_limit"] += 1
        out = self.last + np.clip(delta, -limit, limit)
        self.last, self.last_time = out, now
        return out.astype(np.float32)

    def report(self) -> dict[str, Any]:
        return {"commands": self.commands, **{r: int(self.counts[r]) for r in REASONS}}


class TrackingMonitor:
    """Says when the robot has not followed its commands for too long (see the module docstring).
    `check(qpos, commanded, now)` each tick with the measured positions and the command sent
    before them; a message when tracking is lost, else None."""

    def __init__(self, spec: RobotSpec, config: SafetyConfig):
        self.spec, self.config = spec, config
        self.arm = np.ones(spec.action_dim, bool)
        self.arm[list(spec.grippers)] = False
        self.since: float | None = None   # when the error first went over the tolerance (this run)
        self.stops = 0

    def check(self, qpos: np.ndarray, commanded: np.ndarray, now: float) -> str | None:
        err = np.abs(np.asarray(qpos, np.float64) - np.asarray(commanded, np.float64))
        err[~self.arm | ~np.isfinite(err)] = 0.0
        if not (err > self.config.tracking_tolerance).any():
            self.since = None
            return None
        if self.since is None:
            self.since = now
        if now - self.since < self.config.tracking_timeout_s:
            return None
        self.stops += 1
        off = np.flatnonzero(err > self.config.tracking_tolerance)
        joints = ", ".join(f"{self.spec.joint_names[i]} {err[i]:.2f} rad" for i in off[np.argsort(-err[off])][:4])
        more = f" and {len(off) - 4} more" if len(off) > 4 else ""
        return (f"the robot does not follow its commands: {joints}{more} from the command for {now - self.since:.1f} s "
                f"(safety.tracking_tolerance {self.config.tracking_tolerance:g} rad, tracking_timeout_s "
                f"{self.config.tracking_timeout_s:g} s); stopped commanding")


@dataclass
class WatchdogState:
    action: str  # "ok" | "hold" | "stop"
    message: str = ""


class Watchdog:
    """Tracks the age of the newest command and observation. `check()` says what the loop may do."""

    def __init__(self, config: SafetyConfig, clock: Callable[[], float] = time.monotonic):
        self.config, self.clock = config, clock
        now = clock()
        self.last_command = now
        self.last_observation = now
        self.holds = 0
        self.stops = 0

    def command_received(self, t: float | None = None) -> None:
        self.last_command = self.clock() if t is None else t

    def observation_received(self, t: float | None = None) -> None:
        self.last_observation = self.clock() if t is None else t

    def check(self) -> WatchdogState:
        now = self.clock()
        obs_age, cmd_age = now - self.last_observation, now - self.last_command
        if obs_age > self.config.observation_timeout_s:
            self.stops += 1
            return WatchdogState("stop", f"no joint state for {obs_age * 1e3:.0f} ms "
                                         f"(limit {self.config.observation_timeout_s * 1e3:.0f} ms): not commanding")
        if cmd_age > self.config.command_timeout_s:
            self.holds += 1
            return WatchdogState("hold", f"no fresh command for {cmd_age * 1e3:.0f} ms "
                                         f"(limit {self.config.command_timeout_s * 1e3:.0f} ms): holding position")
        return WatchdogState("ok")


class EStop:
    """A thread-safe latch: `trip(reason)` from any thread (a key reader, a ROS 2 subscription, the
    watchdog); the control loop checks `tripped` every tick. Only `reset()` clears it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.reason = ""

    def trip(self, reason: str) -> None:
        with self._lock:
            if not self._event.is_set():
                self.reason = reason
                self._event.set()

    @property
    def tripped(self) -> bool:
        return self._event.is_set()

    def reset(self) -> None:
        with self._lock:
            self._event.clear()
            self.reason = ""
