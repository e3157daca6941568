"""SafetyFilter, Watchdog and EStop (robo_rl/hardware/safety.py) against the ALOHA description."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import RobotSpec
from robo_rl.hardware.safety import EStop, SafetyConfig, SafetyFilter, TrackingMonitor, Watchdog


class Clock:
    """A clock the test advances by hand, so timing rules are checked exactly."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def spec() -> RobotSpec:
    return RobotSpec.from_yaml("aloha")


def make_filter(spec, clock, **overrides):
    f = SafetyFilter(spec, SafetyConfig(**overrides), clock)
    f.reset(spec.home)
    return f


def test_nonfinite_commands_are_rejected_whole_and_the_last_one_held(spec):
    clock = Clock()
    f = make_filter(spec, clock)
    target = spec.home.copy()
    target[1] += 0.01
    clock.t += 0.02
    sent = f.filter(target)
    np.testing.assert_allclose(sent, target, atol=1e-6)
    for bad in (np.nan, np.inf, -np.inf):
        a = target.copy()
        a[8] = bad
        a[2] += 0.01  # a valid-looking change elsewhere must not get through either
        clock.t += 0.02
        np.testing.assert_array_equal(f.filter(a), sent)
    assert f.report()["nonfinite"] == 3 and f.report()["commands"] == 4


def test_position_limits_and_gripper_range_are_clipped_and_counted(spec):
    clock = Clock()
    f = make_filter(spec, clock, max_step=10.0, max_velocity=1000.0, gripper_max_step=10.0)
    a = spec.home.copy()
    a[1] = spec.upper[1] + 0.5   # shoulder past its limit
    a[6] = 1.7                    # left gripper past open
    clock.t += 0.02
    sent = f.filter(a)
    assert sent[1] == pytest.approx(spec.upper[1]) and sent[6] == pytest.approx(1.0)
    assert (sent >= spec.lower - 1e-6).all() and (sent <= spec.upper + 1e-6).all()
    r = f.report()
    assert r["position_limit"] == 1 and r["gripper_range"] == 1 and r["step_limit"] == 0


def test_a_far_target_becomes_a_ramp_bounded_per_tick_and_by_velocity(spec):
    clock = Clock()
    f = make_filter(spec, clock, max_step=0.05, max_velocity=2.0)
    far = spec.home.copy()
    far[0] += 1.01
    path = []
    for _ in range(30):
        clock.t += 0.02  # 50 Hz: the velocity bound (2 rad/s x 0.02 s = 0.04) is the tighter one
        path.append(f.filter(far)[0])
    steps = np.diff([spec.home[0], *path])
    assert np.all(steps <= 0.04 + 1e-6) and steps[0] == pytest.approx(0.04, abs=1e-6)
    assert path[-1] == pytest.approx(far[0], abs=1e-6)  # it gets there: 25 full steps, then 0.01
    assert f.report()["velocity_limit"] == 25 and f.report()["step_limit"] == 0
    # a late tick (0.1 s) may move no more than the per-tick step
    far[0] -= 1.01
    clock.t += 0.1
    assert abs(f.filter(far)[0] - path[-1]) == pytest.approx(0.05, abs=1e-6)
    assert f.report()["step_limit"] == 1


def test_filter_needs_reset_and_the_right_size(spec):
    f = SafetyFilter(spec, SafetyConfig())
    with pytest.raises(RuntimeError, match="reset"):
        f.filter(spec.home)
    f.reset(spec.home)
    with pytest.raises(ConfigError, match="takes 14"):
        f.filter(np.zeros(7))
    with pytest.raises(ConfigError, match="finite"):
        f.reset(np.full(14, np.nan))


def test_watchdog_holds_on_a_stale_command_and_stops_on_a_stale_observation(spec):
    clock = Clock()
    dog = Watchdog(SafetyConfig(command_timeout_s=0.1, observation_timeout_s=0.2), clock)
    clock.t += 0.05
    assert dog.check().action == "ok"
    clock.t += 0.06  # command 110 ms old, observation 110 ms old
    dog.observation_received()
    state = dog.check()
    assert state.action == "hold" and "holding position" in state.message
    dog.command_received()
    assert dog.check().action == "ok"
    clock.t += 0.25
    dog.command_received()
    state = dog.check()
    assert state.action == "stop" and "no joint state for 250 ms" in state.message
    assert (dog.holds, dog.stops) == (1, 1)


def test_tracking_is_lost_only_when_an_arm_joint_stays_off_for_the_timeout(spec):
    monitor = TrackingMonitor(spec, SafetyConfig(tracking_tolerance=0.3, tracking_timeout_s=1.0))
    command = spec.home.astype(float).copy()
    q = command.copy()
    q[[6, 13]] = 1.0 - command[[6, 13]]  # grippers stopped short (a grasp): not watched
    assert monitor.check(q, command, 0.0) is None
    q[1] += 0.5  # left_shoulder 0.5 rad off ...
    assert monitor.check(q, command, 1.0) is None
    assert monitor.check(q, command, 1.9) is None  # ... for 0.9 s
    q[1] -= 0.45  # back within the tolerance: the clock restarts
    assert monitor.check(q, command, 2.0) is None
    q[1] += 0.45
    q[8] -= 0.4  # right_shoulder off too
    assert monitor.check(q, command, 3.0) is None
    message = monitor.check(q, command, 4.0)
    assert message is not None and monitor.stops == 1
    assert message.startswith("the robot does not follow its commands: left_shoulder 0.50 rad, right_shoulder 0.40 rad")
    assert "for 1.0 s" in message and "tracking_tolerance 0.3 rad" in message


def test_estop_latches_across_threads_until_reset():
    stop = EStop()
    threads = [threading.Thread(target=stop.trip, args=(f"source {i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stop.tripped and stop.reason.startswith("source ")
    first = stop.reason
    stop.trip("later")
    assert stop.reason == first  # the first cause is the one reported
    stop.reset()
    assert not stop.tripped and stop.reason == ""


def test_safety_config_from_yaml_and_bad_values(tmp_path):
    cfg = SafetyConfig.from_yaml("aloha")
    assert cfg.max_step == 0.05 and cfg.observation_timeout_s == 0.2
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['max_stepp'\]"):
        SafetyConfig.from_dict({"max_stepp": 1})
    with pytest.raises(ConfigError, match="max_velocity must be > 0"):
        SafetyConfig.from_dict({"max_velocity": 0})
    bad = tmp_path / "arm.yaml"
    bad.write_text("safety: {command_timeout_s: soon}\n")
    with pytest.raises(ConfigError, match="arm.yaml: safety"):
        SafetyConfig.from_yaml(bad)


def test_safety_needs_no_mujoco():
    """hardware never imports mujoco (docs/design.md): the filter and the DDS transport run on a robot's own computer."""
    code = "import sys, robo_rl.hardware.safety, robo_rl.hardware.ros2.dds; print('mujoco' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
