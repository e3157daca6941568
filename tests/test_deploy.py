"""`robo-rl deploy`: a trained policy through the Controller on the twin, and over ROS 2 against
`robo-rl sim-bridge` in another process."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import robo_rl_cli as _cli
from sim_bridge_proc import start_bridge, stop_bridge


def test_deploy_on_the_twin_prints_the_timing_table(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=sim", "duration=1.5")
    assert r.returncode == 0, r.stdout + r.stderr
    for row in ("tick period p50 / p99 / max", "inference p50 / p99", "actions dropped late", "task stage reached"):
        assert row in r.stdout


def test_a_twin_only_observation_cannot_go_to_real_arms(checkpoints):
    r = _cli("deploy", f"checkpoint={checkpoints['state']}", "robot=aloha")
    assert r.returncode == 2 and "obs/env_state" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


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
        press = ("import sys, time\nfrom robo_rl.hardware.ros2.dds import DdsTransport\n"
                 "from robo_rl.hardware.ros2.messages import Bool\n"
                 "pub = DdsTransport(int(sys.argv[1])).publisher('/robo_rl/estop', Bool)\n"
                 "for _ in range(20):\n    pub(Bool(True)); time.sleep(0.1)\n")
        subprocess.run([sys.executable, "-c", press, dom], check=True, timeout=60)
        out, err = deploy.communicate(timeout=30)
        assert deploy.returncode == 1 and "stopped: e-stop: /robo_rl/estop (ROS 2)" in out, out + err
    finally:
        out = stop_bridge(bridge)
    received = int(out.split("sim-bridge: ")[-1].split(" commands received")[0])
    assert received >= 60  # both arms' commands, 1.5 s at 50 Hz, reached the bridge
