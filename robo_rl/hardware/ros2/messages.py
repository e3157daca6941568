"""ROS 2 messages that robo_rl sends and receives, declared once, with ROS's own field names.

Each class is a CycloneDDS IDL struct under the DDS type name ROS 2 gives the message
(`sensor_msgs/msg/JointState` -> `sensor_msgs::msg::dds_::JointState_`), so the DDS transport puts
them on the wire as a ROS 2 node would, with no ROS install. The field names are ROS's, so the
rclpy transport (next) can copy them by name into rclpy's classes: one message layer for both.
"""

# No `from __future__ import annotations`: CycloneDDS reads the field types at run time.
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

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
    """`data` is `bytes`: `height` rows of `step` bytes. On the wire a plain uint8[]."""

    header: Header = field(default_factory=Header)
    height: uint32 = 0
    width: uint32 = 0
    encoding: str = ""
    is_bigendian: uint8 = 0
    step: uint32 = 0
    data: sequence[uint8] = b""

    # CycloneDDS's generic serializer packs and unpacks a uint8[] one Python int per byte (tens of
    # ms for a 640x480 frame); these write and read the same CDR bytes with one copy of `data`.
    def serialize(self, buffer=None, endianness=None, use_version_2=None) -> bytes:
        if buffer is not None or endianness is not None or use_version_2:
            return IdlStruct.serialize(self, buffer, endianness, use_version_2)
        w = _CdrWriter()
        w.header(self.header)
        w.u32(self.height)
        w.u32(self.width)
        w.string(self.encoding)
        w.u8(self.is_bigendian)
        w.u32(self.step)
        return w.finish_with_octets(self.data)

    @classmethod
    def deserialize(cls, data, has_header=True, use_version_2=None) -> "Image":
        r = _CdrReader.open(data, has_header, use_version_2)
        if r is None:
            return _generic_deserialize(cls, data, has_header, use_version_2)
        return cls(r.header(), r.u32(), r.u32(), r.string(), r.u8(), r.u32(), r.octets())


@dataclass
class CompressedImage(IdlStruct, typename=ros_type("sensor_msgs", "CompressedImage")):
    """`data` is the encoded image (JPEG or PNG) as `bytes`; `format` e.g. "jpeg" or
    "rgb8; jpeg compressed bgr8" (image_transport's)."""

    header: Header = field(default_factory=Header)
    format: str = ""
    data: sequence[uint8] = b""

    def serialize(self, buffer=None, endianness=None, use_version_2=None) -> bytes:
        if buffer is not None or endianness is not None or use_version_2:
            return IdlStruct.serialize(self, buffer, endianness, use_version_2)
        w = _CdrWriter()
        w.header(self.header)
        w.string(self.format)
        return w.finish_with_octets(self.data)

    @classmethod
    def deserialize(cls, data, has_header=True, use_version_2=None) -> "CompressedImage":
        r = _CdrReader.open(data, has_header, use_version_2)
        if r is None:
            return _generic_deserialize(cls, data, has_header, use_version_2)
        return cls(r.header(), r.string(), r.octets())


def _generic_deserialize(cls, data, has_header, use_version_2):
    """CycloneDDS's own reader, for an encoding _CdrReader leaves alone; `data` made bytes."""
    msg = cls.__idl__.deserialize(data, has_header=has_header, use_version_2=use_version_2)
    msg.data = bytes(msg.data)
    return msg


# Plain CDR for the two image messages, as CycloneDDS lays them out: XCDR1 (or XCDR2, the same for
# these final structs without 8-byte members), offsets aligned from the end of the 4-byte
# encapsulation header. tests/test_ros2_cameras.py checks both against CycloneDDS byte for byte.
class _CdrWriter:
    def __init__(self) -> None:
        # CDR_LE: the generic serializer writes the host's order, and so must this one
        self.parts: list[bytes] = [b"\x00\x01\x00\x00" if sys.byteorder == "little" else b"\x00\x00\x00\x00"]
        self.size = 0  # bytes after the encapsulation header

    def _put(self, b: bytes, align: int) -> None:
        pad = -self.size % align
        self.parts.append(bytes(pad) + b)
        self.size += pad + len(b)

    def u8(self, v: int) -> None:
        self._put(struct.pack("=B", v), 1)

    def u32(self, v: int) -> None:
        self._put(struct.pack("=I", v), 4)

    def string(self, s: str) -> None:
        b = s.encode()
        self._put(struct.pack("=I", len(b) + 1) + b + b"\0", 4)

    def header(self, h: Header) -> None:
        self._put(struct.pack("=iI", h.stamp.sec, h.stamp.nanosec), 4)
        self.string(h.frame_id)

    def finish_with_octets(self, data: Any) -> bytes:
        """The message, ending with `data` (bytes; a list of ints or a uint8 array works too) as a
        uint8[]: its length, then the bytes."""
        if not isinstance(data, (bytes, bytearray)):
            data = bytes(data)
        self.u32(len(data))
        return b"".join([*self.parts, data])


class _CdrReader:
    def __init__(self, buf: bytes, endian: str):
        self.buf, self.endian, self.pos = buf, endian, 4

    @classmethod
    def open(cls, data, has_header: bool, use_version_2) -> "_CdrReader | None":
        """A reader past the encapsulation header, or None for what CycloneDDS should read."""
        if not has_header or use_version_2 is not None or len(data) < 4 or data[0] != 0 or data[1] not in (0, 1, 6, 7):
            return None
        return cls(bytes(data), "<" if data[1] & 1 else ">")

    def _get(self, fmt: str, align: int) -> tuple:
        self.pos += -(self.pos - 4) % align
        values = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def u8(self) -> int:
        return self._get("B", 1)[0]

    def u32(self) -> int:
        return self._get("I", 4)[0]

    def string(self) -> str:
        n = self.u32()
        self.pos += n
        return self.buf[self.pos - n:self.pos - 1].decode()

    def header(self) -> Header:
        sec, nanosec = self._get("iI", 4)
        return Header(Time(sec, nanosec), self.string())

    def octets(self) -> bytes:
        n = self.u32()
        if self.pos + n > len(self.buf):
            raise ValueError(f"uint8[] of {n} bytes overruns a {len(self.buf)}-byte message")
        self.pos += n
        return self.buf[self.pos - n:self.pos]


@dataclass
class Bool(IdlStruct, typename=ros_type("std_msgs", "Bool")):
    """The e-stop topic's message."""

    data: bool = False


@dataclass
class String(IdlStruct, typename=ros_type("std_msgs", "String")):
    """The episode topics' message (JSON text, robo_rl/hardware/ros2/episodes.py)."""

    data: str = ""


MESSAGES = {cls.__name__: cls for cls in (JointState, JointTrajectory, JointTrajectoryPoint, Float64MultiArray,
                                          Image, CompressedImage, Bool, String, Header, Time, Duration)}

