"""A robot in a shared lab: one driver per arm, and DDS discovery no wider than ROS 2's
settings allow. Real processes, real DDS; the network test builds its own namespace."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import robo_rl_in_process
from sim_bridge_proc import ROOT, start_bridge, stop_bridge

from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.discovery import DESCRIPTION, DiscoveryScope, rcl_environment, resolve_scope, scope_from_env

# a process that publishes on a topic until killed: "up" once its writer exists
WRITER = """
import sys, time
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Float64MultiArray
publish = DdsTransport(int(sys.argv[1])).publisher(sys.argv[2], Float64MultiArray)
print("up", flush=True)
while True:
    publish(Float64MultiArray(data=[float(v) for v in sys.argv[3:]]))
    time.sleep(0.1)
"""
LEFT = "/left/arm_controller/joint_trajectory"


def _writer(domain: int, topic: str, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(domain), topic, "0.0"], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_the_environment_sets_the_discovery_scope_as_ros_2_reads_it(capsys):
    assert scope_from_env({}) == DiscoveryScope("SUBNET", (), 0, "the ROS 2 default")
    assert scope_from_env({}).cyclone_config() == ""  # nothing set: CycloneDDS exactly as before
    s = scope_from_env({"ROS_LOCALHOST_ONLY": "1", "ROS_STATIC_PEERS": "10.0.0.5", "ROS_DOMAIN_ID": "7"})
    assert (s.range, s.static_peers, s.domain_id) == ("LOCALHOST", (), 7)  # localhost-only drops the peers, as rcl
    assert "127.0.0.1" in s.cyclone_config() and "<AllowMulticast>false" in s.cyclone_config()
    s = scope_from_env({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_STATIC_PEERS": "a;;10.0.0.5;"})
    assert s.static_peers == ("a", "10.0.0.5") and '<Peer address="10.0.0.5"/>' in s.cyclone_config()
    assert "127.0.0.1" not in s.cyclone_config()  # with peers, not bound to the loopback
    off = scope_from_env({"ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF", "ROS_STATIC_PEERS": "x"})
    assert off.static_peers == () and "ros_discovery_off_" in off.cyclone_config()
    assert "ignored with discovery OFF" in capsys.readouterr().err
    assert scope_from_env({"ROS_AUTOMATIC_DISCOVERY_RANGE": "lan"}).range == "LOCALHOST"  # rcl: unknown -> LOCALHOST
    assert "'lan'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="ROS_DOMAIN_ID='x'"):
        scope_from_env({"ROS_DOMAIN_ID": "x"})
    # a robot description's ros2.discovery overrides the environment; its mistakes are one line
    s = resolve_scope({"range": "off"}, "r.yaml: ros2", 3, {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"})
    assert (s.range, s.domain_id, s.source) == ("OFF", 3, "the robot description")
    for bad, says in (({"range": "WAN"}, "discovery.range='WAN'"), ({"peers": []}, "unknown key"),
                      ({"range": "OFF", "static_peers": ["h"]}, "mean nothing")):
        with pytest.raises(ConfigError, match=says):
            resolve_scope(bad, "r.yaml: ros2")


def test_a_descriptions_scope_reaches_rcl_through_the_variables_each_distro_reads():
    """The rclpy path: rcl reads ROS 2's variables at init, so a description's scope is handed on
    through them; a reach Humble cannot express is refused, never silently widened."""
    local = DiscoveryScope("LOCALHOST", (), 0, DESCRIPTION)
    assert rcl_environment(local, "humble") == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                                                "ROS_STATIC_PEERS": None, "ROS_LOCALHOST_ONLY": "1"}
    peers = DiscoveryScope("SUBNET", ("10.0.0.5", "arm-pc"), 0, DESCRIPTION)
    assert rcl_environment(peers, "jazzy") == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET",
                                               "ROS_STATIC_PEERS": "10.0.0.5;arm-pc", "ROS_LOCALHOST_ONLY": None}
    for scope in (peers, DiscoveryScope("OFF", (), 0, DESCRIPTION)):
        with pytest.raises(ConfigError, match="Humble's rcl knows only ROS_LOCALHOST_ONLY"):
            rcl_environment(scope, "humble")


def test_deploy_refuses_a_command_topic_another_process_writes_and_stops_when_one_appears(checkpoints, capsys):
    """One driver per arm: a second writer on a command topic makes deploy refuse to start (one
    line, the topic, the count); one that appears mid-run stops it; the bridge counts them."""
    dom = 30 + (os.getpid() + 11) % 70
    bridge = start_bridge(dom)
    rogue = None
    try:
        rogue = _writer(dom, LEFT)
        args = ("deploy", f"checkpoint={checkpoints['qpos']}", "robot=aloha", f"domain_id={dom}", "duration=30")
        code, err = robo_rl_in_process(capsys, *args)  # the refusal in this process: no second torch start-up
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"1 other writer on {LEFT}" in err and "allow_other_writers=true" in err
        rogue.send_signal(signal.SIGINT)  # it exits as a process does, its writer disposed (a SIGKILL's lingers 10 s)
        rogue.wait()
        # the writer is gone: deploy runs; a writer that appears mid-run stops it (maybe before its first tick)
        deploy = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "MUJOCO_GL": "egl"})
        lines = [""]
        while "deploy flow on aloha" not in lines[-1]:
            lines.append(deploy.stdout.readline())
            assert lines[-1] or deploy.poll() is None, deploy.stderr.read()
        assert any("discovery SUBNET (the ROS 2 default)" in line for line in lines), lines
        rogue = _writer(dom, LEFT)
        appeared = time.monotonic()
        out, err = deploy.communicate(timeout=30)
        stopped_after = time.monotonic() - appeared
        assert deploy.returncode == 1, out + err
        assert f"stopped: 1 other writer on {LEFT} appeared mid-run" in out, out + err
        assert stopped_after < 10  # discovery, the stop and the process's exit (the stop itself: bench/hardware.py)
    finally:
        if rogue is not None:
            rogue.kill()
            rogue.wait()
        out = stop_bridge(bridge)
    # deploy's writer and the other one, at once: until the refusal, and until the stop
    assert f"{LEFT}: 2 writers at most" in out and "/right/arm_controller/joint_trajectory: 1 writer at most" in out, out


def _netns_or_skip(n: int) -> list[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build network namespaces with a veth pair")
    names = [f"rr43{uuid.uuid4().hex[:6]}" for _ in range(n)]
    made = []
    for name in names:
        if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
            for m in made:
                subprocess.run(["ip", "netns", "del", m], capture_output=True)
            pytest.skip("cannot create a network namespace here (no CAP_SYS_ADMIN)")
        made.append(name)
    return names


# a participant that publishes on one topic and listens on another, and says whether it heard
PROBE = """
import sys, time
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import Float64MultiArray
got = []
t = DdsTransport(int(sys.argv[1]))
t.subscribe(sys.argv[2], Float64MultiArray, got.append)
publish = t.publisher(sys.argv[3], Float64MultiArray)
deadline = time.monotonic() + float(sys.argv[4])
while time.monotonic() < deadline:  # on to the end, so that the other side hears it too
    publish(Float64MultiArray(data=[1.0]))
    time.sleep(0.05)
