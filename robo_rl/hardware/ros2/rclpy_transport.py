"""The rclpy transport: the same publisher/subscribe calls as DdsTransport, through a ROS 2
install's own client library (a machine with ROS 2 Humble or Jazzy sourced). rcl itself reads
ROS 2's discovery and SROS2 variables (ROS_SECURITY_ENABLE, ROS_SECURITY_KEYSTORE,
ROS_SECURITY_ENCLAVE_OVERRIDE, ROS_SECURITY_STRATEGY): security works here as in any ROS 2 node.

Only the pub/sub calls differ. Messages stay ours (messages.py) on both sides of this class;
they are copied field by field, by name, into the rclpy class of the same ROS type and back.
`make_transport()` picks rclpy when it is importable and DDS otherwise.
"""

from __future__ import annotations

import array
import dataclasses
import os
import importlib
import itertools
import threading
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Callable

from cyclonedds.idl.types import byte, uint8

from robo_rl.errors import ConfigError


def rclpy_available() -> bool:
    try:
        importlib.import_module("rclpy")
    except ImportError:
        return False
    return True


def ros_class(msg_type: type) -> Any:
    """Our message class -> rclpy's class of the same ROS type (pkg::msg::dds_::T_ -> pkg.msg.T)."""
    pkg, _, _, name = msg_type.__idl_typename__.split("::")
    return getattr(importlib.import_module(f"{pkg}.msg"), name.rstrip("_"))


def _item_type(annotation: Any) -> Any:
    """The element type of a `sequence[...]` field (Annotated[Sequence[X], ...] -> X)."""
    seq = typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation
    args = typing.get_args(seq)
    return args[0] if args else None


def to_ros(msg: Any) -> Any:
    """Our message -> the rclpy message with the same field values."""
    out = ros_class(type(msg))()
    for f in fields(msg):
        value = getattr(msg, f.name)
        if is_dataclass(value):
            value = to_ros(value)
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            value = [to_ros(v) for v in value]
        elif isinstance(value, (bytes, bytearray, memoryview)):
            value = array.array("B", value)  # a uint8[] (image data): rclpy takes an array without checking each byte
        setattr(out, f.name, value)
    return out


def from_ros(rmsg: Any, cls: type) -> Any:
    """An rclpy message -> our class with the same field values."""
    values = {}
    for f in fields(cls):
        value = getattr(rmsg, f.name)
        item = _item_type(f.type)
        if is_dataclass(f.type):
            value = from_ros(value, f.type)
        elif item is not None and is_dataclass(item):
            value = [from_ros(v, item) for v in value]
        elif item in (uint8, byte):
            value = bytes(value)  # our uint8[] fields hold bytes (image data); rclpy's array.array('B') copies in one go
        elif isinstance(value, (bytes, bytearray)) or hasattr(value, "tolist"):
            value = list(value)
        values[f.name] = value
    return cls(**values)


_NODES = itertools.count()


class RclpyTransport:
    """Publishers and subscriptions on one rclpy node, spun in a background thread."""

    name = "rclpy"

    def __init__(self, domain_id: int = 0, node_name: str | None = None, scope: Any = None):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from robo_rl.hardware.ros2.discovery import DESCRIPTION, rcl_environment

        self.domain_id = int(domain_id)
        self.scope = scope
        if scope is not None and scope.source == DESCRIPTION:
            # rcl reads the discovery variables at init: the description's scope goes in through them
            for name, value in rcl_environment(scope, os.environ.get("ROS_DISTRO")).items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        self._context = rclpy.Context()
        rclpy.init(context=self._context, domain_id=self.domain_id)
        # a name of its own: other_writers() tells this node's publishers from everyone else's by
        # it, and a second robo_rl (a forgotten teleop) must count as someone else
        self.node = rclpy.create_node(node_name or f"robo_rl_{os.getpid()}_{next(_NODES)}", context=self._context)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, name="rclpy", daemon=True)
        self._thread.start()

    @staticmethod
    def _qos(qos: str) -> Any:
        from rclpy.qos import qos_profile_sensor_data, qos_profile_system_default

        profiles = {"default": qos_profile_system_default, "sensor": qos_profile_sensor_data}
        if qos not in profiles:
            raise ConfigError(f"QoS profile {qos!r} unknown; choose one of {sorted(profiles)}")
        return profiles[qos]

    def publisher(self, topic: str, msg_type: type, qos: str = "default") -> Callable[[Any], None]:
        pub = self.node.create_publisher(ros_class(msg_type), topic, self._qos(qos))
        return lambda msg: pub.publish(to_ros(msg))

    def subscribe(self, topic: str, msg_type: type, callback: Callable[[Any], None], qos: str = "default") -> None:
        self.node.create_subscription(ros_class(msg_type), topic, lambda rmsg: callback(from_ros(rmsg, msg_type)),
                                      self._qos(qos))

    def other_writers(self, topic: str) -> int:
        """Publishers on `topic` of every node but this one (ROS 2's graph, as discovered so far)."""
        me = (self.node.get_name(), self.node.get_namespace())
        return sum(1 for info in self.node.get_publishers_info_by_topic(topic)
                   if (info.node_name, info.node_namespace) != me)

    def close(self) -> None:
        self._executor.shutdown()
        self.node.destroy_node()
        self._context.try_shutdown()


def make_transport(domain_id: int | None = None, prefer: str = "auto", scope: Any = None) -> Any:
    """rclpy when it is importable (prefer=auto or rclpy), else CycloneDDS (prefer=auto or dds), on
    `scope` (a DiscoveryScope; default: ROS 2's environment, on `domain_id` if given)."""
    from robo_rl.hardware.ros2.discovery import scope_from_env

    if prefer not in ("auto", "rclpy", "dds"):
        raise ConfigError(f"transport={prefer!r}; choose auto, rclpy or dds")
    if scope is None:
        scope = scope_from_env(domain_id=domain_id)
    elif domain_id is not None and int(domain_id) != scope.domain_id:
        scope = dataclasses.replace(scope, domain_id=int(domain_id))
    if prefer == "rclpy" or (prefer == "auto" and rclpy_available()):
        if not rclpy_available():
            raise ConfigError("transport=rclpy, but rclpy is not importable: source your ROS 2 setup.bash first")
        return RclpyTransport(scope.domain_id, scope=scope)
    from robo_rl.hardware.ros2.dds import DdsTransport

    return DdsTransport(scope=scope)
