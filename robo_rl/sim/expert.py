"""Scripted experts: the twin's stand-in for a human on the leader arms.

An expert is a list of segments; each moves each arm's end effector to a target pose and
gripper opening over a duration (min-jerk in position, slerp in rotation), and IK turns every
tick's pose into joint positions: the expert outputs absolute joint positions, as teleop does.
Targets may be callables, evaluated when the segment starts, so a plan can react to where an
object actually is. Noise makes demos vary like human teleop: speed, approach offsets, pauses,
and a little jitter on the commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import mujoco
import numpy as np

from robo_rl.sim.ik import ArmIK
from robo_rl.sim.robot import SimRobot

ARMS = ("left", "right")


@dataclass
class Pose:
    pos: np.ndarray
    rot: np.ndarray  # 3x3, columns: gripper x (along fingers), y (finger slide), z
    grip: float  # 0 closed .. 1 open


Target = Pose | Callable[[], Pose] | None  # None: this arm holds its last target


@dataclass
class Segment:
    name: str
    duration: float  # seconds at speed 1
    left: Target = None
    right: Target = None
    stage: int | None = None  # the task stage this segment works on (for operators and labels)
    track: bool = False  # re-evaluate callable targets every tick (servo on where things are)


@dataclass
class ExpertNoise:
    """How much a demo varies. Defaults are the 'human-like' setting used for collection."""

    speed: tuple[float, float] = (0.8, 1.25)  # per-episode duration multiplier range
    segment_jitter: float = 0.1  # each segment's duration * U(1 - j, 1 + j)
    approach_offset: float = 0.004  # metres, uniform per axis, on grasp approach points
    pause_prob: float = 0.15  # chance of a pause after a segment
    pause_s: tuple[float, float] = (0.1, 0.5)
    joint_noise: float = 0.002  # rad, Gaussian on arm joint commands
    grasp_along: tuple[float, float] = (0.0, 0.0)  # metres, uniform: a long part's grip moved along its axis (Insertion's peg)

    @classmethod
    def none(cls) -> "ExpertNoise":
        return cls(speed=(1.0, 1.0), segment_jitter=0.0, approach_offset=0.0, pause_prob=0.0, joint_noise=0.0)


def grasp_along(rng: np.random.Generator, noise: ExpertNoise) -> float:
    """How far from its usual point along a long part this demo grips it. Drawn only for a range,
    so demos recorded without one keep their random stream (and stay the same episodes)."""
    lo, hi = noise.grasp_along
    return float(rng.uniform(lo, hi)) if hi > lo else float(lo)


def _quat(rot: np.ndarray) -> np.ndarray:
    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(rot).reshape(-1))
    return q


def _slerp(q0: np.ndarray, q1: np.ndarray, s: float) -> np.ndarray:
    if q0 @ q1 < 0:
        q1 = -q1
    dot = float(np.clip(q0 @ q1, -1.0, 1.0))
    if dot > 0.9995:
        q = q0 + s * (q1 - q0)
        return q / np.linalg.norm(q)
    th = np.arccos(dot)
    return (np.sin((1 - s) * th) * q0 + np.sin(s * th) * q1) / np.sin(th)


def _mat(q: np.ndarray) -> np.ndarray:
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, q)
    return m.reshape(3, 3)


def min_jerk(s: float) -> float:
    s = min(max(s, 0.0), 1.0)
    return s * s * s * (10 - 15 * s + 6 * s * s)


def arm_slice(spec, arm: str) -> slice:
    """An arm's 6 joints in the 14-D action: its joints (named <arm>_*) but the gripper."""
    i = next(i for i, n in enumerate(spec.joint_names) if n.startswith(f"{arm}_") and i not in spec.grippers)
    return slice(i, i + 6)


def grip_index(spec, arm: str) -> int:
    """An arm's gripper in the 14-D action."""
    return next(i for i in sorted(spec.grippers) if spec.joint_names[i].startswith(f"{arm}_"))


def commanded_qpos(robot, ik: dict, command: np.ndarray) -> np.ndarray:
    """The scene's qpos with the arms where `command` puts them (not where contact pushed them)."""
    qpos = robot.data.qpos.copy()
    for arm, solver in ik.items():
        qpos[solver.qadr] = command[arm_slice(robot.spec, arm)]
    return qpos


