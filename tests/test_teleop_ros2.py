"""Teleop and replay over ROS 2 (DDS) against `robo-rl sim-bridge` in another process: leader
arms published by this process drive the twin through `robo-rl teleop`, and `robo-rl replay
robot=aloha` plays a recorded episode on it. Three real processes, real DDS."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from inbox import Inbox
from sim_bridge_proc import start_bridge, stop_bridge

from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.hardware.robot import RobotSpec
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Header, JointState, Time

JOINTS = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
ENV = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}


def domain() -> int:
    return 140 + os.getpid() % 40


@pytest.fixture
def bridge():
    proc = start_bridge(domain())
    yield proc
    stop_bridge(proc)


def robo_rl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout, stdin=subprocess.DEVNULL)


def newest_positions(inbox: Inbox) -> np.ndarray:
    return np.array(inbox.items()[-1].position)


def test_leader_arms_drive_the_twin_through_teleop(bridge):
    spec = RobotSpec.from_yaml("aloha")
    transport = DdsTransport(domain())
    follower = Inbox()
    transport.subscribe("/left/joint_states", JointState, follower, qos="sensor")
    publish = {arm: transport.publisher(f"/leader_{arm}/joint_states", JointState, qos="sensor") for arm in ("left", "right")}
    # the leader pose: home with the left waist turned and the left shoulder raised; the left
    # handle half squeezed (-0.185 is half way between closed -0.68 and open 0.31 in aloha.yaml)
    pose = {"left": spec.home[:7].astype(float).copy(), "right": spec.home[7:].astype(float).copy()}
    pose["left"][0], pose["left"][1], pose["left"][6] = 0.4, -0.7, -0.185
    pose["right"][6] = 0.31
    done = threading.Event()

    def leader() -> None:  # 100 Hz, as a leader arm's driver would publish
        while not done.wait(0.01):
            for arm in ("left", "right"):
                publish[arm](JointState(Header(Time.now()), JOINTS, list(pose[arm]), [0.0] * 7, []))

    threading.Thread(target=leader, daemon=True).start()
    try:
        run = robo_rl("teleop", "robot=aloha", "teleop=leader", f"domain_id={domain()}", "duration=4")
    finally:
        done.set()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "teleop leader on aloha" in run.stdout and "tick period p50" in run.stdout
    q = newest_positions(follower)
    assert abs(q[0] - 0.4) < 0.02 and abs(q[1] - -0.7) < 0.03, q  # the follower's left arm went where the leader is
    finger = spec.grippers[6]
    assert abs(q[6] - finger.to_wire(0.5)) < 0.004, q[6]  # half squeezed -> half open fingers (metres)
    # the move was rate limited by the safety filter (0.4 rad from home at <= 0.05 rad per tick)
    counts = re.search(r"step, velocity\s*│\s*(\d+), (\d+), (\d+), (\d+), (\d+)", run.stdout)
    assert counts and int(counts.group(4)) > 0, run.stdout
    transport.close()


def test_replay_plays_a_recorded_episode_on_the_robot(bridge, tmp_path):
    spec = RobotSpec.from_yaml("aloha")
    n = 100  # 2 s at 50 Hz: the left waist sweeps out and back
    sweep = 0.3 * np.sin(np.linspace(0, np.pi, n))
    actions = np.repeat(spec.home[None], n, 0).astype(np.float32)
    actions[:, 0] = sweep
    schema = Schema.build({"obs/qpos": ((14,), "float32"), "action": ((14,), "float32")}, fps=50, robot="aloha")
    with EpisodeStore.create(str(tmp_path / "ep"), schema) as store:
        w = store.begin_episode(EpisodeMeta(task="sweep"))
        for k in range(n):
            w.add({"obs/qpos": actions[max(k - 1, 0)], "action": actions[k]}, timestamp=k / 50)
        w.commit(success=True)
    transport = DdsTransport(domain())
    follower = Inbox()
    transport.subscribe("/left/joint_states", JointState, follower, qos="sensor")
    run = robo_rl("replay", str(tmp_path / "ep"), "episode=0", "robot=aloha", f"domain_id={domain()}", "approach_s=1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "played 100 steps" in run.stdout and "left_waist" in run.stdout
    waist = np.array([m.position[0] for m in follower.items()])
    assert waist.max() > 0.25, waist.max()  # the sweep happened on the robot
    assert abs(waist[-1]) < 0.05  # and came back
    transport.close()


def test_replay_on_a_robot_refuses_a_store_at_another_rate(tmp_path):
    schema = Schema.build({"obs/qpos": ((14,), "float32"), "action": ((14,), "float32")}, fps=30, robot="aloha")
    with EpisodeStore.create(str(tmp_path / "ep"), schema) as store:
        w = store.begin_episode(EpisodeMeta())
        w.add({"obs/qpos": np.zeros(14, np.float32), "action": np.zeros(14, np.float32)}, timestamp=0.0)
        w.commit()
    run = robo_rl("replay", str(tmp_path / "ep"), "robot=aloha", f"domain_id={domain()}")
    assert run.returncode == 2
    assert "recorded at 30 fps; aloha is commanded at 50 Hz" in run.stderr and "Traceback" not in run.stderr
