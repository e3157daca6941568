"""TransferCube: the right arm picks up a cube and hands it to the left arm (ALOHA's transfer-cube)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robo_rl.sim.expert import ExpertNoise, Pose, ScriptedExpert, Segment, approach_offset
from robo_rl.sim.ik import rotation
from robo_rl.sim.robot import SimRobot
from robo_rl.sim.tasks.geometry import (body_pos, body_yaw, face_aligned, grasped, nearer, object_state, set_free_body,
                                        topdown, touching_any_finger)


@dataclass
class TransferCube:
    """The right arm picks up a cube and hands it to the left arm (ALOHA's transfer-cube)."""

    name: str = "transfer_cube"
    scene: str = "transfer_cube.xml"
    max_steps: int = 400
    stage_names: tuple[str, ...] = ("reach", "lifted_by_right", "touched_by_left", "held_by_left")
    state_bodies: tuple[str, ...] = ("cube",)
    state_joints: tuple[str, ...] = ()
    meet: tuple[float, float, float] = (0.0, 0.0, 0.22)  # cube centre at the handover
    x_range: tuple[float, float] = (0.05, 0.18)
    y_range: tuple[float, float] = (-0.12, 0.12)
    yaw_range: tuple[float, float] = (-0.5, 0.5)

    def reset(self, robot: SimRobot, rng: np.random.Generator) -> None:
        pos = np.array([rng.uniform(*self.x_range), rng.uniform(*self.y_range), 0.02])
        set_free_body(robot, "cube", pos, rng.uniform(*self.yaw_range))

    def state(self, robot: SimRobot) -> np.ndarray:
        return object_state(robot, self.state_bodies, self.state_joints)

    def grasp_targets(self, stage: int) -> list[tuple[str, str]]:
        """(arm, geom) pairs that should be grasped while working on `stage`."""
        return {0: [("right", "cube")], 1: [("right", "cube")], 2: [("left", "cube")]}.get(stage, [])

    def stage(self, robot: SimRobot) -> int:
        z = body_pos(robot, "cube")[2]
        left = grasped(robot, "cube", "left")
        right_touch = touching_any_finger(robot, "cube", "right")
        if left and not right_touch and z > 0.08:
            return 3
        if left and z > 0.08:
            return 2
        if grasped(robot, "cube", "right") and z > 0.04:
            return 1
        return 0

    def expert(self, robot: SimRobot, rng: np.random.Generator, noise: ExpertNoise | None = None,
               start_command: np.ndarray | None = None) -> ScriptedExpert:
        noise = noise or ExpertNoise()
        stage = self.stage(robot)
        cube = body_pos(robot, "cube")
        yaw = body_yaw(robot, "cube")
        _, r_rot = ScriptedExpert.site_pose(robot, "right")
        down = topdown(yaw, r_rot[:, 1])
        meet = np.array(self.meet)
        right_hand = rotation([-1, 0, 0], nearer([0, 1, 0], down[:, 1]))  # pointing at the left arm, fingers across y
        left_hand = rotation([1, 0, 0], [0, 0, 1])  # pointing at the right arm, fingers across z
        grasp_z = 0.032  # ee between the fingertips, 12 mm above the cube centre
        o1, o2 = approach_offset(rng, noise), approach_offset(rng, noise)
        segs: list[Segment] = []
        if stage == 0:
            segs += [
                Segment("approach", 1.0, right=Pose(cube + [0, 0, 0.12] + o1 * [1, 1, 0], down, 1.0), stage=0),
                Segment("descend", 0.7, right=Pose(np.array([cube[0], cube[1], grasp_z]) + o1 * [1, 1, 0.5], down, 1.0), stage=0),
                Segment("grasp", 0.4, right=lambda: ScriptedExpert.hold(robot, "right", grip=0.0), stage=0),
            ]
        if stage <= 1:
            segs += [
                Segment("lift", 1.2, right=Pose(meet + [0.012, 0, 0], right_hand, 0.0),
                        left=Pose(meet + [-0.12, 0, 0] + o2, left_hand, 1.0), stage=1),
            ]
        segs += [
            Segment("reach", 0.8, left=lambda: Pose(body_pos(robot, "cube") + [-0.005, 0, 0] + o2 * [0, 0.5, 0.5],
                                                    face_aligned(robot, "cube", [1, 0, 0], [0, 0, 1]), 1.0), stage=2),
            Segment("close", 0.5, left=lambda: ScriptedExpert.hold(robot, "left", grip=0.0), stage=2),
            Segment("release", 0.5, right=lambda: ScriptedExpert.hold(robot, "right", grip=1.0), stage=2),
            Segment("retreat", 0.8, right=lambda: ScriptedExpert.moved(robot, "right", [0.1, 0, 0.02], grip=1.0),
                    left=lambda: ScriptedExpert.moved(robot, "left", [-0.03, 0, 0.03], grip=0.0), stage=2),
        ]
        return ScriptedExpert(robot, segs, rng, noise, start_command)
