"""A human operator: a teleop device (keyboard, gamepad, SpaceMouse) drives the arms' end
effectors through inverse kinematics on the twin's model, or leader arms give joint positions
one to one; the keys or buttons are the RaC events. The robot may be the twin or real arms (the
twin's model then only serves the kinematics).

`TeleopOperator` is a `robo_rl.rac.Operator`, so the same `InterventionController` that drives
the simulated operator drives a human: the human presses "take over" when failure looks
imminent, steers the arms back to a familiar state, presses "recovery done", completes the
sub-task, and presses "correction done". At the takeover the targets start from where the
*commanded* joints put the end effectors, so the first command continues the policy's last one.
"""

from __future__ import annotations

import os

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.hardware.teleop import ARMS, KeyboardTeleop, TeleopDevice, TeleopInput
from robo_rl.rac.intervention import OperatorEvent, Phase
from robo_rl.sim.expert import arm_slice, commanded_qpos, grip_index
from robo_rl.sim.ik import ArmIK


class TeleopOperator:
    """Operator protocol over a TeleopDevice for a BimanualEnv (or its SimRobot), whose model
    serves the end-effector moves' IK. Leader arms give joint positions and need no model:
    `env=None` with the robot's `spec` then builds none (a device that moves end effectors is
    refused)."""

    def __init__(self, env, device: TeleopDevice, max_reach_m: float = 0.6, recover: bool = True,
                 min_height_m: float = 0.005, spec=None):
        self.device = device
        self.name = f"human_{device.name}"
        self.recover = recover
        if env is None:  # joints one to one: no kinematics
            if spec is None or not getattr(device, "gives_joints", False):
                raise ConfigError(f"teleop device {device.name} moves end effectors: it needs the arms' kinematic "
                                  "model (only leader arms, which give joint positions, run without one)")
            self.robot, self.ik, self._base = None, {}, {}
            self._arm_slice = {arm: arm_slice(spec, arm) for arm in ARMS}
            self._grip_index = {arm: grip_index(spec, arm) for arm in ARMS}
            self.reset()
            return
        env = env.unwrapped if hasattr(env, "unwrapped") else env
        self.robot = getattr(env, "robot", env)
        self.max_reach_m = max_reach_m  # targets stay within this of the arm's base: a held key cannot run away
        self.min_height_m = min_height_m  # ... and above the table
        # HG-DAgger's human corrects at once: "recovery done" follows the takeover by itself, so a
        # baseline run never trains on recovery steps whatever keys are pressed (self.recover)
        frames = getattr(self.robot, "arms", None)  # a description's own model (robo_rl/sim/kinematics.py)
        if frames is None:  # the twin: its own names
            self.ik = {arm: ArmIK(self.robot.model, f"{arm}_") for arm in ARMS}
            bases = {arm: f"{arm}_base" for arm in ARMS}
        else:
            self.ik = {arm: ArmIK(self.robot.model, joints=list(f.joints), end_effector=f.end_effector)
                       for arm, f in frames.items()}
            bases = {arm: f.base for arm, f in frames.items()}
        spec = self.robot.spec
        self._arm_slice = {arm: arm_slice(spec, arm) for arm in ARMS}
        self._grip_index = {arm: grip_index(spec, arm) for arm in ARMS}
        self._base = {arm: self.robot.data.body(bases[arm]).xpos.copy() for arm in ARMS}
        self.reset()

    def reset(self) -> None:
        """Before each episode; keys pressed since the last one (during training, evaluation) are stale."""
        self.device.poll()
        self._input = TeleopInput()
        self._queued: list[str] = []
        self._targets: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._command: np.ndarray | None = None

    # ------------------------------------------------------------------ the Operator protocol
    def signal(self, phase: Phase, policy_action: np.ndarray | None) -> OperatorEvent | None:
        self._input = self.device.poll()
        self._queued += self._input.events
        if phase == Phase.AUTONOMOUS:
            self._targets = None  # the next takeover starts from wherever the arms are then
        if phase == Phase.RECOVERY and not self.recover:
            self._queued = [e for e in self._queued if e != "recovery_done"]
            return OperatorEvent("recovery_done", "no recovery (HG-DAgger)")
        if self._queued:
            return OperatorEvent(self._queued.pop(0), f"{self.device.name} operator")
        return None

    def command(self, phase: Phase, last_command: np.ndarray) -> np.ndarray:
        if self._targets is None:
            self._start(last_command)
        if self.robot is None:  # leader arms, no model: joint positions one to one
            for arm, q in self._input.joints.items():
                self._command[self._arm_slice[arm]] = q[:6]
                self._command[self._grip_index[arm]] = q[6]
            self._input = TeleopInput()
            return self._command.astype(np.float32)
        qpos = commanded_qpos(self.robot, self.ik, self._command)
        for arm in ARMS:
            if arm in self._input.joints:  # leader arms: joint positions one to one, no IK
                q = self._input.joints[arm]
                self._command[self._arm_slice[arm]] = q[:6]
                self._command[self._grip_index[arm]] = q[6]
                qpos[self.ik[arm].qadr] = q[:6]
                self._targets[arm] = self.ik[arm].site_pose(qpos)
                continue
            pos, rot = self._targets[arm]
            move = self._input.delta.get(arm)
            if move is not None:
                pos = pos + move
                base = self._base[arm]
                if np.linalg.norm(pos - base) > self.max_reach_m:
                    pos = base + (pos - base) * (self.max_reach_m / np.linalg.norm(pos - base))
                pos[2] = max(pos[2], self.min_height_m)
            if arm in self._input.grip:
                self._command[self._grip_index[arm]] = self._input.grip[arm]
            sl = self._arm_slice[arm]
            q, miss = self.ik[arm].solve(qpos, self._command[sl], pos, rot)
            self._command[sl] = q
            qpos[self.ik[arm].qadr] = q
            # out of reach: the target stays where the arm got to, so backing off acts at once
            self._targets[arm] = self.ik[arm].site_pose(qpos) if miss > 0.01 else (pos, rot)
        self._input = TeleopInput()  # a move is applied once
        return self._command.astype(np.float32)

    def _start(self, last_command: np.ndarray) -> None:
        """Targets = the end-effector poses the last command puts the arms at; gripper state synced."""
        self._command = np.array(last_command, dtype=np.float64)
        if self.robot is None:
            self._targets = {}
            return
        qpos = commanded_qpos(self.robot, self.ik, self._command)
        self._targets = {arm: self.ik[arm].site_pose(qpos) for arm in ARMS}
        if hasattr(self.device, "gripper"):
            for arm in ARMS:
                self.device.gripper[arm] = 1.0 if self._command[self._grip_index[arm]] >= 0.5 else 0.0


