"""Insertion: each arm picks one part; the peg goes into the socket in mid-air (ALOHA's insertion)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robo_rl.sim.expert import ExpertNoise, Pose, ScriptedExpert, Segment, approach_offset, grasp_along
from robo_rl.sim.robot import SimRobot
from robo_rl.sim.tasks.geometry import (body_pos, body_yaw, finger_geoms, grasped, object_state, set_free_body,
                                        topdown, touching)


def _yaw_corrected(rot: np.ndarray, yaw: float) -> np.ndarray:
    """`rot` turned about world z by -yaw: a part grasped at `yaw` ends up at yaw 0."""
    c, s = np.cos(-yaw), np.sin(-yaw)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) @ rot


@dataclass
class Insertion:
    """Each arm picks one part; the peg goes into the socket in mid-air (ALOHA's insertion)."""

    name: str = "insertion"
    scene: str = "insertion.xml"
    max_steps: int = 500
    stage_names: tuple[str, ...] = ("reach", "both_lifted", "peg_in_socket", "peg_touches_pin")
    state_bodies: tuple[str, ...] = ("peg", "socket")
    state_joints: tuple[str, ...] = ()
    peg_x: tuple[float, float] = (0.08, 0.18)
    socket_x: tuple[float, float] = (-0.18, -0.08)
    y_range: tuple[float, float] = (-0.1, 0.1)
    yaw_range: tuple[float, float] = (-0.3, 0.3)
    meet_z: float = 0.2
    socket_half_len: float = 0.035
    peg_half_len: float = 0.07
    grip_behind_centre: float = 0.03  # the expert grips the peg 10 cm from its tip: deeper than the socket, fingers stay clear

    def reset(self, robot: SimRobot, rng: np.random.Generator) -> None:
        set_free_body(robot, "peg", np.array([rng.uniform(*self.peg_x), rng.uniform(*self.y_range), 0.011]),
                      rng.uniform(*self.yaw_range))
        set_free_body(robot, "socket", np.array([rng.uniform(*self.socket_x), rng.uniform(*self.y_range), 0.022]),
                      rng.uniform(*self.yaw_range))

    def state(self, robot: SimRobot) -> np.ndarray:
        return object_state(robot, self.state_bodies, self.state_joints)

    def _socket_grasped(self, robot: SimRobot) -> bool:
        return grasped(robot, "socket", "left")  # each finger on any of the socket's walls

    def _peg_in_socket(self, robot: SimRobot) -> bool:
        """The peg's tip lies inside the socket's bore (in the socket's frame)."""
        sock = robot.data.body("socket")
        peg = robot.data.body("peg")
        tip = peg.xpos + peg.xmat.reshape(3, 3)[:, 0] * -self.peg_half_len  # the -x end
        local = sock.xmat.reshape(3, 3).T @ (tip - sock.xpos)
        return bool(-self.socket_half_len < local[0] < self.socket_half_len and abs(local[1]) < 0.017 and abs(local[2]) < 0.017)

    def grasp_targets(self, stage: int) -> list[tuple[str, str]]:
        return [("right", "peg"), ("left", "socket")] if stage <= 2 else []

    def stage(self, robot: SimRobot) -> int:
        lifted = body_pos(robot, "peg")[2] > 0.05 and body_pos(robot, "socket")[2] > 0.05
        held = grasped(robot, "peg", "right") and self._socket_grasped(robot)
        if self._peg_in_socket(robot):
            a, b = finger_geoms(robot, "right")
            if touching(robot, "pin", {robot.model.geom("peg").id}) and lifted:
                return 3
            return 2 if lifted else 1 if held else 0
        if held and lifted:
            return 1
        return 0

    def expert(self, robot: SimRobot, rng: np.random.Generator, noise: ExpertNoise | None = None,
               start_command: np.ndarray | None = None) -> ScriptedExpert:
        noise = noise or ExpertNoise()
        stage = self.stage(robot)
        peg, sock = body_pos(robot, "peg"), body_pos(robot, "socket")
        peg_yaw, sock_yaw = body_yaw(robot, "peg"), body_yaw(robot, "socket")
        _, r_rot = ScriptedExpert.site_pose(robot, "right")
        _, l_rot = ScriptedExpert.site_pose(robot, "left")
        # fingers across the part's long axis: y of the grip is the part's y axis
        r_down = topdown(peg_yaw, r_rot[:, 1])
        l_down = topdown(sock_yaw, l_rot[:, 1])
        peg_axis = np.array([np.cos(peg_yaw), np.sin(peg_yaw), 0.0])
        o1, o2 = approach_offset(rng, noise), approach_offset(rng, noise)
        grip_on_peg = peg + (self.grip_behind_centre + grasp_along(rng, noise)) * peg_axis
        segs: list[Segment] = []
        if stage == 0:
            segs += [
                Segment("approach", 1.0, right=Pose(grip_on_peg + [0, 0, 0.1] + o1 * [1, 1, 0], r_down, 1.0),
                        left=Pose(sock + [0, 0, 0.1] + o2 * [1, 1, 0], l_down, 1.0), stage=0),
                Segment("descend", 0.7, right=Pose(np.array([*grip_on_peg[:2], 0.024]) + o1 * [0.5, 0.5, 0.3], r_down, 1.0),
                        left=Pose(np.array([*sock[:2], 0.032]) + o2 * [0.5, 0.5, 0.3], l_down, 1.0), stage=0),
                Segment("grasp", 0.5, right=lambda: ScriptedExpert.hold(robot, "right", 0.0),
                        left=lambda: ScriptedExpert.hold(robot, "left", 0.0), stage=0),
            ]
        if stage <= 1:
            segs += [
                Segment("lift", 1.2, right=lambda: Pose(np.array([0.14, 0.0, self.meet_z]),
                                                         _yaw_corrected(ScriptedExpert.site_pose(robot, "right")[1], body_yaw(robot, "peg")), 0.0),
                        left=lambda: Pose(np.array([-0.14, 0.0, self.meet_z]),
                                          _yaw_corrected(ScriptedExpert.site_pose(robot, "left")[1], body_yaw(robot, "socket")), 0.0), stage=1),
                Segment("align", 1.0, right=lambda: self._peg_target(robot, depth=-0.03), stage=1, track=True),
            ]
        segs += [
            Segment("insert", 1.2, right=lambda: self._peg_target(robot, depth=0.066), stage=2, track=True),
            Segment("settle", 0.3, right=lambda: ScriptedExpert.hold(robot, "right", 0.0), stage=2),
        ]
        return ScriptedExpert(robot, segs, rng, noise, start_command)

    def _peg_target(self, robot: SimRobot, depth: float) -> Pose:
        """Right-hand pose that puts the peg on the socket's axis with its tip `depth` metres past
        the socket mouth, measured from where both parts actually are in the hands."""
        sock = robot.data.body("socket")
        peg = robot.data.body("peg")
        s_rot = sock.xmat.reshape(3, 3)
        mouth = sock.xpos + s_rot[:, 0] * self.socket_half_len
        peg_centre = mouth - s_rot[:, 0] * (depth - self.peg_half_len)
        ee_pos, ee_rot = ScriptedExpert.site_pose(robot, "right")
        # keep the hand-to-peg transform; turn the hand so the peg axis lines up with the socket's
        p_rot = peg.xmat.reshape(3, 3)
        align = s_rot @ p_rot.T  # rotation taking the peg's frame onto the socket's
        ee_rot_new = align @ ee_rot
        offset = align @ (ee_pos - peg.xpos)
        return Pose(peg_centre + offset, ee_rot_new, 0.0)
