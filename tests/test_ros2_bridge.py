"""Deploying over ROS 2 (DDS) against `robo-rl sim-bridge` in another process: commands move the
twin, bad actions never reach the wire, and killing the bridge stops the commands in time."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from conftest import OnNthCommand
from inbox import Inbox
from sim_bridge_proc import start_bridge, stop_bridge

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import JointState, JointTrajectory
from robo_rl.hardware.ros2.robot import Ros2Robot
from robo_rl.hardware.safety import SafetyConfig, SafetyFilter, Watchdog
from robo_rl.runtime.controller import Controller
from robo_rl.runtime.episodes import ControllerConfig


def domain() -> int:
    return 20 + os.getpid() % 80


@pytest.fixture
def bridge():
    proc = start_bridge(domain())
    yield proc
    stop_bridge(proc)


def test_deploy_moves_the_twin_keeps_bad_actions_off_the_wire_and_stops_when_the_bridge_dies(bridge):
    transport = DdsTransport(domain())
    robot = Ros2Robot("aloha", transport)
    wire = Inbox()  # a spy on the wire: every command the bridge could receive
    transport.subscribe("/left/arm_controller/joint_trajectory", JointTrajectory, wire)
    robot.connect(timeout_s=20)
    home = robot.spec.home
    start = robot.observe().qpos
    assert np.abs(start - home).max() < 0.05  # the twin starts at home

    n = [0]

    def policy(window):  # sweeps the left waist, and now and then asks for NaN or far past a limit
        n[0] += 1
        chunk = np.repeat(home[None], 16, 0)
        chunk[:, 0] = 0.3
        if n[0] % 3 == 0:
            chunk[4, 1] = np.nan
        if n[0] % 4 == 0:
            chunk[:, 2] = 9.0
        return chunk

    cfg = SafetyConfig(observation_timeout_s=0.2)
    safety, dog = SafetyFilter(robot.spec, cfg), Watchdog(cfg)
    ctl = Controller(robot, policy, ControllerConfig(hz=50), safety=safety, watchdog=dog)
    rep = ctl.run(2.0)
    assert rep.stopped_reason == "" and rep.ticks == 100
    assert abs(robot.observe().qpos[0] - 0.3) < 0.05  # the twin's left waist followed the policy
    assert rep.safety["nonfinite"] > 0 and rep.safety["position_limit"] > 0
    time.sleep(0.2)
    sent = np.array([list(m.points[0].positions) for m in wire.items()])
    assert len(sent) >= 90 and np.isfinite(sent).all()
    lower, upper = robot.spec.lower[:6], robot.spec.upper[:6]
    assert (sent[:, :6] >= lower - 1e-6).all() and (sent[:, :6] <= upper + 1e-6).all()

    # kill the bridge mid-deploy, once the loop has sent 25 commands (not after a fixed delay: the
    # loop's start can take longer than that on a loaded machine): the loop stops commanding within
    # the watchdog time of the kill
    killed_at = []

    def kill():
        bridge.send_signal(signal.SIGKILL)
        killed_at.append(time.monotonic())

    rep = Controller(OnNthCommand(robot, 25, kill), policy, ControllerConfig(hz=50), safety=safety,
                     watchdog=Watchdog(cfg)).run(10.0)
    assert killed_at, f"the run stopped after {rep.ticks} ticks, before the kill: {rep.stopped_reason}"
    stopped_after = time.monotonic() - killed_at[0]
    assert "no joint state for" in rep.stopped_reason and "not commanding" in rep.stopped_reason, rep.stopped_reason
    assert stopped_after < 0.2 + 0.4, stopped_after  # the watchdog's timeout + scheduling slack
    assert wire.stays_quiet(0.0, 0.3), "commands were still published after the watchdog stop"
    robot.close()


def test_a_long_garbage_collection_before_the_first_tick_does_not_trip_the_watchdog(bridge):
    """The loop collects garbage before its first tick (so that no collection lands mid-run). That
    holds the GIL, so no joint state is handled meanwhile: with a big heap the newest one was older
    than the watchdog's limit at the first tick, and the run stopped before it commanded anything."""
    import gc

    robot = Ros2Robot("aloha", DdsTransport(domain()))
    robot.connect(timeout_s=20)
    home = robot.spec.home
    heap = [[] for _ in range(5_000_000)]  # objects the collector must walk, as a big application's
    t = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - t
    cfg = SafetyConfig(observation_timeout_s=0.1)  # the bridge publishes at 50 Hz
    assert collect_s > cfg.observation_timeout_s, f"the heap is too small to test this here: {collect_s:.3f} s"
    rep = Controller(robot, lambda window: np.repeat(home[None], 16, 0), ControllerConfig(hz=50),
                     safety=SafetyFilter(robot.spec, cfg), watchdog=Watchdog(cfg)).run(0.5)
    del heap
    robot.close()
    assert rep.stopped_reason == "" and rep.ticks == 25, (rep.stopped_reason, rep.ticks)


def test_no_robot_on_the_domain_is_a_one_line_error():
    robot = Ros2Robot("aloha", DdsTransport(domain() + 100))
    with pytest.raises(ConfigError, match="no joint states on /left/joint_states, /right/joint_states within 1 s"):
        robot.connect(timeout_s=1.0)


def test_the_bridge_refuses_nan_commands_itself(bridge):
    """A node that skips our safety filter still cannot put NaN into the twin."""
    from robo_rl.hardware.ros2.messages import JointTrajectoryPoint

    joints = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
    transport = DdsTransport(domain())
    publish = transport.publisher("/left/arm_controller/joint_trajectory", JointTrajectory)
    # wait until this participant and the bridge have found each other (its joint states arrive):
    # commands sent before that are lost, and discovery can take a while on a loaded machine
    states = Inbox()
    transport.subscribe("/left/joint_states", JointState, states, qos="sensor")
    assert states.wait_for(1, timeout_s=20), "the bridge's joint states never arrived"
    for _ in range(20):
        publish(JointTrajectory(joint_names=joints, points=[JointTrajectoryPoint(positions=[float("nan")] * 7)]))
        time.sleep(0.05)
    bridge.send_signal(signal.SIGINT)
    out, err = bridge.communicate(timeout=20)
    received, refused = (int(x) for x in out.split("sim-bridge: ")[-1].replace(" commands received,", "").split()[:2])
    assert received >= 10 and refused == received, out + err