class ScriptedExpert:
    """Plays segments on a SimRobot. Call `act()` once per control tick; `done` when finished."""

    def __init__(self, robot: SimRobot, segments: Sequence[Segment], rng: np.random.Generator,
                 noise: ExpertNoise | None = None, start_command: np.ndarray | None = None):
        """`start_command`: the last command sent by whoever had control before (e.g. a policy
        being taken over); the expert continues from it, so the commanded joints do not jump."""
        self.robot = robot
        self.rng = rng
        self.noise = noise or ExpertNoise()
        self.ik = {arm: ArmIK(robot.model, f"{arm}_") for arm in ARMS}
        self.segments = list(segments)
        self.speed = float(rng.uniform(*self.noise.speed))
        self.dt = 1.0 / robot.spec.control_hz
        self.command = np.array(robot.joint_positions() if start_command is None else start_command, dtype=np.float64)
        self._arm_idx = np.setdiff1d(np.arange(robot.spec.action_dim), robot._grip_idx)  # jitter arms, not grippers
        commanded = commanded_qpos(robot, self.ik, self.command)
        self._last: dict[str, Pose] = {}
        for arm in ARMS:
            pos, rot = self.ik[arm].site_pose(commanded)
            self._last[arm] = Pose(pos, rot, float(self.command[self._grip_index(arm)]))
        self.ik_error = {arm: 0.0 for arm in ARMS}  # metres: how far the last IK solution missed
        self._seg = -1
        self._t = 0.0
        self._len = 0.0
        self._from: dict[str, Pose] = {}
        self._to: dict[str, Pose] = {}
        self._pausing = 0.0
        self._next_segment()

    @staticmethod
    def site_pose(robot: SimRobot, arm: str) -> tuple[np.ndarray, np.ndarray]:
        """Where an arm's end-effector site is now (position, rotation)."""
        sid = robot.model.site(f"{arm}_ee").id
        return robot.data.site_xpos[sid].copy(), robot.data.site_xmat[sid].reshape(3, 3).copy()

    @staticmethod
    def hold(robot: SimRobot, arm: str, grip: float) -> Pose:
        """Stay where the arm's *command* put it (not where contact pushed it), change the grip."""
        return Pose(*ScriptedExpert.site_pose(robot, arm), grip)

    @staticmethod
    def moved(robot: SimRobot, arm: str, delta, grip: float) -> Pose:
        pos, rot = ScriptedExpert.site_pose(robot, arm)
        return Pose(pos + np.asarray(delta, dtype=np.float64), rot, grip)

    def _grip_index(self, arm: str) -> int:
        return grip_index(self.robot.spec, arm)

    def _arm_slice(self, arm: str) -> slice:
        return arm_slice(self.robot.spec, arm)

    @property
    def done(self) -> bool:
        return self._seg >= len(self.segments)

    @property
    def segment(self) -> Segment | None:
        return None if self.done else self.segments[self._seg]

    def _next_segment(self) -> None:
        if self._seg >= 0 and not self.done and self.rng.random() < self.noise.pause_prob and self._pausing == 0.0:
            self._pausing = float(self.rng.uniform(*self.noise.pause_s))
            return
        self._pausing = 0.0
        self._seg += 1
        if self.done:
            return
        seg = self.segments[self._seg]
        jitter = 1 + self.rng.uniform(-self.noise.segment_jitter, self.noise.segment_jitter)
        self._len = max(self.dt, seg.duration * self.speed * jitter)
        self._t = 0.0
        for arm in ARMS:
            target = getattr(seg, arm)
            target = target() if callable(target) else target
            self._from[arm] = self._last[arm]
            self._to[arm] = target if target is not None else self._last[arm]

    def act(self) -> np.ndarray:
        """The next 14-D joint-position command."""
        if self.done:
            return self.command.astype(np.float32)
        if self._pausing > 0:
            self._pausing -= self.dt
            if self._pausing <= 0:
                self._pausing = -1.0  # marks the pause as taken for this segment
                self._next_segment()
            return self._noisy(self.command)
        self._t += self.dt
        s = min_jerk(self._t / self._len)
        qpos_full = self.robot.data.qpos.copy()
        seg = self.segments[self._seg]
        if seg.track:
            for arm in ARMS:
                target = getattr(seg, arm)
                if callable(target):
                    self._to[arm] = target()
        for arm in ARMS:
            a, b = self._from[arm], self._to[arm]
            pos = a.pos + s * (b.pos - a.pos)
            rot = _mat(_slerp(_quat(a.rot), _quat(b.rot), s))
            grip = a.grip + s * (b.grip - a.grip)
            sl = self._arm_slice(arm)
            q, self.ik_error[arm] = self.ik[arm].solve(qpos_full, self.command[sl], pos, rot)
            self.command[sl] = q
            self.command[self._grip_index(arm)] = grip
            qpos_full[self.ik[arm].qadr] = q
        if self._t >= self._len - 1e-9:
            for arm in ARMS:
                self._last[arm] = self._to[arm]
            self._next_segment()
        return self._noisy(self.command)

    def _noisy(self, command: np.ndarray) -> np.ndarray:
        out = command.copy()
        if self.noise.joint_noise:
            out[self._arm_idx] += self.rng.normal(0, self.noise.joint_noise, len(self._arm_idx))
        return out.astype(np.float32)


def approach_offset(rng: np.random.Generator, noise: ExpertNoise) -> np.ndarray:
    """A random offset (uniform per axis) on one grasp approach: no two demos grasp alike."""
    a = noise.approach_offset
    return rng.uniform(-a, a, 3) if a else np.zeros(3)
