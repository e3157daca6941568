"""Ros2Robot: the Robot protocol over ROS 2 topics, configured by the `ros2:` section of
hardware/<robot>.yaml.

Per arm: a sensor_msgs/JointState topic it reads, and a command topic it writes, either
trajectory_msgs/JointTrajectory (a JointTrajectoryController; one point, `time_from_start` one
tick) or std_msgs/Float64MultiArray (a forward position controller). `joints` names the arm's
joints as the robot calls them, in our action order. Grippers travel as finger positions (metres),
converted with the gripper mapping of the robot description.

`observe()` returns the newest joint state of every arm and `last_update` is when the oldest of
them arrived (this process's monotonic clock): the Controller's watchdog stops commanding when
it gets old. `act()` publishes the command and returns it; safety is the caller's
(`robo_rl.hardware.safety.SafetyFilter`, which the Controller applies before `act`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Observation, RobotSpec, read_robot_yaml
from robo_rl.hardware.ros2.messages import (Duration, Float64MultiArray, Header, JointState, JointTrajectory,
                                            JointTrajectoryPoint, Time)

COMMAND_TYPES = {"trajectory": JointTrajectory, "forward": Float64MultiArray}


@dataclass(frozen=True)
class ArmTopics:
    name: str
    joint_states: str
    command: str
    command_type: str          # trajectory | forward
    joints: tuple[str, ...]    # the robot's joint names, in our action order for this arm
    indices: tuple[int, ...]   # where they sit in the action vector


@dataclass(frozen=True)
class Ros2Config:
    domain_id: int
    arms: tuple[ArmTopics, ...]

    @classmethod
    def from_yaml(cls, robot: str | Path, spec: RobotSpec) -> "Ros2Config":
        path, d = read_robot_yaml(robot)
        d = d.get("ros2")
        if not d:
            raise ConfigError(f"{path}: no `ros2:` section (topics per arm); see hardware/aloha.yaml")
        arms, used = [], []
        for name, a in (d.get("arms") or {}).items():
            where = f"{path}: ros2.arms.{name}"
            try:
                kind = a.get("command_type", "trajectory")
                if kind not in COMMAND_TYPES:
                    raise ConfigError(f"{where}.command_type={kind!r}; choose one of {sorted(COMMAND_TYPES)}")
                indices = tuple(i for i, j in enumerate(spec.joint_names) if j.startswith(f"{name}_"))
                joints = tuple(a.get("joints") or [spec.joint_names[i][len(name) + 1:] for i in indices])
                if len(joints) != len(indices) or not indices:
                    raise ConfigError(f"{where}.joints has {len(joints)} names; {spec.name} has {len(indices)} "
                                      f"joints named {name}_*")
                arms.append(ArmTopics(name, str(a["joint_states"]), str(a["command"]), kind, joints, indices))
            except (KeyError, TypeError, AttributeError) as e:
                raise ConfigError(f"{where}: malformed ({type(e).__name__}: {e})") from None
            used += indices
        if sorted(used) != list(range(spec.action_dim)):
            raise ConfigError(f"{path}: ros2.arms cover action indices {sorted(used)}, not all {spec.action_dim}")
        return cls(int(d.get("domain_id", 0)), tuple(arms))


def to_wire(spec: RobotSpec, action: np.ndarray) -> np.ndarray:
    """Action units -> what the topics carry: grippers as finger positions (m)."""
    out = np.asarray(action, dtype=np.float64).copy()
    for i, g in spec.grippers.items():
        out[i] = g.to_finger(out[i])
    return out


def from_wire(spec: RobotSpec, values: Mapping[int, float]) -> dict[int, float]:
    """{action index: value on the wire} -> action units."""
    return {i: float(spec.grippers[i].from_finger(v)) if i in spec.grippers else float(v) for i, v in values.items()}


class Ros2Robot:
    """Implements robo_rl.hardware.robot.Robot over a transport (DdsTransport here; rclpy's where
    ROS 2 is installed)."""

    def __init__(self, robot: str | Path = "aloha", transport: Any = None, config: Ros2Config | None = None):
        self.spec = RobotSpec.from_yaml(robot)
        self.config = config or Ros2Config.from_yaml(robot, self.spec)
        self.transport = transport
        self._lock = threading.Lock()
        self._qpos = np.full(self.spec.action_dim, np.nan)
        self._qvel = np.zeros(self.spec.action_dim)
        self._arrived: dict[str, float | None] = {arm.name: None for arm in self.config.arms}
        self._stamp = 0.0
        self._publish: dict[str, Any] = {}
        self.period = 1.0 / self.spec.control_hz

    # ------------------------------------------------------------------ Robot protocol
    def connect(self, timeout_s: float = 5.0) -> None:
        if self.transport is None:
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            self.transport = make_transport(self.config.domain_id)
        for arm in self.config.arms:
            self.transport.subscribe(arm.joint_states, JointState, lambda msg, arm=arm: self._on_state(arm, msg),
                                     qos="sensor")
            self._publish[arm.name] = self.transport.publisher(arm.command, COMMAND_TYPES[arm.command_type])
        deadline = time.monotonic() + timeout_s
        while self.last_update is None:
            if time.monotonic() > deadline:
                missing = [a.joint_states for a in self.config.arms if self._arrived[a.name] is None]
                raise ConfigError(f"no joint states on {', '.join(missing)} within {timeout_s:.0f} s "
                                  f"(ROS domain {getattr(self.transport, 'domain_id', self.config.domain_id)}): "
                                  "is the robot (or `robo-rl sim-bridge`) up?")
            time.sleep(0.01)

    @property
    def last_update(self) -> float | None:
        """When the stalest arm's newest joint state arrived (monotonic), None before all have."""
        with self._lock:
            times = list(self._arrived.values())
        return None if any(t is None for t in times) else min(times)

    def observe(self) -> Observation:
        with self._lock:  # timestamp: the robot's own stamp on its newest joint state
            return Observation(self._qpos.astype(np.float32), self._qvel.astype(np.float32), {}, self._stamp)

    def act(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (self.spec.action_dim,):
            raise ConfigError(f"Ros2Robot.act: action has {a.size} values; {self.spec.name} takes {self.spec.action_dim}")
        wire = to_wire(self.spec, a)
        for arm in self.config.arms:
            values = [float(wire[i]) for i in arm.indices]
            if arm.command_type == "trajectory":
                msg = JointTrajectory(Header(Time.now()), list(arm.joints),
                                      [JointTrajectoryPoint(values, time_from_start=Duration.from_seconds(self.period))])
            else:
                msg = Float64MultiArray(data=values)
            self._publish[arm.name](msg)
        return a.astype(np.float32)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _on_state(self, arm: ArmTopics, msg: JointState) -> None:
        pos = dict(zip(msg.name, msg.position))
        vel = dict(zip(msg.name, msg.velocity))
        if any(j not in pos for j in arm.joints):
            return  # a partial message (another controller's joints): not ours
        q = from_wire(self.spec, {i: pos[j] for i, j in zip(arm.indices, arm.joints)})
        with self._lock:
            for i, j in zip(arm.indices, arm.joints):
                self._qpos[i] = q[i]
                self._qvel[i] = vel.get(j, 0.0)
            self._arrived[arm.name] = time.monotonic()
            self._stamp = msg.header.stamp.seconds()
