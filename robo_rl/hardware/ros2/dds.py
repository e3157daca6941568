"""The DDS transport: ROS 2 topics over CycloneDDS (PyPI `cyclonedds`), no ROS install needed.

ROS 2's wire conventions, which is what makes a ROS 2 node and this transport see each other:
topic `/x/y` is DDS topic `rt/x/y`; message `pkg/msg/T` is DDS type `pkg::msg::dds_::T_` (see
messages.py); QoS profiles as rclpy's defaults: "default" is reliable, volatile, keep last 10;
"sensor" (rclpy's qos_profile_sensor_data) is best effort, volatile, keep last 5. A reliable
writer reaches a best-effort reader, not the other way round, as in ROS 2.

Callbacks run on CycloneDDS's listener thread: keep them short (store the newest message).

Discovery reaches as far as ROS 2's settings allow (discovery.py: ROS_DOMAIN_ID,
ROS_LOCALHOST_ONLY, ROS_AUTOMATIC_DISCOVERY_RANGE, ROS_STATIC_PEERS). `other_writers(topic)`
counts the writers other participants have on a topic (discovered ones: anywhere in reach).
DDS Security (SROS2) needs a CycloneDDS built with it, which the PyPI wheel is not: with
ROS_SECURITY_ENABLE=true and ROS_SECURITY_STRATEGY=Enforce this transport refuses to start, and
otherwise it warns and goes on unsecured, as ROS 2 does when it cannot secure a participant.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any, Callable

from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsPublication
from cyclonedds.core import InstanceState, Listener, ReadCondition, SampleState, ViewState
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.discovery import DiscoveryScope, scope_from_env
from robo_rl.hardware.ros2.messages import ros_topic

QOS = {
    "default": Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.Durability.Volatile,
                   Policy.History.KeepLast(10)),
    "sensor": Qos(Policy.Reliability.BestEffort, Policy.Durability.Volatile, Policy.History.KeepLast(5)),
}


# A process's CycloneDDS domains: the first participant on a domain id fixes its configuration,
# and the Domain object must outlive every participant on it (deleting it deletes them).
_DOMAINS: dict[int, tuple[str, Any]] = {}
_DOMAINS_LOCK = threading.Lock()


def _join_domain(scope: DiscoveryScope) -> None:
    config = ",".join(c for c in (scope.cyclone_config(), os.environ.get("CYCLONEDDS_URI", "")) if c)
    with _DOMAINS_LOCK:
        if scope.domain_id in _DOMAINS:
            if _DOMAINS[scope.domain_id][0] != config:
                raise ConfigError(f"ROS domain {scope.domain_id} is already open in this process with another "
                                  f"discovery scope; one process keeps one scope per domain ({scope.describe()})")
            return
        # '' (CycloneDDS's defaults): the participant makes the domain itself, reading CYCLONEDDS_URI as always
        _DOMAINS[scope.domain_id] = (config, Domain(scope.domain_id, config) if scope.cyclone_config() else None)


# Every transport's listeners are detached at exit, before the interpreter winds down: a message
# (or a remote writer leaving) during that would call into Python from DDS's thread, which then
# waits for the GIL forever and the process never exits (seen with a peer across a veth pair).
_OPEN: "weakref.WeakSet[DdsTransport]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for transport in list(_OPEN):
        transport.close()


def check_security(env: Any = None) -> None:
    """SROS2's variables on a transport without DDS Security: refuse under Enforce, else warn."""
    env = os.environ if env is None else env
    if env.get("ROS_SECURITY_ENABLE") != "true":
        return
    if env.get("ROS_SECURITY_STRATEGY") == "Enforce":
        raise ConfigError("ROS_SECURITY_ENABLE=true with ROS_SECURITY_STRATEGY=Enforce, but the CycloneDDS "
                          "wheel from PyPI has no DDS Security: source a ROS 2 install (transport=rclpy; "
                          "docs/ros2.md, shared lab) or unset ROS_SECURITY_ENABLE")
    print("warning: ROS_SECURITY_ENABLE=true, but the CycloneDDS wheel from PyPI has no DDS Security: "
          "going on unsecured, as ROS 2 does without ROS_SECURITY_STRATEGY=Enforce", file=sys.stderr)


class WriterView:
    """The writers DDS has discovered, from DDS's built-in publication topic: each one that appears
    or goes is a sample here. Polled, not with a listener: a listener's callback needs the GIL,
    which a process exiting while DDS deletes its participant holds (the two then wait on each
    other forever)."""

    def __init__(self, participant: DomainParticipant):
        self.me = participant.guid
        self.reader = BuiltinDataReader(participant, BuiltinTopicDcpsPublication)
        self.alive = ReadCondition(self.reader, SampleState.Any | ViewState.Any | InstanceState.Alive)
        self.unseen = ReadCondition(self.reader, SampleState.NotRead | ViewState.Any | InstanceState.Any)

    def changed(self) -> bool:
        """Whether a writer appeared or went since the last call (one call into DDS when not)."""
        if not self.unseen.triggered:
            return False
        self.reader.read(N=4096, condition=self.unseen)  # marks them seen
        return True

    def others(self, topic: str) -> int:
        """Live writers on ROS topic `topic` of every participant but this one."""
        name = ros_topic(topic)
        return sum(1 for w in self.reader.read(N=4096, condition=self.alive)
                   if w.topic_name == name and w.participant_key != self.me)


class DdsTransport:
    """Publishers and subscriptions on one DDS domain, within the discovery scope ROS 2's
    settings give (the environment's, or `scope`)."""

    name = "dds"

    def __init__(self, domain_id: int | None = None, scope: DiscoveryScope | None = None):
        check_security()
        self.scope = scope if scope is not None else scope_from_env(domain_id=domain_id)
        self.domain_id = self.scope.domain_id
        _join_domain(self.scope)
        self.participant = DomainParticipant(self.domain_id)
        self._writers = WriterView(self.participant)  # other_writers() and publications_changed()
        self._topics: dict[str, Topic] = {}
        self._readers: list[DataReader] = []
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        _OPEN.add(self)

    def publications_changed(self) -> bool:
        """Whether DDS discovered a writer appear or go since the last call."""
        return self._writers.changed()

    def other_writers(self, topic: str) -> int:
        """Writers on `topic` of every participant but this one, as discovered so far."""
        return self._writers.others(topic)

    def writer_view(self) -> "WriterView":
        """A view of the discovered writers with its own marks of what was seen (one per watcher)."""
        return WriterView(self.participant)

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
        # Then delete the participant with its readers and writers: the others learn at once that
        # its writers are gone, rather than after DDS's 10 s lease (what a killed process leaves)
        participant, self.participant = self.participant, None
        if participant is not None:
            participant.__del__()  # cyclonedds deletes an entity in __del__; a second call does nothing
