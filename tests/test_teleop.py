"""Teleop devices for a human operator: keys through a real pseudo-terminal, gamepad events
through the Linux joystick byte format, and a human-driven RaC intervention in the twin."""

import os
import select
import struct
import subprocess
import sys
import termios
import time

import numpy as np
import pytest

from robo_rl.data.schema import Segment
from robo_rl.errors import RoboRLError
from robo_rl.hardware.teleop import JS_AXIS, JS_BUTTON, JS_INIT, KeyboardTeleop, LinuxJoystick, TerminalKeys
from robo_rl.rac import InterventionConfig, InterventionController
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.expert import ExpertNoise, ScriptedExpert
from robo_rl.sim.teleop import TeleopOperator


@pytest.fixture
def pty_keys():
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    keys = TerminalKeys(fd=slave)
    yield master, keys, slave, before
    keys.close()
    os.close(master)
    os.close(slave)


def type_keys(master: int, slave: int, text: str) -> None:
    os.write(master, text.encode())
    assert select.select([slave], [], [], 2.0)[0], "the pty did not deliver"
    time.sleep(0.01)  # the rest of a multi-key write


def test_terminal_keys_become_events_moves_and_grips(pty_keys):
    master, keys, slave, before = pty_keys
    kb = KeyboardTeleop(step_m=0.005, source=keys)
    type_keys(master, slave, "t2qqwg")
    inp = kb.poll()
    assert inp.events == ["take_over"]
    np.testing.assert_allclose(inp.delta["right"], [0.005, 0.0, 0.010])
    assert inp.grip == {"right": 0.0} and "left" not in inp.delta
    type_keys(master, slave, "bdr")
    inp = kb.poll()
    assert inp.events == ["recovery_done"]
    for arm in ("left", "right"):
        np.testing.assert_allclose(inp.delta[arm], [0.0, -0.005, 0.0])
    assert kb.poll().events == [] and kb.poll().delta == {}  # nothing typed: nothing happens
    keys.close()
    assert termios.tcgetattr(slave) == before  # the terminal is restored


def test_keyboard_refuses_a_non_terminal():
    r, w = os.pipe()
    try:
        with pytest.raises(RoboRLError, match="TTY"):
            TerminalKeys(fd=r)
    finally:
        os.close(r)
        os.close(w)


def test_arrow_and_function_keys_are_not_letters(pty_keys):
    """Right arrow is ESC [ C: its C must not end a correction; F1 is ESC O P."""
    master, keys, slave, _ = pty_keys
    kb = KeyboardTeleop(source=keys)
    type_keys(master, slave, "\x1b[C\x1b[B\x1bOP\x1b[1;5Aq")
    inp = kb.poll()
    assert inp.events == [] and kb.selected == ("right",)
    np.testing.assert_allclose(inp.delta["right"], [0.0, 0.0, 0.005])  # only the q


def test_the_teleop_devices_need_no_mujoco():
    """hardware never imports mujoco (docs/design.md): the devices work on a robot's own computer."""
    code = "import sys, robo_rl.hardware.teleop; print('mujoco' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def js(value: int, kind: int, number: int, t_ms: int = 0) -> bytes:
    return struct.pack("<IhBB", t_ms, value, kind, number)


def test_gamepad_reads_linux_joystick_events(tmp_path):
    fifo = tmp_path / "js0"
    os.mkfifo(fifo)
    pad = LinuxJoystick(str(fifo), max_speed=0.1)
    writer = os.open(fifo, os.O_WRONLY)
    try:
        # the driver's initial state burst (flagged INIT) must not fire a button
        os.write(writer, js(1, JS_BUTTON | JS_INIT, 0) + js(0, JS_AXIS | JS_INIT, 1))
        assert pad.poll().events == []
        os.write(writer, js(1, JS_BUTTON, 0) + js(0, JS_BUTTON, 0) + js(-32767, JS_AXIS, 1) + js(1, JS_BUTTON, 4))
        first = pad.poll()
        assert first.events == ["take_over"] and first.grip == {"left": 0.0}
        time.sleep(0.05)
        moved = pad.poll()  # stick held forward: the right arm moves +x at up to 0.1 m/s
        assert 0.002 < moved.delta["right"][0] < 0.011 and abs(moved.delta["right"][1]) < 1e-9
        os.write(writer, js(1, JS_BUTTON, 3) + js(0, JS_AXIS, 1) + js(1, JS_BUTTON, 2))
        inp = pad.poll()
        assert pad.selected == "left" and inp.events == ["correction_done"] and inp.delta == {}
        os.write(writer, js(1, JS_BUTTON, 1)[:5])  # half an event: kept until the rest arrives
        assert pad.poll().events == []
        os.write(writer, js(1, JS_BUTTON, 1)[5:])
        assert pad.poll().events == ["recovery_done"]
    finally:
        os.close(writer)
        pad.close()


