"""The twin's tasks: scene, randomised reset, stage (sub-task index), success, and a scripted
expert that plans from the current state, so it can also finish a task someone else started
(the simulated operator's corrections).

One module a task (transfer_cube.py, insertion.py, pack_cube.py), the scene helpers they share in
geometry.py, and here the `Task` protocol and the one registry TASKS (name -> class) that
`make_task` and every task list read: a new task is its own module plus one line in TASKS. Every
public name of the modules is re-exported, so `from robo_rl.sim.tasks import X` works for all.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from robo_rl.sim.expert import ExpertNoise, ScriptedExpert
from robo_rl.sim.robot import SimRobot
from robo_rl.sim.tasks.geometry import (TABLE_Z, body_pos, body_yaw, face_aligned, finger_geoms, free_body_state,
                                        geom_ids, grasped, nearer, object_state, pointing_down, set_free_body, topdown,
                                        touching, touching_any_finger)
from robo_rl.sim.tasks.insertion import Insertion
from robo_rl.sim.tasks.pack_cube import PackCube, PackCubeNoLid
from robo_rl.sim.tasks.transfer_cube import TransferCube


class Task(Protocol):
    name: str
    scene: str
    max_steps: int
    stage_names: tuple[str, ...]  # stage k is reached when sub-task k-1 is done; success = last

    def reset(self, robot: SimRobot, rng: np.random.Generator) -> None: ...

    state_bodies: tuple[str, ...]  # free bodies in `state`, 7 numbers each
    state_joints: tuple[str, ...]  # then these scalar joints

    def state(self, robot: SimRobot) -> np.ndarray: ...

    def stage(self, robot: SimRobot) -> int: ...

    def expert(self, robot: SimRobot, rng: np.random.Generator, noise: ExpertNoise | None = None,
               start_command: np.ndarray | None = None) -> ScriptedExpert: ...

    def grasp_targets(self, stage: int) -> list[tuple[str, str]]: ...


class Disturbances(Protocol):
    """Optional: a task whose world perturbs the robot during policy rollouts (envs made with
    `disturb=True`), in ways clean demonstrations never show."""

    def draw_disturbances(self, robot: SimRobot, rng: np.random.Generator) -> None: ...

    def disturb(self, robot: SimRobot) -> str | None: ...  # after each control step; a name when one starts


TASKS = {
    "transfer_cube": TransferCube,
    "insertion": Insertion,
    "pack_cube": PackCube,
    "pack_cube_nolid": PackCubeNoLid,
}


def make_task(name: str) -> Task:
    from robo_rl.errors import ConfigError

    if name not in TASKS:
        raise ConfigError(f"task {name!r} unknown; tasks are {sorted(TASKS)}")
    return TASKS[name]()


__all__ = [
    "Task", "Disturbances", "TASKS", "make_task", "TransferCube", "Insertion", "PackCube", "PackCubeNoLid",
    "TABLE_Z", "body_pos", "body_yaw", "set_free_body", "object_state", "free_body_state", "geom_ids", "touching",
    "finger_geoms", "grasped", "touching_any_finger", "face_aligned", "topdown", "nearer", "pointing_down",
]
