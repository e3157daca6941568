"""Ros2Robot: the Robot protocol over ROS 2 topics, configured by the `ros2:` section of
hardware/<robot>.yaml.

Per arm: a sensor_msgs/JointState topic it reads, and a command topic it writes, either
trajectory_msgs/JointTrajectory (a JointTrajectoryController; one point, `time_from_start` one
tick) or std_msgs/Float64MultiArray (a forward position controller). `joints` names the arm's
joints as the robot calls them, in our action order. Grippers travel as finger positions (metres),
converted with the gripper mapping of the robot description.

Per camera (`ros2.cameras`): a sensor_msgs/Image (rgb8, bgr8, mono8) or CompressedImage (JPEG,
PNG) topic, read with sensor QoS and decoded to uint8 HWC RGB on arrival.

`observe()` returns the newest joint state of every arm and the newest frame of every camera it
was asked for; `last_update` is when the oldest joint state arrived (this process's monotonic
clock): the Controller's watchdog stops commanding when it gets old. `camera_age_s()` says how
old each camera's newest frame is, for a caller that warns on stale frames. `act()` publishes
the command and returns it; safety is the caller's (`robo_rl.hardware.safety.SafetyFilter`,
which the Controller applies before `act`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from robo_rl.data.rosbag import rgb_from_message
from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Observation, RobotSpec, read_robot_yaml
from robo_rl.hardware.ros2.messages import (CompressedImage, Duration, Float64MultiArray, Header, Image, JointState,
                                            JointTrajectory, JointTrajectoryPoint, Time)

COMMAND_TYPES = {"trajectory": JointTrajectory, "forward": Float64MultiArray}
IMAGE_TYPES = {"image": Image, "compressed": CompressedImage}


@dataclass(frozen=True)
class ArmTopics:
    name: str
    joint_states: str
    command: str
    command_type: str          # trajectory | forward
    joints: tuple[str, ...]    # the robot's joint names, in our action order for this arm
    indices: tuple[int, ...]   # where they sit in the action vector


@dataclass(frozen=True)
class CameraTopic:
    name: str   # a camera of the robot description's `cameras:`
    topic: str
    type: str   # image (sensor_msgs/Image) | compressed (sensor_msgs/CompressedImage)


@dataclass(frozen=True)
class Ros2Config:
    domain_id: int
    arms: tuple[ArmTopics, ...]
    cameras: tuple[CameraTopic, ...] = ()

    def camera_topics(self, names: Sequence[str] | None, who: str) -> tuple[CameraTopic, ...]:
        """The configured cameras called `names` (None: all); `who` asks, for the error."""
        by_name = {c.name: c for c in self.cameras}
        if names is None:
            return self.cameras
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ConfigError(f"{who}: camera(s) {unknown} have no topic in the robot's ros2.cameras "
                              f"(it has {sorted(by_name) or 'none'})")
        return tuple(by_name[n] for n in names)

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
        return cls(int(d.get("domain_id", 0)), tuple(arms), _cameras_from_yaml(path, d.get("cameras"), spec))


def _cameras_from_yaml(path: Path, cameras: Any, spec: RobotSpec) -> tuple[CameraTopic, ...]:
    """The `ros2.cameras:` mapping (camera -> {topic, type}), checked against the description's cameras."""
    if cameras is None:
        return ()
    if not isinstance(cameras, dict):
        raise ConfigError(f"{path}: ros2.cameras is a mapping of camera name to {{topic, type}}, "
                          f"not a {type(cameras).__name__}")
    known = [c.name for c in spec.cameras]
    out: list[CameraTopic] = []
    for name, c in cameras.items():
        where = f"{path}: ros2.cameras.{name}"
        if name not in known:
            raise ConfigError(f"{where}: {spec.name} has no camera {name!r}; its cameras (`cameras:`) are {known}")
        if not isinstance(c, dict):
            raise ConfigError(f"{where} is a mapping {{topic: /..., type: image|compressed}}, not {c!r}")
        extra = sorted(set(c) - {"topic", "type"})
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {extra}; a camera has topic and type")
        topic, kind = c.get("topic"), c.get("type", "image")
        if not isinstance(topic, str) or not topic.strip("/"):
            raise ConfigError(f"{where}.topic={topic!r}; give the ROS topic its frames arrive on, e.g. /cam_high/image_raw")
        if kind not in IMAGE_TYPES:
            raise ConfigError(f"{where}.type={kind!r}; choose image (sensor_msgs/Image) or compressed "
                              "(sensor_msgs/CompressedImage)")
        if topic in [o.topic for o in out]:
            raise ConfigError(f"{where}.topic={topic} is another camera's topic too; one topic per camera")
        out.append(CameraTopic(name, topic, kind))
    return tuple(out)