def test_gamepad_missing_device_is_a_clear_error(tmp_path):
    with pytest.raises(RoboRLError, match="cannot open"):
        LinuxJoystick(str(tmp_path / "js9"))


def test_a_human_at_the_keyboard_takes_over_recovers_and_corrects_in_the_twin(pty_keys):
    master, keys, slave, _ = pty_keys
    env = BimanualEnv("transfer_cube")
    env.reset(seed=0)
    policy = env.expert(ExpertNoise.none())
    operator = TeleopOperator(env, KeyboardTeleop(step_m=0.005, source=keys))
    ctl = InterventionController(operator)
    script = {30: "c", 60: "t"} | {k: "qq" for k in range(62, 82)} | {90: "r", 100: "c"}  # "c" at 30: a stray key
    labels, actions, right_z = [], [], []
    for k in range(200):
        if k in script:
            type_keys(master, slave, script[k])
        act, label = ctl.step(None if ctl.in_control else policy.act(), env.robot.time, env.task.stage(env.robot))
        labels.append(label)
        actions.append(act)
        env.step(act)
        right_z.append(ScriptedExpert.site_pose(env.robot, "right")[0][2])
        if ctl.done:
            break
    assert ctl.done and len(ctl.interventions) == 1
    rec = ctl.interventions[0]
    assert rec.reason == "keyboard operator" and rec.ended == "keyboard operator"
    assert ctl.ignored_events and ctl.ignored_events[0][1] == "correction_done"  # the stray key, counted not acted on
    order = [labels[0]] + [b for a, b in zip(labels, labels[1:]) if a != b]
    assert order == [Segment.POLICY, Segment.RECOVERY, Segment.CORRECTION]
    first = labels.index(Segment.RECOVERY)
    assert 58 <= first <= 63
    # the human raised the right hand: 20 ticks x 2 presses x 5 mm = 0.2 m asked for
    assert right_z[first + 25] - right_z[first - 1] > 0.1
    steps = np.abs(np.diff(np.array(actions), axis=0))[:, [i for i in range(14) if i not in (6, 13)]]
    assert steps[first - 1:first + 2].max() < 0.06  # no jump when control changes hands


@pytest.mark.slow  # ~25 s (AMD EPYC, AVX2); by default test_record_interventions_on_a_policy_with_the_rac_keys drives the same keys
def test_rac_with_a_human_at_the_keyboard_through_the_cli(tmp_path):
    """`robo-rl rac operator=keyboard` in a real terminal: the human's keys (typed into a pty once
    the rollout prompt appears) take over, end recovery and end the correction; the episode is
    stored with its labels and the human operator's name, then fine-tuning and evaluation run."""
    import json
    from pathlib import Path

    from robo_rl.data.store import EpisodeStore

    root = Path(__file__).parents[1]
    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("DISPLAY", None)  # no viewer window in a test
    env.pop("WAYLAND_DISPLAY", None)
    demos, run, out = tmp_path / "demos", tmp_path / "run", tmp_path / "rac"

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                           timeout=600, env=env, cwd=root)
        assert r.returncode == 0, r.stdout + r.stderr

    cli("collect", "task=transfer_cube", "episodes=1", "cameras=[]", f"out={demos}")
    cli("train", "policy=flow", "task=transfer_cube", f"dataset={demos}", f"run_dir={run}", "learner.steps=5",
        "learner.batch_size=8", "eval.episodes=0", "policy.dit_dim=32", "policy.dit_depth=2")
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", "rac", f"checkpoint={run / 'checkpoints' / 'last.pt'}",
                             "operator=keyboard", "methods=[rac]", "rounds=1", "episodes_per_round=1", "finetune.steps=3",
                             "finetune.batch_size=8", "eval.episodes=1", "eval.n_envs=1", f"out={out}"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=root)
    # keys go in as the status line shows each phase: the human reacts to what they see
    script = [("take over when it is about to fail", b""), ("autonomous |", b"t"), ("recovery |", b"q" * 10 + b"r"),
              ("correction |", b"c")]
    seen, deadline = "", time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 5.0)[0]:
                continue
            chunk = os.read(proc.stdout.fileno(), 4096).decode(errors="ignore")
            if not chunk:
                break
            seen += chunk
            while script and script[0][0] in seen:
                marker, keys = script.pop(0)
                seen = seen[seen.index(marker) + len(marker):]
                if keys:
                    os.write(master, keys)
        assert proc.wait(timeout=600) == 0 and not script, seen
    finally:
        proc.kill()
        proc.stdout.close()
        os.close(master)
        os.close(slave)
    store = EpisodeStore.open(out / "rac" / "data" / "round1")
    assert store.n_episodes == 1
    meta = store.metas[0]
    assert meta.operator == "human_keyboard"
    (rec,) = meta.extra["interventions"]
    # each phase lasted at least until the status line showed it and the next key arrived
    assert rec["reason"] == "keyboard operator" and rec["recovery_steps"] >= 1 and rec["correction_steps"] >= 1
    seg = store.episode(0)["segment"]
    runs = [int(seg[0])] + [int(b) for a, b in zip(seg, seg[1:]) if a != b]
    assert runs == [int(Segment.POLICY), int(Segment.RECOVERY), int(Segment.CORRECTION)]
    assert json.loads((out / "results.json").read_text())["rows"][0]["method"] == "rac"


