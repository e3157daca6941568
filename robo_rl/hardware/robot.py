"""The Robot protocol: the one seam between control code and a robot, simulated or real.

    spec                      joint names in action order, limits, grippers, cameras, rate
    connect()                 open the connection (sim: build renderers; real: start transports)
    observe() -> Observation  joint positions (grippers normalised 0..1), velocities, camera frames,
                              each with the time it was captured
    act(action) -> executed   send a 14-D absolute joint-position command; returns what was
                              actually sent after clipping (what gets recorded, never the request)
    close()

`RobotExtras` declares what some robots offer beyond that, each part optional: the episode loop
looks once per run for what a robot has (`extras_of`). `Camera` (a camera read on its own, e.g.
Ros2Camera) and the teleop devices' `TeleopDevice` (robo_rl/hardware/teleop/) are the other
protocols of the hardware layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import yaml

from robo_rl.assets import asset_dir
from robo_rl.errors import ConfigError

HARDWARE_DIR = asset_dir("hardware")


def read_robot_yaml(robot: str | Path) -> tuple[Path, dict]:
    """(path, contents) of a robot description: a file, or a name under hardware/ (`aloha`)."""
    path = Path(robot)
    if not path.is_file() and not path.suffix:
        path = HARDWARE_DIR / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"robot description {path} not found (robots are hardware/<name>.yaml)")
    try:
        d = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: a robot description is a mapping of keys, got {type(d).__name__}")
    return path, d


GRIPPER_UNITS = ("finger_m", "joint_rad", "normalized")


@dataclass(frozen=True)
class GripperSpec:
    """How a gripper travels on the wire. In actions and observations every gripper is 0 (closed)
    .. 1 (open); on the robot's topics it is `closed + g * (open - closed)` in its own unit:
    finger_m (finger travel in metres), joint_rad (a gripper joint's angle) or normalized (0..1
    unless said otherwise). The twin's fingers are the twin's business (sim/robot.py)."""

    unit: str = "finger_m"
    closed: float = 0.0  # wire value at gripper 0
    open: float = 1.0    # wire value at gripper 1

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "GripperSpec":
        if not isinstance(d, dict):
            raise ConfigError(f"{where}.gripper is a mapping {{unit: finger_m|joint_rad|normalized, closed, open}}, not {d!r}")
        extra = sorted(set(d) - {"unit", "closed", "open"})
        if extra:
            raise ConfigError(f"{where}.gripper: unknown key(s) {extra}; a gripper has unit, closed and open (its wire "
                              "values at closed and open)")
        unit = d.get("unit", "finger_m")
        if unit not in GRIPPER_UNITS:
            raise ConfigError(f"{where}.gripper.unit={unit!r}; choose one of {', '.join(GRIPPER_UNITS)}")
        if unit != "normalized" and ("closed" not in d or "open" not in d):
            raise ConfigError(f"{where}.gripper: unit {unit} needs closed and open (the wire values at closed and open)")
        try:
            g = cls(unit, float(d.get("closed", 0.0)), float(d.get("open", 1.0)))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}.gripper: closed and open are numbers ({e})") from None
        if g.closed == g.open:
            raise ConfigError(f"{where}.gripper: closed and open are both {g.closed}; they must differ")
        return g

    def to_wire(self, g: np.ndarray | float) -> np.ndarray | float:
        return self.closed + np.asarray(g) * (self.open - self.closed)

    def from_wire(self, q: np.ndarray | float) -> np.ndarray | float:
        return (np.asarray(q) - self.closed) / (self.open - self.closed)


@dataclass(frozen=True)
class CameraSpec:
    name: str
    height: int
    width: int


@dataclass(frozen=True)
class RobotSpec:
    name: str
    joint_names: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    grippers: dict[int, GripperSpec]  # action index -> its wire units
    cameras: tuple[CameraSpec, ...]
    control_hz: float
    home: np.ndarray

    @property
    def action_dim(self) -> int:
        return len(self.joint_names)

    @property
    def camera_sizes(self) -> dict[str, tuple[int, int]]:
        """Camera name -> (height, width) its frames come at (the description's `cameras:`)."""
        return {c.name: (c.height, c.width) for c in self.cameras}

    def clip(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.lower, self.upper)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RobotSpec":
        path, d = read_robot_yaml(path)
        try:
            joints = d["joints"]
            names = tuple(j["name"] for j in joints)
            lower = np.array([float(j["lower"]) for j in joints], dtype=np.float32)
            upper = np.array([float(j["upper"]) for j in joints], dtype=np.float32)
            grippers = {i: GripperSpec.from_dict(j["gripper"], f"{path}: joints[{i}] ({j['name']})")
                        for i, j in enumerate(joints) if "gripper" in j}
            cams = tuple(CameraSpec(c["name"], int(c["height"]), int(c["width"])) for c in d.get("cameras", []))
            home = np.array(d.get("home", (lower + upper) / 2), dtype=np.float32)
            spec = cls(d["name"], names, lower, upper, grippers, cams, float(d["control_hz"]), home)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}: malformed robot description ({type(e).__name__}: {e})") from None
        if (lower > upper).any() or len(home) != len(names):
            raise ConfigError(f"{path}: limits or home pose inconsistent with {len(names)} joints")
        return spec


