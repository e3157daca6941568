"""SimRobot: the MuJoCo twin behind the Robot protocol, so everything that runs on the real arms
runs here unchanged. Physics at 500 Hz (sim/aloha.xml), commands at the spec's rate (50 Hz)."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Sequence

import mujoco
import numpy as np

from robo_rl.assets import asset_dir
from robo_rl.data.codecs import resize_rgb
from robo_rl.errors import INSTALL_GL, ConfigError, RoboRLError
from robo_rl.hardware.robot import Observation, RobotSpec
from robo_rl.sim.room import Room, RoomControl, add_distractor

SIM_DIR = asset_dir("sim")
# The twin's camera frames are rendered at this many times their size and area-averaged down, as
# a real sensor integrates light over each pixel (1: point samples, where a small object moves in
# whole-pixel jumps, about 1 cm of table per pixel on the top camera at 96x96). 1 stays the
# default: 4x sharpened a probe's reading of the cube's yaw but not a camera policy's success, and
# renders 4x slower (docs/history.md, the camera diagnosis).
RENDER_SCALE = 1


def new_renderer(model: mujoco.MjModel, height: int, width: int) -> mujoco.Renderer:
    """mujoco.Renderer, or a one-line error saying what to install when this machine cannot
    render (no display and no EGL or OSMesa: `robo-rl` then sets MUJOCO_GL=disable)."""
    try:
        return mujoco.Renderer(model, height, width)
    except Exception as e:  # noqa: BLE001 - GL set-up fails in many ways (missing library, no device, no display)
        raise RoboRLError(f"cannot render offscreen with MUJOCO_GL={os.environ.get('MUJOCO_GL', '(unset)')} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): {INSTALL_GL}") from None


class SimRobot:
    """Implements robo_rl.hardware.robot.Robot. `model` and `data` are public for tasks and the
    simulated operator, which need privileged state; control code should use only the protocol."""

    def __init__(
        self,
        scene: str | Path = "aloha.xml",
        robot: str | Path = "aloha",
        cameras: Sequence[str] | None = None,
        image_size: tuple[int, int] = (240, 320),
        realtime: bool = False,
        render_scale: int | None = None,
        room: Room | None = None,
        with_distractor: bool = False,
    ):
        """`room`: how the room looks (robo_rl/sim/room.py; default: as the scene draws it).
        `with_distractor`: the scene gets the distractor's body even if `room` has none, for rooms
        set later (randomised rendering); it never collides, so the physics is the same."""
        path = Path(scene)
        if not path.is_absolute():
            path = SIM_DIR / path
        if not path.is_file():
            raise ConfigError(f"scene {path} not found (scenes live in sim/)")
        if with_distractor or (room is not None and room.distractor):
            spec = mujoco.MjSpec.from_file(str(path))
            add_distractor(spec)
            self.model = spec.compile()
        else:
            self.model = mujoco.MjModel.from_xml_path(str(path))
        self.data = mujoco.MjData(self.model)
        self.spec = RobotSpec.from_yaml(robot)
        dt = self.model.opt.timestep
        self.substeps = int(round(1.0 / (self.spec.control_hz * dt)))
        if abs(self.substeps * dt * self.spec.control_hz - 1.0) > 1e-6:
            raise ConfigError(f"{path}: timestep {dt} does not divide the control period 1/{self.spec.control_hz}")
        # Where each action dimension lives in qpos / qvel / ctrl. A gripper's actuator (named as
        # the gripper) drives its finger joint, whose range is the finger travel closed..open: the
        # twin describes its own fingers, whatever units the robot description puts on the wire.
        try:
            self._act = np.array([self.model.actuator(n).id for n in self.spec.joint_names])
            joint_ids = [int(self.model.actuator_trnid[a, 0]) if i in self.spec.grippers else self.model.joint(n).id
                         for i, (a, n) in enumerate(zip(self._act, self.spec.joint_names))]
        except KeyError as e:
            raise ConfigError(f"{path}: has no joint or actuator {e} that {self.spec.name}.yaml names") from None
        self._qadr = self.model.jnt_qposadr[joint_ids].copy()
        self._vadr = self.model.jnt_dofadr[joint_ids].copy()
        self._grip_idx = np.array(sorted(self.spec.grippers), dtype=int)
        self._finger = {i: mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, joint_ids[i]) for i in self._grip_idx}
        travel = self.model.jnt_range[[joint_ids[i] for i in self._grip_idx]].reshape(-1, 2)
        self._grip_closed, self._grip_span = travel[:, 0].copy(), travel[:, 1] - travel[:, 0]
        self.cameras = list(cameras) if cameras is not None else [c.name for c in self.spec.cameras]
        for cam in self.cameras:
            if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, cam) < 0:
                known = [self.model.camera(i).name for i in range(self.model.ncam)]
                raise ConfigError(f"{path}: no camera '{cam}'; its cameras are {known}")
        self.image_size = tuple(image_size)
        self.render_scale = self._fit_scale(RENDER_SCALE if render_scale is None else int(render_scale))
        self.realtime = realtime
        self._renderer: mujoco.Renderer | None = None
        self._next_tick: float | None = None
        self.rooms = RoomControl(self.model)
        self.room = room or Room()
        self.rooms.apply(self.room)
        self.reset()

    # ------------------------------------------------------------------ Robot protocol
    def connect(self) -> None:
        if self.cameras and self._renderer is None:
            h, w = self.image_size
            self._renderer = new_renderer(self.model, h * self.render_scale, w * self.render_scale)

    def observe(self) -> Observation:
        return Observation(qpos=self.joint_positions(), qvel=self.joint_velocities(), images=self.render(),
                           timestamp=float(self.data.time))

    def act(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (self.spec.action_dim,):
            raise RoboRLError(f"SimRobot.act: action has shape {a.shape}, expected ({self.spec.action_dim},)")
        if not np.isfinite(a).all():
            raise RoboRLError(f"SimRobot.act: action holds NaN/inf at index {int(np.argmax(~np.isfinite(a)))}")
        executed = np.clip(a, self.spec.lower, self.spec.upper)
        self.data.ctrl[self._act] = self._to_ctrl(executed)
        mujoco.mj_step(self.model, self.data, nstep=self.substeps)
        if self.realtime:
            self._pace()
        return executed.astype(np.float32)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ------------------------------------------------------------------ sim-only
    def physics_copy(self) -> "SimRobot":
        """A robot on a copy of this one's physics state (the same model): stepping it leaves this
        one as it is. No renderer, no pacing: for looking ahead, not for showing."""
        other = copy.copy(self)
        other.data = mujoco.MjData(self.model)
        mujoco.mj_copyData(other.data, self.model, self.data)
        other._renderer, other.realtime, other._next_tick = None, False, None
        return other

    def reset(self, qpos: np.ndarray | None = None) -> None:
        """Arms to `qpos` (action units; default the spec's home pose), everything else to the
        scene's initial state. Tasks place their objects after this."""
        mujoco.mj_resetData(self.model, self.data)
        target = self.spec.home if qpos is None else np.asarray(qpos, dtype=np.float64)
        self.set_joint_positions(target)
        self._next_tick = None

    def set_room(self, room: Room, rng: np.random.Generator | None = None) -> None:
        """Render from now on in `room`; its distractor, if any, is placed with `rng` away from
        the task's objects (call it after the task placed them)."""
        self.rooms.apply(room, self.data, rng)
        self.room = room
        # positions only (the moved mocap body, cameras and lights): the dynamics' state is untouched
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)

    def set_joint_positions(self, qpos: np.ndarray) -> None:
        """Teleport the arms (and their commands) to `qpos`, action units."""
        ctrl = self._to_ctrl(np.asarray(qpos, dtype=np.float64))
        self.data.qpos[self._qadr] = ctrl
        for i in self._grip_idx:  # the mirrored finger follows its equality constraint
            mirror = self._finger[i] + "_mirror"
            jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, mirror)
            if jid >= 0:
                self.data.qpos[self.model.jnt_qposadr[jid]] = ctrl[i]
        self.data.qvel[:] = 0
        self.data.ctrl[self._act] = ctrl
        mujoco.mj_forward(self.model, self.data)

    def render(self) -> dict[str, np.ndarray]:
        if not self.cameras:
            return {}
        self.connect()
        out = {}
        for cam in self.cameras:
            self._renderer.update_scene(self.data, cam)
            frame = self._renderer.render()
            out[cam] = frame if self.render_scale == 1 else resize_rgb(frame, self.image_size)
        if self.room.exposure != 1.0:  # the camera's gain, after the scene's light: the pixel times it, clipped at white
            for cam, frame in out.items():
                out[cam] = np.clip(frame.astype(np.float32) * self.room.exposure + 0.5, 0, 255).astype(np.uint8)
        return out

    def _fit_scale(self, scale: int) -> int:
        """The largest render scale up to `scale` whose frames fit the scene's offscreen buffer."""
        h, w = self.image_size
        limit_h, limit_w = int(self.model.vis.global_.offheight), int(self.model.vis.global_.offwidth)
        while scale > 1 and (h * scale > limit_h or w * scale > limit_w):
            scale -= 1
        return max(1, scale)

    def joint_positions(self) -> np.ndarray:
        """Joint positions in action units (grippers normalised), without rendering."""
        q = self.data.qpos[self._qadr].astype(np.float32)
        q[self._grip_idx] = (q[self._grip_idx] - self._grip_closed) / self._grip_span
        return q

    def joint_velocities(self) -> np.ndarray:
        """Joint velocities in action units per second (grippers normalised)."""
        v = self.data.qvel[self._vadr].astype(np.float32)
        v[self._grip_idx] /= self._grip_span
        return v

    @property
    def time(self) -> float:
        return float(self.data.time)

    def _to_ctrl(self, action: np.ndarray) -> np.ndarray:
        ctrl = np.array(action, dtype=np.float64)
        ctrl[self._grip_idx] = self._grip_closed + ctrl[self._grip_idx] * self._grip_span
        return ctrl

    def _pace(self) -> None:
        period = 1.0 / self.spec.control_hz
        now = time.perf_counter()
        self._next_tick = (self._next_tick or now) + period
        if self._next_tick > now:
            time.sleep(self._next_tick - now)
        else:
            self._next_tick = now
