"""Ros2Robot: the Robot protocol over ROS 2 topics, configured by the `ros2:` section of
hardware/<robot>.yaml.

Joint states arrive as sensor_msgs/JointState, read by joint name: one topic per arm, or one
topic with every joint (ros2_control's joint_state_broadcaster). Commands leave either as
trajectory_msgs/JointTrajectory (a JointTrajectoryController; one point, `time_from_start` one
tick) or std_msgs/Float64MultiArray (a forward position controller, values in a declared joint
order): one topic per arm, or one for all joints. `joints` names the joints as the robot calls
them, in our action order. Grippers travel in their wire unit (finger metres, joint radians or
normalised), converted with the gripper mapping of the robot description.

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

from robo_rl.data.codecs import resize_rgb, rgb_from_message
from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Observation, RobotSpec, read_robot_yaml
from robo_rl.hardware.ros2.messages import (CompressedImage, Duration, Float64MultiArray, Header, Image, JointState,
                                            JointTrajectory, JointTrajectoryPoint, Time)

COMMAND_TYPES = {"trajectory": JointTrajectory, "forward": Float64MultiArray}
IMAGE_TYPES = {"image": Image, "compressed": CompressedImage}


@dataclass(frozen=True)
class JointTopic:
    """A sensor_msgs/JointState topic read by joint name: one per arm, or one carrying every joint
    of both arms (ros2_control's joint_state_broadcaster)."""

    topic: str
    joints: tuple[str, ...]    # the robot's names for the joints it carries, in action order
    indices: tuple[int, ...]   # where they sit in the action vector


@dataclass(frozen=True)
class CommandTopic:
    """A command topic: trajectory (trajectory_msgs/JointTrajectory, one point naming `joints`) or
    forward (std_msgs/Float64MultiArray, the values in the order of `joints`). One per arm, or one
    for all joints (a forward position controller or a JointTrajectoryController over both arms)."""

    topic: str
    type: str                  # trajectory | forward
    joints: tuple[str, ...]
    indices: tuple[int, ...]

    def describe(self) -> str:
        what = f"{len(self.joints)} values" if self.type == "forward" else f"{len(self.joints)} named joints"
        return f"{self.topic} ({self.type}, {what})"


@dataclass(frozen=True)
class CameraTopic:
    name: str   # a camera of the robot description's `cameras:`
    topic: str
    type: str   # image (sensor_msgs/Image) | compressed (sensor_msgs/CompressedImage)


LAYOUT_HELP = ("give `joint_states` and `command` once for all joints (top level of ros2:), or per arm under "
               "ros2.arms.<arm>; see hardware/aloha.yaml, aloha_shared_forward.yaml and aloha_shared_trajectory.yaml")


@dataclass(frozen=True)
class Ros2Config:
    """The `ros2:` section of a robot description: where joint states come from and commands go
    (per arm, or one topic for all joints, in any mix), and the cameras' topics."""

    domain_id: int | None  # None: ROS_DOMAIN_ID, else 0
    states: tuple[JointTopic, ...]
    commands: tuple[CommandTopic, ...]
    cameras: tuple[CameraTopic, ...] = ()
    discovery: Mapping[str, Any] | None = None  # ros2.discovery: over ROS 2's discovery variables
    where: str = "ros2"

    def scope(self, domain_id: int | None = None) -> Any:
        """The discovery scope in force (robo_rl/hardware/ros2/discovery.py): this description's
        ros2.discovery and domain_id over the environment's; `domain_id` (the command line's) over all."""
        from robo_rl.hardware.ros2.discovery import resolve_scope

        return resolve_scope(self.discovery, self.where, self.domain_id if domain_id is None else domain_id)

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

    def describe(self) -> str:
        """One line: which topics carry what, for a verb's start-up message."""
        states = ", ".join(f"{t.topic} ({len(t.joints)} joints)" for t in self.states)
        return f"joint states {states}; commands {', '.join(c.describe() for c in self.commands)}"

    @classmethod
    def from_yaml(cls, robot: str | Path, spec: RobotSpec) -> "Ros2Config":
        path, d = read_robot_yaml(robot)
        d = d.get("ros2")
        if not d:
            raise ConfigError(f"{path}: no `ros2:` section (joint state and command topics); {LAYOUT_HELP}")
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: ros2 is a mapping; {LAYOUT_HELP}")
        states, commands = _layout_from_yaml(path, d, spec)
        domain = d.get("domain_id")
        if domain is not None and (not isinstance(domain, int) or not 0 <= domain <= 232):
            raise ConfigError(f"{path}: ros2.domain_id={domain!r}; give 0..232, or leave it out for ROS_DOMAIN_ID")
        config = cls(domain, states, commands, _cameras_from_yaml(path, d.get("cameras"), spec), d.get("discovery"),
                     f"{path}: ros2")
        config.scope()  # a bad discovery section is an error now, not at connect
        return config


def _names(value: Any, n: int, where: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != n or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.joints: give {n} joint names ({what}), got {value!r}")
    if len(set(value)) != n:
        raise ConfigError(f"{where}.joints names a joint twice: {list(value)}")
    return tuple(value)


def _command_type(value: Any, where: str) -> str:
    if value not in COMMAND_TYPES:
        raise ConfigError(f"{where}.command_type={value!r}; choose one of {sorted(COMMAND_TYPES)}")
    return str(value)


def _topic(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip("/"):
        raise ConfigError(f"{where}={value!r}; give a ROS topic, e.g. /joint_states")
    return value


def _layout_from_yaml(path: Path, d: dict, spec: RobotSpec) -> tuple[tuple[JointTopic, ...], tuple[CommandTopic, ...]]:
    """Joint-state and command topics from `ros2:`. A key at the top level (joint_states,
    command, command_type, joints) covers every joint; under `arms.<arm>` it covers the joints
    named `<arm>_*`. Each of joint states and commands is given once: for all, or per arm."""
    n = spec.action_dim
    where = f"{path}: ros2"
    known = {"domain_id", "discovery", "arms", "cameras", "joint_states", "command", "command_type", "joints"}
    extra = sorted(set(d) - known)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")
    all_joints = _names(d["joints"], n, where, "the robot's names for every joint, in action order") \
        if "joints" in d else spec.joint_names
    everything = tuple(range(n))
    states: list[JointTopic] = []
    commands: list[CommandTopic] = []

    def add(section: dict, at: str, joints: tuple[str, ...], indices: tuple[int, ...]) -> None:
        """The joint-state and command topics `section` names, for these joints."""
        if "joint_states" in section:
            states.append(JointTopic(_topic(section["joint_states"], f"{at}.joint_states"), joints, indices))
        if "command" in section:
            commands.append(CommandTopic(_topic(section["command"], f"{at}.command"),
                                         _command_type(section.get("command_type", "trajectory"), at), joints, indices))
        elif "command_type" in section:
            raise ConfigError(f"{at}.command_type without {at}.command; put command_type beside the command it describes")

    add(d, where, all_joints, everything)
    arms = d.get("arms") or {}
    if not isinstance(arms, dict):
        raise ConfigError(f"{where}.arms is a mapping of arm name to its topics; {LAYOUT_HELP}")
    for name, a in arms.items():
        at = f"{where}.arms.{name}"
        if not isinstance(a, dict):
            raise ConfigError(f"{at} is a mapping {{joint_states, command, command_type, joints}}, not {a!r}")
        extra = sorted(set(a) - {"joint_states", "command", "command_type", "joints"})
        if extra:
            raise ConfigError(f"{at}: unknown key(s) {extra}; an arm has joint_states, command, command_type, joints")
        indices = tuple(i for i, j in enumerate(spec.joint_names) if j.startswith(f"{name}_"))
        if not indices:
            raise ConfigError(f"{at}: {spec.name} has no joints named {name}_* (its joints: {list(spec.joint_names)})")
        joints = _names(a["joints"], len(indices), at, f"this arm's joints {name}_* as the robot names them") \
            if "joints" in a else tuple(spec.joint_names[i][len(name) + 1:] for i in indices)
        for key, given, per_arm in (("joint_states", "joint_states" in d, "joint_states" in a),
                                    ("command", "command" in d, "command" in a)):
            if given and per_arm:
                raise ConfigError(f"{at}.{key} and ros2.{key} both given; give {key} once: {LAYOUT_HELP}")
        add(a, at, joints, indices)
    for what, topics in (("joint_states", states), ("command", commands)):
        covered = sorted(i for t in topics for i in t.indices)
        if covered != list(everything):
            raise ConfigError(f"{where}: the {what} topics cover action indices {covered}, not each of the "
                              f"{n} joints once; {LAYOUT_HELP}")
    for what, topics in (("joint_states", states), ("command", commands)):
        names = [t.topic for t in topics]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: {what} topic {names} repeats; give a topic shared by several arms once, "
                              "at the top level of ros2:")
    return tuple(states), tuple(commands)


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


def to_wire(spec: RobotSpec, action: np.ndarray, velocity: bool = False) -> np.ndarray:
    """Action units -> what the topics carry: grippers in their wire unit (the description's).
    `velocity`: the values are rates (a gripper's scales, without the offset)."""
    out = np.asarray(action, dtype=np.float64).copy()
    for i, g in spec.grippers.items():
        out[i] = out[i] * (g.open - g.closed) if velocity else g.to_wire(out[i])
    return out


def from_wire(spec: RobotSpec, values: Mapping[int, float], velocity: bool = False) -> dict[int, float]:
    """{action index: value on the wire} -> action units (rates with `velocity`)."""
    out = {}
    for i, v in values.items():
        g = spec.grippers.get(i)
        out[i] = float(v) if g is None else float(v / (g.open - g.closed) if velocity else g.from_wire(v))
    return out


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


WRITER_SETTLE_S = 0.3  # connect(): discovery time given to other writers before the check
WRITER_POLL_S = 0.05   # how often the watch thread asks DDS whether a writer appeared


class Ros2Robot:
    """Implements robo_rl.hardware.robot.Robot over a transport (DdsTransport here; rclpy's where
    ROS 2 is installed)."""

    def __init__(self, robot: str | Path = "aloha", transport: Any = None, config: Ros2Config | None = None,
                 cameras: Sequence[str] | None = None, image_sizes: Mapping[str, tuple[int, int]] | None = None,
                 allow_other_writers: bool = False):
        """`cameras`: the ones to read. Named ones are required: connect() waits for a frame from
        each. None reads every camera in ros2.cameras without waiting (each joins observe().images
        with its first frame), so a robot or `sim-bridge` without cameras still connects; [] reads none.
        `image_sizes`: camera -> (height, width) its frames are resized to (default: as they come).
        One driver per arm: connect() refuses a command topic that another writer publishes on,
        and fault() stops the episode loop when one appears, unless `allow_other_writers`."""
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
        self._arrived: dict[str, float | None] = {t.topic: None for t in self.config.states}
        self._stamp = 0.0
        self._publish: dict[str, Any] = {}
        self.period = 1.0 / self.spec.control_hz
        self.allow_other_writers = allow_other_writers
        self._writer_problem: str | None = None  # set by the watch thread: fault() reads it each tick
        self._stop_watch = threading.Event()
        self._watch: threading.Thread | None = None

    # ------------------------------------------------------------------ Robot protocol
    def connect(self, timeout_s: float = 5.0) -> None:
        if self.transport is None:
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            self.transport = make_transport(scope=self.config.scope())
        for states in self.config.states:
            self.transport.subscribe(states.topic, JointState, lambda msg, t=states: self._on_state(t, msg), qos="sensor")
        for command in self.config.commands:
            self._publish[command.topic] = self.transport.publisher(command.topic, COMMAND_TYPES[command.type])
        for camera in self.camera_readers.values():
            camera.attach(self.transport)
        deadline = time.monotonic() + timeout_s
        domain = getattr(self.transport, "domain_id", self.config.domain_id)
        while self.last_update is None or self._waiting_for_frames():
            if time.monotonic() > deadline:
                missing = [t.topic for t in self.config.states if self._arrived[t.topic] is None]
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
        if not self.allow_other_writers:
            # the robot's own writers were discovered with its joint states; a writer of another
            # participant on this host is found within the same few hundred ms
            time.sleep(WRITER_SETTLE_S)
            make_view = getattr(self.transport, "writer_view", None)
            view = make_view() if make_view is not None else None  # the watch thread's, made before the count
            problem = self.other_writers_problem()
            if problem:
                raise ConfigError(f"{problem}: two drivers would fight over the arm. Stop the other one (a teleop, "
                                  "deploy or record still running, or a colleague's node), or pass "
                                  "allow_other_writers=true where that writer belongs (e.g. a safety node)")
            self._watch = threading.Thread(target=self._watch_writers, args=(view,), name="writer-watch", daemon=True)
            self._watch.start()

    def other_writers_problem(self, count: Any = None) -> str | None:
        """'N other writer(s) on <topic>' for the first command topic someone else publishes on, or
        None. `count(topic)`: the transport's other_writers, or a watcher's own view of them."""
        count = count or getattr(self.transport, "other_writers", None)
        if count is None:
            return None
        for command in self.config.commands:
            n = count(command.topic)
            if n:
                return f"{n} other writer{'s' if n > 1 else ''} on {command.topic}"
        return None

    def fault(self) -> str | None:
        """Once per tick in the episode loop: a reason to stop now (a writer appeared on a command
        topic), else None. An attribute read: the watch thread does the asking (a call into DDS
        here would let go of the GIL, and a policy thread could then hold the tick up for a
        switch interval)."""
        return self._writer_problem

    def _watch_writers(self, view: Any) -> None:
        """Every WRITER_POLL_S: has DDS discovered a writer appear or go? If so, recount (a
        transport without a view, rclpy's, is recounted every time)."""
        while not self._stop_watch.wait(WRITER_POLL_S):
            try:
                if view is not None and not view.changed():
                    continue
                problem = self.other_writers_problem(view.others if view is not None else None)
            except Exception:  # noqa: BLE001 - the transport closing under the thread: nothing more to watch
                return
            if problem:
                self._writer_problem = f"{problem} appeared mid-run: stopped; the arm holds its last command"
                return

    @property
    def last_update(self) -> float | None:
        """When the stalest joint-state topic's newest message arrived (monotonic), None before all have."""
        with self._lock:
            times = list(self._arrived.values())
        return None if any(t is None for t in times) else min(times)

    def wait_for_fresh(self, since: float, timeout_s: float = 2.0) -> bool:
        """Wait until every arm's joint state and every read camera's frame arrived after `since`
        (monotonic), e.g. after the twin reset its scene; False if that took over `timeout_s`. A
        camera that never sent a frame is not waited for: observations leave it out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            frames = [r.read() for r in self.camera_readers.values()]
            if (self.last_update or -math.inf) > since and all(f is None or f[1] > since for f in frames):
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
        for command in self.config.commands:
            values = [float(wire[i]) for i in command.indices]
            if command.type == "trajectory":
                msg = JointTrajectory(Header(Time.now()), list(command.joints),
                                      [JointTrajectoryPoint(values, time_from_start=Duration.from_seconds(self.period))])
            else:
                msg = Float64MultiArray(data=values)
            self._publish[command.topic](msg)
        return a.astype(np.float32)

    def not_following_hint(self) -> str:
        """What to check when the arms do not follow the commands (the Controller's tracking stop)."""
        return ("Likely: its controller is not active (`ros2 control list_controllers`), the commands go where no "
                f"controller listens ({', '.join(c.describe() for c in self.config.commands)}), or the joint order or "
                "message size is not the controller's (it refuses them)")

    def close(self) -> None:
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.join(timeout=2 * WRITER_POLL_S + 1.0)
        if self.transport is not None:
            self.transport.close()

    def _on_state(self, states: JointTopic, msg: JointState) -> None:
        pos = dict(zip(msg.name, msg.position))
        vel = dict(zip(msg.name, msg.velocity))
        if any(j not in pos for j in states.joints):
            return  # a partial message (another controller's joints): not ours
        q = from_wire(self.spec, {i: pos[j] for i, j in zip(states.indices, states.joints)})
        v = from_wire(self.spec, {i: vel.get(j, 0.0) for i, j in zip(states.indices, states.joints)}, velocity=True)
        with self._lock:
            for i in states.indices:
                self._qpos[i] = q[i]
                self._qvel[i] = v[i]
            self._arrived[states.topic] = time.monotonic()
            self._stamp = msg.header.stamp.seconds()
