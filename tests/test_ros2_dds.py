"""The DDS transport between real processes: ROS 2 message types and topic names on the wire."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from inbox import Inbox

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Bool, Float64MultiArray, JointState, Time, ros_topic, ros_type

PUBLISHER = """
import sys, time
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Header, JointState, Time
t = DdsTransport(int(sys.argv[1]))
publish = t.publisher("/follower/joint_states", JointState, qos="sensor")
print("ready", flush=True)
i = 0
while True:
    publish(JointState(Header(Time.from_seconds(1000.0 + i * 0.01), "base"), ["waist", "shoulder"],
                       [0.001 * i, -0.5], [0.1, 0.0], []))
    i += 1
    time.sleep(0.01)
"""


def domain() -> int:
    """A DDS domain of this test's own, so parallel runs and other tests never cross."""
    return 100 + os.getpid() % 100


def test_ros2_names_follow_the_wire_conventions():
    assert ros_topic("/follower/joint_states") == "rt/follower/joint_states"
    assert ros_type("sensor_msgs", "JointState") == "sensor_msgs::msg::dds_::JointState_"
    assert JointState.__idl_typename__ == "sensor_msgs::msg::dds_::JointState_"
    assert Float64MultiArray.__idl_typename__ == "std_msgs::msg::dds_::Float64MultiArray_"
    t = Time.from_seconds(12.75)
    assert (t.sec, t.nanosec) == (12, 750_000_000) and t.seconds() == 12.75


def test_joint_states_cross_processes_and_stop_when_the_publisher_is_killed():
    transport = DdsTransport(domain())
    got = Inbox()
    transport.subscribe("/follower/joint_states", JointState, got, qos="sensor")
    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(domain())], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        msgs = got.wait_for(20, timeout_s=20)
        assert len(msgs) >= 20, f"only {len(msgs)} joint states arrived"
        m = msgs[-1]
        assert list(m.name) == ["waist", "shoulder"] and m.position[1] == -0.5 and m.header.frame_id == "base"
        # values and stamps arrive in order, exactly as sent
        stamps = [x.header.stamp.seconds() for x in msgs]
        assert stamps == sorted(stamps)
        assert all(abs(x.position[0] - (x.header.stamp.seconds() - 1000.0) / 10) < 1e-9 for x in msgs)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert got.stays_quiet(0.3, 0.5), "messages kept arriving after the publisher was killed"
    transport.close()


def test_a_topic_keeps_one_type_and_qos_names_are_checked():
    transport = DdsTransport(domain())
    transport.publisher("/estop", Bool)
    with pytest.raises(ConfigError, match="already used with type Bool"):
        transport.publisher("/estop", JointState)
    with pytest.raises(ConfigError, match="QoS profile 'fast' unknown"):
        transport.publisher("/other", Bool, qos="fast")
    transport.close()
