"""ROS 2 messages that robo_rl sends and receives, declared once, with ROS's own field names.

Each class is a CycloneDDS IDL struct under the DDS type name ROS 2 gives the message
(`sensor_msgs/msg/JointState` -> `sensor_msgs::msg::dds_::JointState_`), so the DDS transport puts
them on the wire as a ROS 2 node would, with no ROS install. The field names are ROS's, so the
rclpy transport (next) can copy them by name into rclpy's classes: one message layer for both.
"""

# No `from __future__ import annotations`: CycloneDDS reads the field types at run time.
import time
from dataclasses import dataclass, field

from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import float64, int32, sequence, uint8, uint32


def ros_type(pkg: str, name: str) -> str:
    """ROS 2's DDS type name for pkg/msg/name."""
    return f"{pkg}::msg::dds_::{name}_"


def ros_topic(topic: str) -> str:
    """ROS 2's DDS topic name for a ROS topic: '/follower/joint_states' -> 'rt/follower/joint_states'."""
    return "rt/" + topic.lstrip("/")


def _sec_nanosec(t: float) -> tuple[int, int]:
    """Seconds as ROS's (sec, nanosec) pair, nanosec in [0, 1e9)."""
    sec = int(t // 1)
    return sec, int(round((t - sec) * 1e9)) % 1_000_000_000


@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: int32 = 0
    nanosec: uint32 = 0

    @classmethod
    def from_seconds(cls, t: float) -> "Time":
        return cls(*_sec_nanosec(t))

    @classmethod
    def now(cls) -> "Time":
        return cls.from_seconds(time.time())

    def seconds(self) -> float:
        return self.sec + self.nanosec * 1e-9


@dataclass
class Duration(IdlStruct, typename="builtin_interfaces::msg::dds_::Duration_"):
    sec: int32 = 0
    nanosec: uint32 = 0

    @classmethod
    def from_seconds(cls, t: float) -> "Duration":
        return cls(*_sec_nanosec(t))


@dataclass
class Header(IdlStruct, typename=ros_type("std_msgs", "Header")):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class JointState(IdlStruct, typename=ros_type("sensor_msgs", "JointState")):
    header: Header = field(default_factory=Header)
    name: sequence[str] = field(default_factory=list)
    position: sequence[float64] = field(default_factory=list)
    velocity: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)


@dataclass
class JointTrajectoryPoint(IdlStruct, typename=ros_type("trajectory_msgs", "JointTrajectoryPoint")):
    positions: sequence[float64] = field(default_factory=list)
    velocities: sequence[float64] = field(default_factory=list)
    accelerations: sequence[float64] = field(default_factory=list)
    effort: sequence[float64] = field(default_factory=list)
    time_from_start: Duration = field(default_factory=Duration)


@dataclass
class JointTrajectory(IdlStruct, typename=ros_type("trajectory_msgs", "JointTrajectory")):
    header: Header = field(default_factory=Header)
    joint_names: sequence[str] = field(default_factory=list)
    points: sequence[JointTrajectoryPoint] = field(default_factory=list)


@dataclass
class MultiArrayDimension(IdlStruct, typename=ros_type("std_msgs", "MultiArrayDimension")):
    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
class MultiArrayLayout(IdlStruct, typename=ros_type("std_msgs", "MultiArrayLayout")):
    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
class Float64MultiArray(IdlStruct, typename=ros_type("std_msgs", "Float64MultiArray")):
    """What a ros2_control forward command controller takes."""

    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


@dataclass
class Image(IdlStruct, typename=ros_type("sensor_msgs", "Image")):
    header: Header = field(default_factory=Header)
    height: uint32 = 0
    width: uint32 = 0
    encoding: str = ""
    is_bigendian: uint8 = 0
    step: uint32 = 0
    data: sequence[uint8] = field(default_factory=list)


@dataclass
class CompressedImage(IdlStruct, typename=ros_type("sensor_msgs", "CompressedImage")):
    header: Header = field(default_factory=Header)
    format: str = ""
    data: sequence[uint8] = field(default_factory=list)


@dataclass
class Bool(IdlStruct, typename=ros_type("std_msgs", "Bool")):
    """The e-stop topic's message."""

    data: bool = False


MESSAGES = {cls.__name__: cls for cls in (JointState, JointTrajectory, JointTrajectoryPoint, Float64MultiArray,
                                          Image, CompressedImage, Bool, Header, Time, Duration)}

