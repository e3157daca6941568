"""ALOHA-style leader arms over ROS 2: the human moves a pair of small arms; their joint states
become the follower's joint commands, one to one, grippers mapped through the `leader:` section
of hardware/<robot>.yaml (the leader's gripper joint value at follower gripper 0 and 1).

`LeaderArms` is a teleop device (robo_rl.hardware.teleop.TeleopDevice): `poll()` returns the
newest leader pose as `TeleopInput.joints` (per arm: 6 joints + gripper 0..1). Leader arms have no
buttons: the RaC events and the record keys come from the keyboard next to them. A leader whose
joint states stop arriving is not followed: `poll()` leaves that arm out, and the follower holds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import RobotSpec, read_robot_yaml
from robo_rl.hardware.ros2.messages import JointState
from robo_rl.hardware.teleop import TeleopInput


@dataclass(frozen=True)
class LeaderConfig:
    arms: dict[str, tuple[str, tuple[str, ...]]]  # arm -> (joint_states topic, its 7 joint names in action order)
    gripper_closed: float  # leader gripper joint value at follower gripper 0
    gripper_open: float    # ... and at 1
    stale_s: float         # a leader silent this long is not followed

    @classmethod
    def from_yaml(cls, robot: str | Path, spec: RobotSpec) -> "LeaderConfig":
        path, d = read_robot_yaml(robot)
        d = d.get("leader")
        if not d:
            raise ConfigError(f"{path}: no `leader:` section (leader arms' topics and gripper range); "
                              "see hardware/aloha.yaml")
        arms = {}
        try:
            for name, a in d["arms"].items():
                n = sum(1 for j in spec.joint_names if j.startswith(f"{name}_"))
                joints = tuple(a["joints"])
                if n == 0 or len(joints) != n:
                    raise ConfigError(f"{path}: leader.arms.{name}.joints has {len(joints)} names; {spec.name} has "
                                      f"{n} joints named {name}_*")
                arms[name] = (str(a["joint_states"]), joints)
            g = d["gripper"]
            cfg = cls(arms, float(g["closed"]), float(g["open"]), float(d.get("stale_s", 0.2)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ConfigError(f"{path}: leader: malformed ({type(e).__name__}: {e})") from None
        if cfg.gripper_closed == cfg.gripper_open:
            raise ConfigError(f"{path}: leader.gripper closed and open are both {cfg.gripper_open}")
        return cfg


class LeaderArms:
    name = "leader"
    gives_joints = True  # joint positions one to one: the operator needs no kinematic model

    def __init__(self, robot: str | Path = "aloha", transport: Any = None, config: LeaderConfig | None = None,
                 owns_transport: bool | None = None):
        self.spec = RobotSpec.from_yaml(robot)
        self.config = config or LeaderConfig.from_yaml(robot, self.spec)
        self.transport = transport
        # a transport shared with the follower robot is closed by the robot
        self._own_transport = transport is None if owns_transport is None else owns_transport
        self._lock = threading.Lock()
        self._pose: dict[str, np.ndarray] = {}
        self._arrived: dict[str, float] = {}
        self.stale_polls = 0  # polls that left an arm out because its leader went quiet

    def connect(self, timeout_s: float = 5.0, domain_id: int | None = None) -> None:
        if self.transport is None:
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            self.transport = make_transport(domain_id)
        for arm, (topic, joints) in self.config.arms.items():
            self.transport.subscribe(topic, JointState, lambda msg, arm=arm, joints=joints: self._on_state(arm, joints, msg),
                                     qos="sensor")
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                missing = [t for arm, (t, _) in self.config.arms.items() if arm not in self._arrived]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ConfigError(f"leader arms: no joint states on {', '.join(missing)} within {timeout_s:.0f} s "
                                  f"(ROS domain {getattr(self.transport, 'domain_id', '?')}): are the leader arms' "
                                  "drivers up?")
            time.sleep(0.01)

    def _on_state(self, arm: str, joints: tuple[str, ...], msg: JointState) -> None:
        pos = dict(zip(msg.name, msg.position))
        if any(j not in pos for j in joints):
            return  # not this arm's full set
        q = np.array([pos[j] for j in joints], dtype=np.float64)
        span = self.config.gripper_open - self.config.gripper_closed
        q[-1] = np.clip((q[-1] - self.config.gripper_closed) / span, 0.0, 1.0)
        with self._lock:
            self._pose[arm] = q.astype(np.float32)
            self._arrived[arm] = time.monotonic()

    def poll(self) -> TeleopInput:
        now = time.monotonic()
        out = TeleopInput()
        with self._lock:
            for arm, q in self._pose.items():
                if now - self._arrived[arm] <= self.config.stale_s:
                    out.joints[arm] = q.copy()
                else:
                    self.stale_polls += 1
        return out

    def close(self) -> None:
        if self._own_transport and self.transport is not None:
            self.transport.close()
