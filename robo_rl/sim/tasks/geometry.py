"""Helpers on the twin's scene that the tasks share: where bodies are, setting free bodies,
contacts and grasps, and the gripper rotations the scripted experts aim for."""

from __future__ import annotations

import mujoco
import numpy as np

from robo_rl.sim.expert import ScriptedExpert
from robo_rl.sim.ik import rotation
from robo_rl.sim.robot import SimRobot

TABLE_Z = 0.0


def body_pos(robot: SimRobot, name: str) -> np.ndarray:
    return robot.data.body(name).xpos.copy()


def body_yaw(robot: SimRobot, name: str) -> float:
    m = robot.data.body(name).xmat.reshape(3, 3)
    return float(np.arctan2(m[1, 0], m[0, 0]))


def set_free_body(robot: SimRobot, joint: str, pos: np.ndarray, yaw: float) -> None:
    adr = robot.model.joint(joint).qposadr[0]
    robot.data.qpos[adr:adr + 3] = pos
    robot.data.qpos[adr + 3:adr + 7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
    dadr = robot.model.joint(joint).dofadr[0]
    robot.data.qvel[dadr:dadr + 6] = 0
    mujoco.mj_forward(robot.model, robot.data)


def object_state(robot: SimRobot, bodies: tuple[str, ...], joints: tuple[str, ...] = ()) -> np.ndarray:
    """A task's privileged state: each free body as (x, y, z, qw, qx, qy, qz), then scalar joints."""
    parts = [free_body_state(robot, b) for b in bodies] + [robot.data.joint(j).qpos.astype(np.float32) for j in joints]
    return np.concatenate(parts)


def free_body_state(robot: SimRobot, joint: str) -> np.ndarray:
    adr = robot.model.joint(joint).qposadr[0]
    return robot.data.qpos[adr:adr + 7].astype(np.float32)


def geom_ids(robot: SimRobot, name: str) -> frozenset[int]:
    """The geom called `name`, or else every geom of the body called `name`."""
    cache = robot.__dict__.setdefault("_geom_ids", {})  # per robot: the lookup by name is slow when it misses
    if name not in cache:
        m = robot.model
        try:
            cache[name] = frozenset({m.geom(name).id})
        except KeyError:
            cache[name] = frozenset(int(i) for i in np.flatnonzero(m.geom_bodyid == m.body(name).id))
    return cache[name]


def touching(robot: SimRobot, geom: str, others: set[int]) -> bool:
    """A contact between `geom` (a geom, or any geom of a body of that name) and one of `others`."""
    ids = geom_ids(robot, geom)
    d = robot.data
    for i in range(d.ncon):
        c = d.contact[i]
        if (c.geom1 in ids and c.geom2 in others) or (c.geom2 in ids and c.geom1 in others):
            return True
    return False


def finger_geoms(robot: SimRobot, arm: str) -> tuple[set[int], set[int]]:
    """(finger pad geoms, mirrored pad geoms) of one arm."""
    m = robot.model
    a = {m.body_geomadr[m.body(f"{arm}_finger").id]}
    b = {m.body_geomadr[m.body(f"{arm}_finger_mirror").id]}
    return a, b


def grasped(robot: SimRobot, geom: str, arm: str) -> bool:
    """Both fingers of `arm` touch `geom` (a geom, or a body: any of its geoms)."""
    a, b = finger_geoms(robot, arm)
    return touching(robot, geom, a) and touching(robot, geom, b)


def touching_any_finger(robot: SimRobot, geom: str, arm: str) -> bool:
    a, b = finger_geoms(robot, arm)
    return touching(robot, geom, a | b)


def face_aligned(robot: SimRobot, body: str, approach: np.ndarray, squeeze_near: np.ndarray) -> np.ndarray:
    """Gripper rotation approaching along `approach` whose fingers squeeze the body's pair of
    faces whose normal is nearest `squeeze_near`: follows an object that tilted in a grasp."""
    m = robot.data.body(body).xmat.reshape(3, 3)
    normals = [m[:, i] * np.sign(m[:, i] @ squeeze_near or 1.0) for i in range(3)]
    y = max(normals, key=lambda n: float(n @ squeeze_near))
    return rotation(np.asarray(approach, dtype=np.float64) - y * (y @ approach), y)


def topdown(yaw: float, current_y: np.ndarray) -> np.ndarray:
    """Top-down grasp rotation for an object of this yaw: fingers slide across two opposite
    faces, choosing among the 4 equivalent ways the one nearest the gripper's current y axis."""
    cands = [np.array([np.cos(yaw + k * np.pi / 2), np.sin(yaw + k * np.pi / 2), 0.0]) for k in range(4)]
    y = max(cands, key=lambda c: float(c @ current_y))
    return rotation([0, 0, -1], y)


def nearer(direction, current: np.ndarray) -> np.ndarray:
    """`direction` or its opposite, whichever is nearer `current`: for a symmetric gripper both
    finger directions are equivalent, and taking the nearer one makes the wrist turn the short
    way, never half a turn that could go either way (which would make the demos bimodal)."""
    d = np.asarray(direction, dtype=np.float64)
    return d if d @ current >= 0 else -d


def pointing_down(robot: SimRobot, arm: str) -> np.ndarray:
    """Fingers down, sliding along world y in the direction nearer the hand's current one."""
    return rotation([0, 0, -1], nearer([0, 1, 0], ScriptedExpert.site_pose(robot, arm)[1][:, 1]))
