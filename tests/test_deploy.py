"""`robo-rl deploy`: a trained policy through the Controller on the twin, and over ROS 2 against
`robo-rl sim-bridge` in another process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import robo_rl_cli as _cli
from sim_bridge_proc import start_bridge, stop_bridge

from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Bool


def test_deploy_on_the_twin_prints_the_timing_table(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "duration=1.5")
    assert r.returncode == 0, r.stdout + r.stderr
    for row in ("tick period p50 / p99 / max", "inference p50 / p99", "actions dropped late", "task stage reached"):
        assert row in r.stdout


def test_a_twin_only_observation_cannot_go_to_real_arms(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=aloha")
    assert r.returncode == 2 and "obs/env_state" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # 21 s (AMD EPYC, AVX2 only); deploy over ROS 2 stays in the default run through test_ros2_layouts and the camera policy over DDS
def test_deploy_over_ros2_against_the_sim_bridge(checkpoints):
    dom = str(30 + os.getpid() % 70)
    env = {**os.environ, "MUJOCO_GL": "egl"}
    bridge = start_bridge(int(dom))
    try:
        r = _cli("deploy", f"checkpoint={checkpoints['qpos']}", "robot=aloha", f"domain_id={dom}", "duration=1.5")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "deploy flow on aloha at 50 Hz" in r.stdout and "watchdog holds / stops" in r.stdout
        # the e-stop topic: True on /robo_rl/estop ends a deploy at the next tick
        deploy = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", "deploy", f"checkpoint={checkpoints['qpos']}",
                                   "robot=aloha", f"domain_id={dom}", "duration=60"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        assert "deploy flow on aloha" in deploy.stdout.readline()
        # pressed from this process, until deploy ends (up to 20 s): a message sent before the
        # two processes have found each other is lost, and discovery can be slow on a loaded machine
        press = DdsTransport(int(dom)).publisher("/robo_rl/estop", Bool)
        deadline = time.monotonic() + 20
        while deploy.poll() is None and time.monotonic() < deadline:
            press(Bool(True))
            time.sleep(0.1)
        out, err = deploy.communicate(timeout=30)
        assert deploy.returncode == 1 and "stopped: e-stop: /robo_rl/estop (ROS 2)" in out, out + err
    finally:
        out = stop_bridge(bridge)
    received = int(out.split("sim-bridge: ")[-1].split(" commands received")[0])
    assert received >= 60  # both arms' commands, 1.5 s at 50 Hz, reached the bridge


def test_deploy_runs_episodes_in_a_row_on_the_twin(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "duration=0.4", "episodes=2", "seed=7")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 episode(s)" in r.stdout and "episodes succeeded" in r.stdout
    rows = [line.split("│")[1:3] for line in r.stdout.splitlines() if line.startswith(("│ 1 ", "│ 2 "))]
    assert [[c.strip() for c in row] for row in rows] == [["1", "7"], ["2", "8"]], r.stdout  # one row per seed
    bad = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "episodes=0")
    assert bad.returncode == 2 and "episodes=0" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_camera_policy_over_dds_runs_the_bridges_task_episodes(checkpoints):
    """The real-arm path in the twin: `sim-bridge task=...` renders the cameras and serves the task;
    `deploy robot=aloha episodes=2` runs a camera policy on the bridge's frames over DDS; the
    bridge resets the task per episode (the seeds eval uses), ends each at its time limit, and
    both sides report the same episodes. The bridge stops on its own after them."""
    dom = 100 + os.getpid() % 50
    bridge = start_bridge(dom, "task=transfer_cube", "episodes=2", "max_steps=40", "cameras=[top]", "image_size=[48,64]",
                          "camera_hz=50", "image_type=image")
    try:
        r = _cli("deploy", f"checkpoint={checkpoints['camera']}", "robot=aloha", f"domain_id={dom}", "episodes=2",
                 "duration=20")
        assert r.returncode == 0, r.stdout + r.stderr
        out, err = bridge.communicate(timeout=30)  # it ends by itself after its 2 episodes
        assert bridge.returncode == 0, out + err
    finally:
        stop_bridge(bridge)
    assert "episodes succeeded" in r.stdout
    served = [line for line in out.splitlines() if line.startswith("sim-bridge: episode ")]
    assert [line.split("(seed ")[1].split(")")[0] for line in served] == ["100000", "100001"], out
    assert all("40 ticks (time limit)" in line or "(success)" in line for line in served), out
    assert "episodes succeeded" in out and "furthest stage" in out
    for seed in ("100000", "100001"):  # deploy's table names the episodes the bridge served
        assert any(seed in line for line in r.stdout.splitlines() if "│" in line), r.stdout
    commands = re.search(r"sim-bridge: (\d+) commands received", out)
    assert commands and int(commands.group(1)) >= 60, out  # both arms, about 2 x 40 ticks of commands


def test_deploy_with_real_time_chunking(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "duration=1.5", "rtc=true", "n_action_steps=6")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"largest joint jump at a chunk hand-over\s*│\s*[\d.]+ rad \(rtc\)", r.stdout), r.stdout
    bad = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "n_action_steps=99")
    assert bad.returncode == 2 and "n_action_steps=99; give 1..16" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
