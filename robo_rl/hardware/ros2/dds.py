"""The DDS transport: ROS 2 topics over CycloneDDS (PyPI `cyclonedds`), no ROS install needed.

ROS 2's wire conventions, which is what makes a ROS 2 node and this transport see each other:
topic `/x/y` is DDS topic `rt/x/y`; message `pkg/msg/T` is DDS type `pkg::msg::dds_::T_` (see
messages.py); QoS profiles as rclpy's defaults: "default" is reliable, volatile, keep last 10;
"sensor" (rclpy's qos_profile_sensor_data) is best effort, volatile, keep last 5. A reliable
writer reaches a best-effort reader, not the other way round, as in ROS 2.

Callbacks run on CycloneDDS's listener thread: keep them short (store the newest message).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from cyclonedds.core import Listener
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.messages import ros_topic

QOS = {
    "default": Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.Durability.Volatile,
                   Policy.History.KeepLast(10)),
    "sensor": Qos(Policy.Reliability.BestEffort, Policy.Durability.Volatile, Policy.History.KeepLast(5)),
}


class DdsTransport:
    """Publishers and subscriptions on one DDS domain (ROS_DOMAIN_ID)."""

    name = "dds"

    def __init__(self, domain_id: int = 0):
        self.domain_id = int(domain_id)
        self.participant = DomainParticipant(self.domain_id)
        self._topics: dict[str, Topic] = {}
        self._readers: list[DataReader] = []
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def _topic(self, topic: str, msg_type: type) -> Topic:
        name = ros_topic(topic)
        with self._lock:
            existing = self._topics.get(name)
            if existing is None:
                existing = self._topics[name] = Topic(self.participant, name, msg_type)
            elif existing.data_type is not msg_type:
                raise ConfigError(f"topic {topic} is already used with type {existing.data_type.__name__}, "
                                  f"not {msg_type.__name__}")
        return existing

    @staticmethod
    def _qos(qos: str) -> Qos:
        if qos not in QOS:
            raise ConfigError(f"QoS profile {qos!r} unknown; choose one of {sorted(QOS)}")
        return QOS[qos]

    def publisher(self, topic: str, msg_type: type, qos: str = "default") -> Callable[[Any], None]:
        """A function that publishes one message on `topic`."""
        writer = DataWriter(self.participant, self._topic(topic, msg_type), qos=self._qos(qos))
        return writer.write

    def subscribe(self, topic: str, msg_type: type, callback: Callable[[Any], None], qos: str = "default") -> None:
        """Call `callback(msg)` for every message on `topic`, on the DDS listener thread."""

        def on_data_available(reader: DataReader | None) -> None:
            if reader is None:  # data that arrived as close() deleted the reader
                return
            for sample in reader.take(N=64):
                if isinstance(sample, msg_type):  # skip the "writer left" notifications
                    callback(sample)

        listener = Listener(on_data_available=on_data_available)
        reader = DataReader(self.participant, self._topic(topic, msg_type), qos=self._qos(qos), listener=listener)
        self._readers.append(reader)  # a reader lives as long as a reference to it does
        self._listeners.append(listener)

    def close(self) -> None:
        # Detach the listeners first: that waits for a callback in progress, and none starts after.
        # Otherwise the callback could drop a reader's last reference and delete the reader from
        # inside its own listener, which blocks forever (seen with camera streams).
        for reader in self._readers:
            reader.set_listener(None)
        self._readers.clear()
        self._listeners.clear()
        self._topics.clear()
