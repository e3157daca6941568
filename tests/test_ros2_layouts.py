"""Robots wired as ros2_control brings them up: one /joint_states with every joint, and one
command topic for all joints (a forward position controller taking 14 values in a declared order,
or one JointTrajectoryController naming all joints), with grippers in their own wire units.
`robo-rl sim-bridge robot=<description>` speaks each layout in another process; deploy, teleop
with leader arms and replay drive it over real DDS. (import-bag of the same layouts:
tests/test_rosbag.py; the per-arm layout: tests/test_teleop_ros2.py and tests/test_deploy.py.)

And a robot that does not follow: a bridge that ignores commands, and one whose controller
refuses messages of the wrong size, are caught by the Controller's tracking supervision."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from inbox import Inbox
from sim_bridge_proc import start_bridge, stop_bridge

from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.hardware.robot import HARDWARE_DIR, RobotSpec
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Header, JointState, Time
from robo_rl.hardware.ros2.robot import Ros2Config

LAYOUTS = ["aloha_shared_forward", "aloha_shared_trajectory"]
LEADER_JOINTS = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
ENV = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}


def robo_rl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout, stdin=subprocess.DEVNULL)


class Served:
    """A bridge speaking one description's layout, and a DDS reader of its joint states by name."""

    def __init__(self, robot: str, domain: int, *args: str):
        self.robot, self.domain = robot, domain
        self.spec = RobotSpec.from_yaml(robot)
        self.ros = Ros2Config.from_yaml(robot, self.spec)
        self.proc = start_bridge(domain, f"robot={robot}", *args)
        self.transport = DdsTransport(domain)
        self.states = Inbox()
        self.transport.subscribe(self.ros.states[0].topic, JointState, self.states, qos="sensor")

    def position(self, joint: str) -> np.ndarray:
        """Every position of action joint `joint` (our name) the robot published, in its wire unit."""
        topic = self.ros.states[0]
        name = topic.joints[topic.indices.index(self.spec.joint_names.index(joint))]
        return np.array([dict(zip(m.name, m.position))[name] for m in self.states.items()])

    def close(self) -> str:
        self.transport.close()
        return stop_bridge(self.proc)


@pytest.fixture(scope="module", params=LAYOUTS)
def served(request):
    s = Served(request.param, 180 + os.getpid() % 15 * 2 + LAYOUTS.index(request.param))  # DDS domains end at 232
    yield s
    s.close()


def publish_leaders(domain: int, pose: dict[str, np.ndarray]) -> threading.Event:
    """Leader arms at `pose` on their per-arm topics (the description's leader: section), 100 Hz."""
    transport = DdsTransport(domain)
    publish = {arm: transport.publisher(f"/leader_{arm}/joint_states", JointState, qos="sensor") for arm in pose}
    done = threading.Event()

    def leader() -> None:
        while not done.wait(0.01):
            for arm, q in pose.items():
                publish[arm](JointState(Header(Time.now()), LEADER_JOINTS, [float(v) for v in q], [0.0] * 7, []))
        transport.close()

    threading.Thread(target=leader, daemon=True).start()
    return done


def leader_pose(spec: RobotSpec, left_waist: float) -> dict[str, np.ndarray]:
    """Home, the left waist turned to `left_waist`, the left handle half squeezed (-0.185, half way
    between the leader: section's closed -0.68 and open 0.31)."""
    pose = {"left": spec.home[:7].astype(float).copy(), "right": spec.home[7:].astype(float).copy()}
    pose["left"][0], pose["left"][6], pose["right"][6] = left_waist, -0.185, 0.31
    return pose


def sweep_store(path, spec: RobotSpec, amplitude: float) -> None:
    n = 100  # 2 s at 50 Hz: the left waist out and back
    actions = np.repeat(spec.home[None], n, 0).astype(np.float32)
    actions[:, 0] = amplitude * np.sin(np.linspace(0, np.pi, n))
    schema = Schema.build({"obs/qpos": ((14,), "float32"), "action": ((14,), "float32")}, fps=50, robot="aloha")
    with EpisodeStore.create(str(path), schema) as store:
        w = store.begin_episode(EpisodeMeta(task="sweep"))
        for k in range(n):
            w.add({"obs/qpos": actions[max(k - 1, 0)], "action": actions[k]}, timestamp=k / 50)
        w.commit(success=True)