def test_hg_dagger_human_corrects_without_recovery_and_hands_back():
    env = BimanualEnv("transfer_cube")
    env.reset(seed=1)
    policy = env.expert(ExpertNoise.none())
    kb = KeyboardTeleop()
    ctl = InterventionController(TeleopOperator(env, kb, recover=False), InterventionConfig(mode="hg_dagger"))
    labels = []
    for k in range(80):
        if k == 20:
            kb.press("t")
        if k == 22:
            kb.press("r")  # a habit from RaC: ignored, the recovery already ended by itself
        if k == 40:
            kb.press("c")
        act, label = ctl.step(None if ctl.in_control else policy.act(), env.robot.time, env.task.stage(env.robot))
        labels.append(label)
        env.step(act)
    (rec,) = ctl.interventions
    assert rec.recovery_steps == 1 and rec.correction_steps >= 15  # the takeover tick only
    assert labels[-1] == Segment.POLICY and not ctl.done  # control came back to the policy


def test_leader_arms_need_no_kinematic_model_and_end_effector_devices_do():
    """Leader arms give joint positions one to one: the operator builds no model of the arms
    (on real arms, no twin); a device that moves end effectors is refused without one."""
    from robo_rl.errors import ConfigError
    from robo_rl.hardware.robot import RobotSpec
    from robo_rl.hardware.teleop import TeleopInput
    from robo_rl.rac.intervention import Phase

    spec = RobotSpec.from_yaml("aloha")

    class Leaders:
        name, gives_joints = "leader", True

        def __init__(self):
            self.pose = {"left": np.r_[spec.home[:6] + 0.1, 0.25]}

        def poll(self):
            return TeleopInput(joints=dict(self.pose))

    operator = TeleopOperator(None, Leaders(), spec=spec)
    assert operator.robot is None and operator.ik == {}
    operator.signal(Phase.CORRECTION, None)
    command = operator.command(Phase.CORRECTION, spec.home)
    np.testing.assert_allclose(command[:6], spec.home[:6] + 0.1, atol=1e-6)
    assert command[6] == pytest.approx(0.25) and np.allclose(command[7:], spec.home[7:])  # the right arm holds
    with pytest.raises(ConfigError, match="moves end effectors: it needs the arms' kinematic model"):
        TeleopOperator(None, KeyboardTeleop(), spec=spec)