def open_viewer(robot, keyboard: KeyboardTeleop | None = None):
    """The MuJoCo viewer on a SimRobot when a display is available (keys typed into its window
    reach `keyboard`), else None."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None
    import mujoco.viewer

    def on_key(code: int) -> None:
        if keyboard is not None and 32 <= code < 127:
            keyboard.press(chr(code))

    return mujoco.viewer.launch_passive(robot.model, robot.data, key_callback=on_key)


class HumanView:
    """What a human operator sees while steering: the MuJoCo viewer when a display is available
    (keys typed into its window reach the keyboard device too), and a status line in the terminal.
    Pass it as `on_tick` to `collect_interventions`."""

    def __init__(self, env, keyboard: KeyboardTeleop | None = None, status_every: int = 10):
        env = env.unwrapped if hasattr(env, "unwrapped") else env
        self.env, self.status_every, self._tick = env, status_every, 0
        self.viewer = open_viewer(env.robot, keyboard)

    def __call__(self, env, controller) -> None:
        if self.viewer is not None:
            self.viewer.sync()
        self._tick += 1
        if self._tick % self.status_every == 0:
            stage = env.task.stage_names[env.task.stage(env.robot)]
            print(f"\r{controller.phase.value:>10} | stage {stage:<14} | {env.robot.time:5.1f} s | "
                  f"takeovers {len(controller.interventions)}   ", end="", flush=True)

    def close(self) -> None:
        if self.viewer is not None:
            self.viewer.close()
