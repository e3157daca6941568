"""The MuJoCo twin served as a ROS 2 robot: what `robo-rl sim-bridge` runs.

It reads the robot description's `ros2:` topics (hardware/<robot>.yaml) and, at the control rate
in real time: applies the newest command of each arm (a JointTrajectory's first point or a
Float64MultiArray), steps the physics, and publishes each arm's sensor_msgs/JointState (grippers
as finger positions in metres, like the real arms). A command holding NaN or inf is refused and
counted, never applied. Every ROS 2 path (deploy, teleop, record) thereby runs without hardware.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from robo_rl.hardware.ros2.messages import Header, JointState, Time
from robo_rl.hardware.ros2.robot import COMMAND_TYPES, ArmTopics, Ros2Config, from_wire, to_wire
from robo_rl.sim.robot import SimRobot


class SimBridge:
    def __init__(self, robot: str = "aloha", scene: str = "aloha.xml", domain_id: int | None = None,
                 transport: Any = None, prefer: str = "auto"):
        self.sim = SimRobot(scene, robot=robot, cameras=[], realtime=True)
        self.config = Ros2Config.from_yaml(robot, self.sim.spec)
        if domain_id is not None:
            self.config = Ros2Config(int(domain_id), self.config.arms)
        if transport is None:
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            transport = make_transport(self.config.domain_id, prefer)
        self.transport = transport
        self._lock = threading.Lock()
        self._command = self.sim.spec.home.astype(np.float64).copy()
        self.commands_received = 0
        self.commands_refused = 0
        self._publish = {arm.name: transport.publisher(arm.joint_states, JointState, qos="sensor")
                         for arm in self.config.arms}
        for arm in self.config.arms:
            transport.subscribe(arm.command, COMMAND_TYPES[arm.command_type],
                                lambda msg, arm=arm: self._on_command(arm, msg))

    def _on_command(self, arm: ArmTopics, msg: Any) -> None:
        if arm.command_type == "trajectory":
            if not msg.points:
                return
            by_name = dict(zip(msg.joint_names, msg.points[0].positions))
            values = [by_name.get(j, np.nan) for j in arm.joints]
        else:
            values = list(msg.data)
        values = np.asarray(values, dtype=np.float64)
        with self._lock:
            self.commands_received += 1
            if values.shape != (len(arm.indices),) or not np.isfinite(values).all():
                self.commands_refused += 1
                return
            for i, v in from_wire(self.sim.spec, dict(zip(arm.indices, values))).items():
                self._command[i] = v

    def step(self) -> None:
        """One control tick: apply the newest command, step, publish joint states."""
        with self._lock:
            command = self._command.copy()
        self.sim.act(command)
        qpos, qvel = self.sim.joint_positions(), self.sim.joint_velocities()
        wire = to_wire(self.sim.spec, qpos)
        stamp = Time.now()
        for arm in self.config.arms:
            self._publish[arm.name](JointState(Header(stamp), list(arm.joints), [float(wire[i]) for i in arm.indices],
                                               [float(qvel[i]) for i in arm.indices], []))

    def run(self, duration_s: float | None = None) -> None:
        end = None if duration_s is None else time.monotonic() + duration_s
        while end is None or time.monotonic() < end:
            self.step()

    def close(self) -> None:
        self.transport.close()
        self.sim.close()