def test_deploy_drives_the_layout(served, checkpoints):
    r = robo_rl("deploy", f"checkpoint={checkpoints['qpos']}", f"robot={served.robot}", f"domain_id={served.domain}",
                "duration=1.5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"deploy flow on {served.robot} at 50 Hz" in r.stdout and "watchdog holds / stops" in r.stdout


def test_leader_arms_drive_the_layout(served):
    done = publish_leaders(served.domain, leader_pose(served.spec, 0.4))
    try:
        run = robo_rl("teleop", f"robot={served.robot}", "teleop=leader", f"domain_id={served.domain}", "duration=4")
    finally:
        done.set()
    assert run.returncode == 0, run.stdout + run.stderr
    assert abs(served.position("left_waist")[-1] - 0.4) < 0.02
    gripper = served.spec.grippers[6]  # half squeezed -> half open, in this description's wire unit
    assert abs(served.position("left_gripper")[-1] - gripper.to_wire(0.5)) < 0.03 * abs(gripper.open - gripper.closed)


def test_replay_plays_on_the_layout(served, tmp_path):
    sweep_store(tmp_path / "ep", served.spec, 0.3)
    served.states.clear()
    run = robo_rl("replay", str(tmp_path / "ep"), "episode=0", f"robot={served.robot}", f"domain_id={served.domain}",
                  "approach_s=1")
    assert run.returncode == 0, run.stdout + run.stderr
    waist = served.position("left_waist")
    assert waist.max() > 0.25 and abs(waist[-1]) < 0.05, (waist.max(), waist[-1])


def test_the_layouts_bridge_took_every_command(served):
    out = served.close()
    received, refused = re.search(r"sim-bridge: (\d+) commands received, (\d+) refused", out).groups()
    assert int(received) > 300 and int(refused) == 0, out  # one message per tick for all 14 joints


def test_a_robot_that_ignores_its_commands_is_caught(tmp_path):
    """Its joint states keep coming (the watchdog is content), but the arms never move."""
    served = Served("aloha", 211 + os.getpid() % 10, "follow=false")
    try:
        sweep_store(tmp_path / "ep", served.spec, 0.8)
        t = time.monotonic()
        run = robo_rl("replay", str(tmp_path / "ep"), "episode=0", "robot=aloha", f"domain_id={served.domain}",
                      "approach_s=0.2")
        took = time.monotonic() - t
    finally:
        out = served.close()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the robot does not follow its commands: left_waist" in run.stdout, run.stdout
    assert "list_controllers" in run.stdout and "/left/arm_controller/joint_trajectory (trajectory, 7 named joints)" in run.stdout
    assert took < 30, took
    assert "commands received, 0 refused" in out


def test_a_controller_that_refuses_the_wrong_size_is_caught(tmp_path):
    """The robot takes 14 values on one forward topic; a description that sends each arm's 7 there
    (and the right arm's to a topic nobody reads) gets every message refused."""
    wrong = tmp_path / "wrong.yaml"
    text = (HARDWARE_DIR / "aloha_shared_forward.yaml").read_text()
    ros2 = text[text.index("\nros2:") + 1:text.index("  # One entry per camera")]
    wrong.write_text(text.replace(ros2, "ros2:\n  joint_states: /joint_states\n  arms:\n"
                                        "    left: {command: /forward_position_controller/commands, command_type: forward,\n"
                                        "           joints: [left_waist, left_shoulder, left_elbow, left_forearm_roll,\n"
                                        "                    left_wrist_angle, left_wrist_rotate, left_gripper]}\n"
                                        "    right: {command: /right_controller/commands, command_type: forward,\n"
                                        "            joints: [right_waist, right_shoulder, right_elbow, right_forearm_roll,\n"
                                        "                     right_wrist_angle, right_wrist_rotate, right_gripper]}\n"))
    served = Served("aloha_shared_forward", 222 + os.getpid() % 10)
    done = publish_leaders(served.domain, leader_pose(served.spec, 0.9))
    try:
        run = robo_rl("teleop", f"robot={wrong}", "teleop=leader", f"domain_id={served.domain}", "duration=20")
    finally:
        done.set()
        out = served.close()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the robot does not follow its commands: left_waist" in run.stdout, run.stdout
    assert "/forward_position_controller/commands (forward, 7 values)" in run.stdout, run.stdout
    received, refused = re.search(r"sim-bridge: (\d+) commands received, (\d+) refused", out).groups()
    assert int(received) == int(refused) > 0, out
