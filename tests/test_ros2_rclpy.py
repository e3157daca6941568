"""The rclpy transport. rclpy comes only with a ROS 2 install (not on PyPI), so on machines
without one these tests skip, and the choice of transport falls back to CycloneDDS."""

from __future__ import annotations

import pytest

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.messages import JointState, JointTrajectory, JointTrajectoryPoint
from robo_rl.hardware.ros2.rclpy_transport import make_transport, rclpy_available

needs_rclpy = pytest.mark.skipif(not rclpy_available(), reason="rclpy is not importable: no ROS 2 install here "
                                                               "(source /opt/ros/<distro>/setup.bash to run these)")


def test_without_rclpy_auto_is_dds_and_asking_for_rclpy_is_a_clear_error():
    if rclpy_available():
        pytest.skip("rclpy is installed here")
    t = make_transport(190, "auto")
    assert t.name == "dds"
    t.close()
    with pytest.raises(ConfigError, match="rclpy is not importable: source your ROS 2 setup.bash"):
        make_transport(190, "rclpy")
    with pytest.raises(ConfigError, match="transport='zmq'"):
        make_transport(190, "zmq")


@needs_rclpy
def test_messages_round_trip_through_rclpy_classes():
    from robo_rl.hardware.ros2.rclpy_transport import from_ros, ros_class, to_ros

    assert ros_class(JointState).__name__ == "JointState"
    traj = JointTrajectory(joint_names=["a", "b"], points=[JointTrajectoryPoint(positions=[0.5, -1.0])])
    back = from_ros(to_ros(traj), JointTrajectory)
    assert back.joint_names == ["a", "b"] and back.points[0].positions == [0.5, -1.0]


@needs_rclpy
def test_rclpy_and_dds_transports_see_each_other():
    import threading
    import time

    from robo_rl.hardware.ros2.dds import DdsTransport
    from robo_rl.hardware.ros2.rclpy_transport import RclpyTransport

    got, done = [], threading.Event()
    ros = RclpyTransport(191)
    ros.subscribe("/check", JointState, lambda m: (got.append(m), done.set()))
    dds = DdsTransport(191)
    publish = dds.publisher("/check", JointState)
    deadline = time.monotonic() + 10
    while not done.is_set() and time.monotonic() < deadline:
        publish(JointState(name=["x"], position=[1.5]))
        time.sleep(0.1)
    assert got and got[0].position == [1.5]
    ros.close()
    dds.close()


@needs_rclpy
def test_rclpy_counts_another_robo_rl_node_as_another_writer():
    """One driver per arm on the rclpy path: a second robo_rl (its own node) publishing on a
    command topic is another writer; this node's own publisher is not."""
    import time

    from robo_rl.hardware.ros2.messages import Float64MultiArray
    from robo_rl.hardware.ros2.rclpy_transport import RclpyTransport

    mine, theirs = RclpyTransport(192), RclpyTransport(192)
    try:
        mine.publisher("/left/cmd", Float64MultiArray)
        assert mine.other_writers("/left/cmd") == 0
        theirs.publisher("/left/cmd", Float64MultiArray)
        deadline = time.monotonic() + 5
        while mine.other_writers("/left/cmd") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mine.other_writers("/left/cmd") == 1
    finally:
        mine.close()
        theirs.close()