@dataclass
class Observation:
    qpos: np.ndarray  # (n,) float32, action order, grippers normalised
    qvel: np.ndarray  # (n,) float32
    images: dict[str, np.ndarray] = field(default_factory=dict)  # camera -> uint8 HWC RGB
    timestamp: float = 0.0  # capture time, seconds
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # more observation keys by store name (the twin's obs/env_state)


@runtime_checkable
class Camera(Protocol):
    """One camera. Ros2Camera reads ROS 2 image topics; the twin renders its cameras inside
    SimRobot.observe() instead, in step with the physics."""

    name: str

    def read(self) -> tuple[np.ndarray, float] | None:
        """(the newest frame, uint8 HWC RGB; when it was captured or arrived, seconds), or None
        before the first frame."""
        ...


@runtime_checkable
class Robot(Protocol):
    spec: RobotSpec

    def connect(self) -> None: ...

    def observe(self) -> Observation: ...

    def act(self, action: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


@dataclass
class Outcome:
    """What a robot that knows its task (the twin) says after a step."""
    stage: int
    max_stage: int
    success: bool          # the task is done now
    truncated: bool        # the task's time limit is reached
    disturbed: bool = False  # the task's disturbance struck this episode (PackCube: the cube slipped)


class RobotExtras(Protocol):
    """What some robots offer beyond Robot, and the episode loop uses where a robot has it. Each
    part is optional; `extras_of` looks them up once."""

    last_update: float | None  # a robot fed by messages: when its newest joint state arrived (monotonic)

    def wait_for_fresh(self, since: float, timeout_s: float = 2.0) -> bool:
        """Wait until joint states (and the cameras that stream) newer than `since` have arrived."""
        ...

    def fault(self) -> str | None:
        """Why the robot must not be commanded now (ROS 2: another writer on its command topic), or None."""
        ...

    def not_following_hint(self) -> str:
        """The robot's own advice when it does not follow its commands (e.g. the topics they went to)."""
        ...

    def outcome(self) -> Outcome:
        """A robot that knows its task (the twin): where the episode stands after the last step."""
        ...


@dataclass(frozen=True)
class Extras:
    """The parts of RobotExtras one robot has (None: it has not)."""
    last_update: Callable[[], float | None] | None
    wait_for_fresh: Callable[..., bool] | None
    fault: Callable[[], str | None] | None
    not_following_hint: Callable[[], str] | None
    outcome: Callable[[], Outcome] | None


def extras_of(robot: Any) -> Extras:
    """What `robot` has of RobotExtras, looked up once (the loop does not ask every tick)."""
    return Extras(last_update=(lambda: robot.last_update) if hasattr(robot, "last_update") else None,
                  wait_for_fresh=getattr(robot, "wait_for_fresh", None), fault=getattr(robot, "fault", None),
                  not_following_hint=getattr(robot, "not_following_hint", None),
                  outcome=getattr(robot, "outcome", None))
