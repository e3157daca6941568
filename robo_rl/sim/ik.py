"""Damped least-squares inverse kinematics for one arm of the twin, on a scratch MjData so the
simulation itself is never disturbed. Used by the scripted experts, which plan in end-effector
space and send joint positions, as a teleoperator's leader arm would."""

from __future__ import annotations

import mujoco
import numpy as np


def rotation(x_axis: np.ndarray, y_axis: np.ndarray) -> np.ndarray:
    """A rotation matrix whose columns are the gripper's x (along the fingers) and y (the
    direction the fingers slide) axes, given in world coordinates; z completes the frame."""
    x = np.asarray(x_axis, dtype=np.float64)
    x = x / np.linalg.norm(x)
    y = np.asarray(y_axis, dtype=np.float64)
    y = y - x * (x @ y)
    y = y / np.linalg.norm(y)
    return np.stack([x, y, np.cross(x, y)], axis=1)


class ArmIK:
    """IK from a site's target pose to the arm's 6 joint positions."""

    def __init__(self, model: mujoco.MjModel, prefix: str = "", site: str = "ee", damping: float = 1e-3,
                 posture: float = 1e-5, roll_posture: float = 1e-2, nominal: np.ndarray | None = None,
                 joints: list[str] | None = None, end_effector: str | None = None):
        """The twin's arm `prefix` (its joints <prefix>waist ... and site <prefix>ee), or any model's
        arm: `joints` (6 names, action order) and `end_effector` (a site, or a body: a URDF has
        no sites)."""
        self.model = model
        self.scratch = mujoco.MjData(model)
        names = joints or [prefix + n for n in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")]
        joints = [model.joint(n) for n in names]
        self.qadr = np.array([j.qposadr[0] for j in joints])
        self.dadr = np.array([j.dofadr[0] for j in joints])
        self.lower = np.array([j.range[0] for j in joints])
        self.upper = np.array([j.range[1] for j in joints])
        ee = end_effector or prefix + site
        self.is_site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, ee) >= 0
        self.site = model.site(ee).id if self.is_site else model.body(ee).id
        self.damping = damping
        # A weak pull toward a nominal posture keeps the solver on one branch (roll joints near 0)
        # instead of wandering to an equivalent pose at a joint limit and jumping back.
        # The forearm roll gets a much stronger pull: where the wrist passes through straight
        # (wrist angle 0) roll and wrist rotate become interchangeable, and a weak pull let the
        # solver spin both by +-pi in either direction at random, making the demos bimodal.
        self.posture = np.full(6, posture)
        self.posture[3] = roll_posture
        self.nominal = np.array([0.0, -0.5, 0.8, 0.0, 0.5, 0.0]) if nominal is None else np.asarray(nominal)
        self._jp = np.zeros((3, model.nv))
        self._jr = np.zeros((3, model.nv))

    def solve(self, qpos_full: np.ndarray, q_arm: np.ndarray, pos: np.ndarray, rot: np.ndarray | None,
              iters: int = 12, rot_weight: float = 0.3) -> tuple[np.ndarray, float]:
        """Joint positions reaching `pos` (and `rot` if given), starting from `q_arm`.
        `qpos_full` supplies the rest of the scene. Returns (q_arm, position error in metres)."""
        d = self.scratch
        d.qpos[:] = qpos_full
        q = np.array(q_arm, dtype=np.float64)
        err_pos = np.inf
        for _ in range(iters):
            d.qpos[self.qadr] = q
            mujoco.mj_kinematics(self.model, d)
            mujoco.mj_comPos(self.model, d)
            cur_p, cur_r = self._frame(d)
            e_p = pos - cur_p
            err_pos = float(np.linalg.norm(e_p))
            if self.is_site:
                mujoco.mj_jacSite(self.model, d, self._jp, self._jr, self.site)
            else:
                mujoco.mj_jacBody(self.model, d, self._jp, self._jr, self.site)
            jp = self._jp[:, self.dadr]
            if rot is not None:
                # orientation error as the axis-angle of rot @ cur_r.T (world frame)
                r_err = rot @ cur_r.T
                angle_axis = 0.5 * np.array([r_err[2, 1] - r_err[1, 2], r_err[0, 2] - r_err[2, 0], r_err[1, 0] - r_err[0, 1]])
                jac = np.vstack([jp, rot_weight * self._jr[:, self.dadr]])
                err = np.concatenate([e_p, rot_weight * angle_axis])
            else:
                jac, err = jp, e_p
            # argmin |J dq - e|^2 + damping |dq|^2 + posture |q + dq - nominal|^2
            lhs = jac.T @ jac + np.diag(self.damping + self.posture)
            dq = np.linalg.solve(lhs, jac.T @ err + self.posture * (self.nominal - q))
            q = np.clip(q + dq, self.lower, self.upper)
            if err_pos < 1e-4 and (rot is None or np.linalg.norm(err[3:]) < 1e-3):
                break
        return q, err_pos

    def _frame(self, d: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
        if self.is_site:
            return d.site_xpos[self.site], d.site_xmat[self.site].reshape(3, 3)
        return d.xpos[self.site], d.xmat[self.site].reshape(3, 3)

    def site_pose(self, qpos_full: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The end effector's (position, rotation) with the scene at `qpos_full`."""
        d = self.scratch
        d.qpos[:] = qpos_full
        mujoco.mj_kinematics(self.model, d)
        pos, rot = self._frame(d)
        return pos.copy(), rot.copy()
