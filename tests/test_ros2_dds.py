"""The DDS transport between real processes: ROS 2 message types and topic names on the wire."""

from __future__ import annotations

import os
import re
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


def test_the_ros2_layouts_of_a_description_and_their_mistakes(tmp_path):
    """Per-arm topics, one topic for all joints, or a mix; each joint's states and commands come
    from exactly one topic, and every mistake is one line naming the file and the key."""
    from robo_rl.hardware.robot import HARDWARE_DIR, RobotSpec
    from robo_rl.hardware.ros2.robot import Ros2Config

    spec = RobotSpec.from_yaml("aloha")
    per_arm = Ros2Config.from_yaml("aloha", spec)
    assert [t.indices for t in per_arm.states] == [tuple(range(7)), tuple(range(7, 14))]
    shared = Ros2Config.from_yaml("aloha_shared_forward", RobotSpec.from_yaml("aloha_shared_forward"))
    assert [(t.topic, t.indices) for t in shared.states] == [("/joint_states", tuple(range(14)))]
    assert [(c.type, len(c.joints)) for c in shared.commands] == [("forward", 14)]
    text = (HARDWARE_DIR / "aloha.yaml").read_text()
    ros2 = text[text.index("\nros2:") + 1:text.index("  # One entry per camera")]

    def config(section: str) -> Ros2Config:
        path = tmp_path / "arm.yaml"
        path.write_text(text.replace(ros2, section))
        return Ros2Config.from_yaml(path, spec)

    mixed = config("ros2:\n  joint_states: /joint_states\n  arms:\n    left: {command: /l}\n    right: {command: /r}\n")
    assert [t.topic for t in mixed.states] == ["/joint_states"] and [c.topic for c in mixed.commands] == ["/l", "/r"]
    assert mixed.states[0].joints == spec.joint_names  # a shared topic names joints as the description does
    mistakes = {
        "ros2:\n  joint_states: /joint_states\n  command: /c\n  arms:\n    left: {command: /l}\n":
            "arms.left.command and ros2.command both given",
        "ros2:\n  joint_states: /joint_states\n  arms:\n    left: {command: /l}\n": "the command topics cover action indices [0, 1",
        "ros2:\n  joint_states: /js\n  command: /c\n  command_type: velocity\n": "command_type='velocity'",
        "ros2:\n  joint_states: /js\n  command: /c\n  joints: [a, b]\n": "give 14 joint names",
        "ros2:\n  joint_states: /js\n  command: /c\n  joint_state: /x\n": "unknown key(s) ['joint_state']",
        "ros2:\n  arms:\n    left: {joint_states: /s, command: /c}\n    right: {joint_states: /s, command: /d}\n":
            "joint_states topic ['/s', '/s'] repeats",
        "ros2:\n  joint_states: /js\n  arms:\n    middle: {command: /c}\n": "has no joints named middle_*",
    }
    for section, message in mistakes.items():
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            config(section)
        assert "arm.yaml: ros2" in str(e.value) and "\n" not in str(e.value)


def test_a_gripper_names_its_wire_unit(tmp_path):
    from robo_rl.hardware.robot import HARDWARE_DIR, RobotSpec

    text = (HARDWARE_DIR / "aloha.yaml").read_text()
    entry = "gripper: {unit: finger_m, closed: 0.021, open: 0.057}"
    path = tmp_path / "arm.yaml"
    for gripper, message in (("{unit: inches, closed: 0, open: 1}", "unit='inches'"),
                             ("{unit: joint_rad, closed: 0.5}", "needs closed and open"),
                             ("{joint: left_finger, closed: 0.021, open: 0.057}", "unknown key(s) ['joint']"),
                             ("{unit: finger_m, closed: 0.02, open: 0.02}", "must differ")):
        path.write_text(text.replace(entry, f"gripper: {gripper}", 1))
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            RobotSpec.from_yaml(path)
        assert "joints[6] (left_gripper).gripper" in str(e.value)
    path.write_text(text.replace(entry, "gripper: {unit: normalized}"))
    g = RobotSpec.from_yaml(path).grippers[13]
    assert (g.unit, g.to_wire(0.25), g.from_wire(0.75)) == ("normalized", 0.25, 0.75)