print("heard" if got else "silent", flush=True)
"""


def test_localhost_only_and_discovery_off_do_not_reach_another_interface():
    """Two network namespaces joined by a veth pair, each with only its loopback and its end of
    the pair. The far participant names this one as its static peer. This one reaches it with
    ROS_STATIC_PEERS (the control: the veth carries DDS), and not with ROS_LOCALHOST_ONLY=1 (its
    peers then ignored, as in ROS 2), ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST or OFF."""
    near_ns, far_ns = _netns_or_skip(2)
    near, far = "10.243.0.1", "10.243.0.2"
    veth = f"v{near_ns[-6:]}"
    try:
        for cmd in (f"ip link add {veth}a netns {near_ns} type veth peer name {veth}b netns {far_ns}",
                    f"ip -n {near_ns} addr add {near}/24 dev {veth}a", f"ip -n {near_ns} link set {veth}a up",
                    f"ip -n {far_ns} addr add {far}/24 dev {veth}b", f"ip -n {far_ns} link set {veth}b up",
                    f"ip -n {near_ns} link set lo up", f"ip -n {far_ns} link set lo up"):
            subprocess.run(cmd.split(), check=True, capture_output=True)
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("ROS_", "CYCLONEDDS"))}

        def probe(ns: str, dom: int, env: dict, hear: str, say: str) -> subprocess.Popen:
            return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, str(dom), hear, say, "4"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                                    env={**clean, **env})  # (CycloneDDS logs every send the scope refuses)

        cases = {"static peer": {"ROS_STATIC_PEERS": far},
                 "ROS_LOCALHOST_ONLY=1": {"ROS_LOCALHOST_ONLY": "1", "ROS_STATIC_PEERS": far},
                 "LOCALHOST": {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"},
                 "OFF": {"ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF"}}
        running = {}
        for k, (name, near_env) in enumerate(cases.items()):  # at once, each pair on its own domain
            dom = 30 + (os.getpid() + 5 * k) % 70
            running[name] = (probe(near_ns, dom, near_env, "/lab/to_near", "/lab/to_far"),
                             probe(far_ns, dom, {"ROS_STATIC_PEERS": near}, "/lab/to_far", "/lab/to_near"))
        results = {}
        for name, procs in running.items():
            results[name] = tuple(p.communicate(timeout=60)[0].strip() for p in procs)
        assert results["static peer"] == ("heard", "heard"), results  # the control: the veth carries DDS
        for name in ("ROS_LOCALHOST_ONLY=1", "LOCALHOST", "OFF"):
            assert results[name] == ("silent", "silent"), results
    finally:
        subprocess.run(["ip", "-n", near_ns, "link", "del", f"{veth}a"], capture_output=True)
        for ns in (near_ns, far_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