def resize_rgb(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HWC RGB frame resized to (height, width): area averaging (swscale, through PyAV)."""
    import av

    h, w = size
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
    return frame.reformat(width=w, height=h, interpolation="AREA").to_ndarray()


def to_wire(spec: RobotSpec, action: np.ndarray) -> np.ndarray:
    """Action units -> what the topics carry: grippers as finger positions (m)."""
    out = np.asarray(action, dtype=np.float64).copy()
    for i, g in spec.grippers.items():
        out[i] = g.to_finger(out[i])
    return out


def from_wire(spec: RobotSpec, values: Mapping[int, float]) -> dict[int, float]:
    """{action index: value on the wire} -> action units."""
    return {i: float(spec.grippers[i].from_finger(v)) if i in spec.grippers else float(v) for i, v in values.items()}


class Ros2Camera:
    """One camera over ROS 2; implements robo_rl.hardware.robot.Camera. Frames are decoded (and
    resized to `size`) on the transport's thread as they arrive, so `read()` costs nothing."""

    def __init__(self, topic: CameraTopic, size: tuple[int, int] | None = None):
        self.name, self.topic, self.size = topic.name, topic, size
        self._lock = threading.Lock()
        self._frame: np.ndarray | None = None
        self._arrived: float | None = None
        self.bad_frames = 0  # frames that arrived but did not decode
        self.bad_reason = ""

    def attach(self, transport: Any) -> None:
        transport.subscribe(self.topic.topic, IMAGE_TYPES[self.topic.type], self._on_frame, qos="sensor")

    def read(self) -> tuple[np.ndarray, float] | None:
        """(the newest frame, uint8 HWC RGB; when it arrived, monotonic), or None before the first.
        Frames are replaced whole on arrival, never written into: the array is a snapshot."""
        with self._lock:
            return None if self._frame is None else (self._frame, self._arrived)

    def _on_frame(self, msg: Any) -> None:
        try:
            rgb = rgb_from_message(msg)
            if self.size is not None and rgb.shape[:2] != self.size:
                rgb = resize_rgb(rgb, self.size)
        except Exception as e:  # noqa: BLE001 - a bad frame on the wire is counted and reported, never raised on DDS's thread
            with self._lock:
                self.bad_frames += 1
                self.bad_reason = str(e)
            return
        with self._lock:
            self._frame, self._arrived = rgb, time.monotonic()


class Ros2Robot:
    """Implements robo_rl.hardware.robot.Robot over a transport (DdsTransport here; rclpy's where
    ROS 2 is installed)."""

    def __init__(self, robot: str | Path = "aloha", transport: Any = None, config: Ros2Config | None = None,
                 cameras: Sequence[str] | None = None, image_sizes: Mapping[str, tuple[int, int]] | None = None):
        """`cameras`: the ones to read. Named ones are required: connect() waits for a frame from
        each. None reads every camera in ros2.cameras without waiting (each joins observe().images
        with its first frame), so a robot or `sim-bridge` without cameras still connects; [] reads none.
        `image_sizes`: camera -> (height, width) its frames are resized to (default: as they come)."""
        self.spec = RobotSpec.from_yaml(robot)
        self.config = config or Ros2Config.from_yaml(robot, self.spec)
        self.cameras = self.config.camera_topics(cameras, "Ros2Robot")
        self._required_cameras = () if cameras is None else self.cameras
        self.image_sizes = {k: (int(v[0]), int(v[1])) for k, v in (image_sizes or {}).items()}
        self.camera_readers = {c.name: Ros2Camera(c, self.image_sizes.get(c.name)) for c in self.cameras}
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
        for camera in self.camera_readers.values():
            camera.attach(self.transport)
        deadline = time.monotonic() + timeout_s
        domain = getattr(self.transport, "domain_id", self.config.domain_id)
        while self.last_update is None or self._waiting_for_frames():
            if time.monotonic() > deadline:
                missing = [a.joint_states for a in self.config.arms if self._arrived[a.name] is None]
                if missing:
                    raise ConfigError(f"no joint states on {', '.join(missing)} within {timeout_s:.0f} s "
                                      f"(ROS domain {domain}): is the robot (or `robo-rl sim-bridge`) up?")
                waiting = self._waiting_for_frames()
                readers = [self.camera_readers[c.name] for c in waiting]
                bad = "".join(f"; {r.bad_frames} {r.name} frame(s) did not decode: {r.bad_reason}"
                              for r in readers if r.bad_frames)
                raise ConfigError(f"no camera frames on {', '.join(f'{c.topic} ({c.name})' for c in waiting)} within "
                                  f"{timeout_s:.0f} s (ROS domain {domain}): are the cameras (or `robo-rl sim-bridge "
                                  f"cameras=[{','.join(c.name for c in waiting)}]`) up?{bad}")
            time.sleep(0.01)

    @property
    def last_update(self) -> float | None:
        """When the stalest arm's newest joint state arrived (monotonic), None before all have."""
        with self._lock:
            times = list(self._arrived.values())
        return None if any(t is None for t in times) else min(times)

    def wait_for_fresh(self, since: float, timeout_s: float = 2.0) -> bool:
        """Wait until every arm's joint state and every read camera's frame arrived after `since`
        (monotonic), e.g. after the twin reset its scene; False if that took over `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            frames = [r.read() for r in self.camera_readers.values()]
            if (self.last_update or -math.inf) > since and all(f is not None and f[1] > since for f in frames):
                return True
            time.sleep(0.002)
        return False

    def _waiting_for_frames(self) -> list[CameraTopic]:
        return [c for c in self._required_cameras if self.camera_readers[c.name].read() is None]

    @property
    def bad_frames(self) -> dict[str, int]:
        """Per camera, frames that arrived but did not decode."""
        return {name: r.bad_frames for name, r in self.camera_readers.items()}

    def camera_age_s(self) -> dict[str, float]:
        """Seconds since each camera's newest frame arrived (inf before its first)."""
        now = time.monotonic()
        frames = {name: r.read() for name, r in self.camera_readers.items()}
        return {name: float("inf") if f is None else now - f[1] for name, f in frames.items()}

    def observe(self) -> Observation:
        frames = {name: r.read() for name, r in self.camera_readers.items()}
        images = {name: f[0] for name, f in frames.items() if f is not None}
        with self._lock:  # timestamp: the robot's own stamp on its newest joint state
            return Observation(self._qpos.astype(np.float32), self._qvel.astype(np.float32), images, self._stamp)

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