def _arm_urdf(prefix: str, y: float) -> str:
    """One 6-joint arm (waist z, shoulder y, elbow y, roll x, wrist y, rotate x) on a base at y."""
    inertial = '<inertial><mass value="0.5"/><inertia ixx="1e-3" iyy="1e-3" izz="1e-3" ixy="0" ixz="0" iyz="0"/></inertial>'
    links = [f'<link name="{prefix}base">{inertial}</link>']
    joints = [f'<joint name="{prefix}mount" type="fixed"><parent link="world"/><child link="{prefix}base"/>'
              f'<origin xyz="0 {y} 0"/></joint>']
    chain = [("j1", "0 0 1", "0 0 0.1"), ("j2", "0 1 0", "0 0 0.05"), ("j3", "0 1 0", "0.2 0 0"),
             ("j4", "1 0 0", "0.1 0 0"), ("j5", "0 1 0", "0.1 0 0"), ("j6", "1 0 0", "0.05 0 0")]
    parent = f"{prefix}base"
    for name, axis, xyz in chain:
        links.append(f'<link name="{prefix}{name}_link">{inertial}</link>')
        joints.append(f'<joint name="{prefix}{name}" type="revolute"><parent link="{parent}"/>'
                      f'<child link="{prefix}{name}_link"/><origin xyz="{xyz}"/><axis xyz="{axis}"/>'
                      '<limit lower="-3" upper="3" effort="10" velocity="3"/></joint>')
        parent = f"{prefix}{name}_link"
    links.append(f'<link name="{prefix}tool">{inertial}</link>')
    joints.append(f'<joint name="{prefix}tool_mount" type="fixed"><parent link="{parent}"/><child link="{prefix}tool"/>'
                  '<origin xyz="0.1 0 0"/></joint>')
    return "".join(links + joints)


def test_end_effector_teleop_uses_the_kinematic_model_the_description_names(tmp_path):
    """A robot that is not the twin: its description names a URDF (two 6-joint arms, no sites);
    a keyboard move of the left end effector becomes joint commands that move that URDF's tool
    link by the move, through IK on that model."""
    import mujoco

    from robo_rl.hardware.robot import HARDWARE_DIR, RobotSpec
    from robo_rl.hardware.teleop import TeleopInput
    from robo_rl.rac.intervention import Phase
    from robo_rl.sim.kinematics import load_kinematics

    (tmp_path / "arms.urdf").write_text(
        '<robot name="arms"><mujoco><compiler fusestatic="false"/></mujoco><link name="world"/>'
        + _arm_urdf("l_", 0.3) + _arm_urdf("r_", -0.3) + "</robot>")
    arms = "".join(f"    {arm}: {{joints: [{', '.join(f'{p}j{i}' for i in range(1, 7))}], end_effector: {p}tool, base: {p}base}}\n"
                   for arm, p in (("left", "l_"), ("right", "r_")))
    description = tmp_path / "my_arms.yaml"
    description.write_text((HARDWARE_DIR / "aloha.yaml").read_text() + f"kinematics:\n  model: arms.urdf\n  arms:\n{arms}")
    kin = load_kinematics(description)
    assert kin is not None and kin.model.nsite == 0 and load_kinematics("aloha") is None

    class Pushes:  # a keyboard-like device: moves of the end effectors
        name = "pushes"
        moves: list = []

        def poll(self):
            return self.moves.pop() if self.moves else TeleopInput()

    spec = RobotSpec.from_yaml(description)
    start = spec.home.astype(np.float64)
    device = Pushes()
    operator = TeleopOperator(kin, device)
    device.moves = [TeleopInput(delta={"left": np.array([0.02, 0.0, 0.0])})]  # the left tool 2 cm along x
    operator.signal(Phase.CORRECTION, None)
    command = operator.command(Phase.CORRECTION, start)

    def tool(q: np.ndarray) -> np.ndarray:
        data = mujoco.MjData(kin.model)
        for i, j in enumerate(kin.arms["left"].joints):
            data.qpos[kin.model.joint(j).qposadr[0]] = q[i]
        mujoco.mj_kinematics(kin.model, data)
        return data.body("l_tool").xpos.copy()

    moved = tool(command[:6]) - tool(start[:6])
    np.testing.assert_allclose(moved, [0.02, 0.0, 0.0], atol=2e-3)
    np.testing.assert_allclose(command[7:], start[7:], atol=2e-3)  # the right arm holds (IK re-solved in place)
    bad = tmp_path / "bad.yaml"
    bad.write_text(description.read_text().replace("end_effector: l_tool", "end_effector: l_hand"))
    with pytest.raises(RoboRLError, match="kinematics.arms.left.end_effector: arms.urdf has no site or body 'l_hand'"):
        load_kinematics(bad)
