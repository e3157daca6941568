"""Gymnasium envs of the twin's tasks: 14-D absolute joint-position actions at 50 Hz.

Observation modes (a Dict space):
    state         qpos (14), qvel (14), env_state (the task's object poses: privileged)
    pixels        qpos (14), images {camera: uint8 HxWx3}
    state+pixels  all of the above
`info` carries `stage` (sub-task index reached), `success` and `executed_action`.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Observation
from robo_rl.hardware.robot import Outcome
from robo_rl.sim.expert import ExpertNoise, ScriptedExpert
from robo_rl.sim.robot import SimRobot
from robo_rl.sim.room import Room, RoomRandomizer, room_rng
from robo_rl.sim.tasks import TASKS, make_task

OBS_MODES = ("state", "pixels", "state+pixels")


class BimanualEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(
        self,
        task: str = "transfer_cube",
        obs_mode: str = "state",
        cameras: Sequence[str] = ("top",),
        image_size: tuple[int, int] = (240, 320),
        render_mode: str | None = None,
        max_steps: int | None = None,
        disturb: bool = False,
        room: Room | None = None,
        randomize: RoomRandomizer | None = None,
    ):
        """`disturb`: the task's disturbances happen (PackCube: the carried cube may slip). On for
        policy rollouts (eval, RaC); off for recording demos, which stay clean. `room`: how the
        room looks (a shift of robo_rl/sim/room.py); `randomize`: a new room drawn at every reset
        instead. Neither changes the physics, and the room's draws never move the task's."""
        if obs_mode not in OBS_MODES:
            raise ConfigError(f"obs_mode {obs_mode!r} unknown; choose one of {OBS_MODES}")
        self.task = make_task(task)
        self.obs_mode = obs_mode
        pixels = "pixels" in obs_mode
        render_cams = list(cameras) if pixels else (["top"] if render_mode == "rgb_array" else [])
        self.room, self.randomize = room or Room(), randomize
        self.robot = SimRobot(self.task.scene, cameras=render_cams, image_size=image_size, room=self.room,
                              with_distractor=randomize is not None and randomize.distractor_p > 0)
        self._room_stream = room_rng(None)
        self.render_mode = render_mode
        self.max_steps = max_steps or self.task.max_steps
        spec = self.robot.spec
        n = spec.action_dim
        self.action_space = spaces.Box(spec.lower, spec.upper, dtype=np.float32)
        obs: dict[str, spaces.Space] = {"qpos": spaces.Box(-np.inf, np.inf, (n,), np.float32)}
        if "state" in obs_mode:
            k = len(self.task.state(self.robot))
            obs["qvel"] = spaces.Box(-np.inf, np.inf, (n,), np.float32)
            obs["env_state"] = spaces.Box(-np.inf, np.inf, (k,), np.float32)
        if pixels:
            h, w = image_size
            obs["images"] = spaces.Dict({c: spaces.Box(0, 255, (h, w, 3), np.uint8) for c in cameras})
        self.observation_space = spaces.Dict(obs)
        self.pixels = pixels  # cameras are observations (else only render() draws)
        self.disturb = disturb and hasattr(self.task, "disturb")
        self._steps = 0
        self._max_stage = 0

    def _obs(self) -> dict[str, Any]:
        r = self.robot
        out: dict[str, Any] = {"qpos": r.joint_positions()}
        if "state" in self.obs_mode:
            out["qvel"] = r.joint_velocities()
            out["env_state"] = self.task.state(r)
        if self.pixels:
            out["images"] = r.render()
        return out

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.robot.reset()
        self.task.reset(self.robot, self.np_random)
        if self.disturb:
            self.task.draw_disturbances(self.robot, self.np_random)
        if seed is not None:
            self._room_stream = room_rng(seed)
        if self.randomize is not None:
            self.room = self.randomize.draw(self._room_stream, self.robot.cameras)
        if self.randomize is not None or self.room.distractor:
            self.robot.set_room(self.room, self._room_stream)
        self._steps = 0
        self._max_stage = 0
        return self._obs(), {"stage": 0, "success": False}

    def step(self, action: np.ndarray):
        executed = self.robot.act(action)
        disturbance = self.task.disturb(self.robot) if self.disturb else None
        self._steps += 1
        stage = self.task.stage(self.robot)
        self._max_stage = max(self._max_stage, stage)
        success = stage == len(self.task.stage_names) - 1
        info = {"stage": stage, "max_stage": self._max_stage, "success": success, "executed_action": executed,
                "disturbance": disturbance}
        return self._obs(), float(success), success, self._steps >= self.max_steps, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frames = self.robot.render()
        return frames.get("top", next(iter(frames.values()), None))

    def expert(self, noise: ExpertNoise | None = None, start_command: np.ndarray | None = None) -> ScriptedExpert:
        """The task's scripted expert, planned from the current state (continuing from
        `start_command`, the last command sent, when it takes over from someone else)."""
        return self.task.expert(self.robot, self.np_random, noise, start_command)

    def sim_state(self) -> np.ndarray:
        """Full physics state (for replay from a recorded initial state)."""
        d = self.robot.data
        return np.concatenate([[d.time], d.qpos, d.qvel, d.act, d.ctrl]).astype(np.float64)

    def set_sim_state(self, state: np.ndarray) -> None:
        import mujoco

        m, d = self.robot.model, self.robot.data
        state = np.asarray(state, dtype=np.float64)
        expected = 1 + m.nq + m.nv + m.na + m.nu
        if state.shape != (expected,):
            raise ConfigError(f"sim state has {state.shape[0]} values, this scene needs {expected}")
        i = 1
        d.time = state[0]
        for arr, n in ((d.qpos, m.nq), (d.qvel, m.nv), (d.act, m.na), (d.ctrl, m.nu)):
            arr[:] = state[i:i + n]
            i += n
        mujoco.mj_forward(m, d)

    def close(self) -> None:
        self.robot.close()


TASK_IDS = {name: f"robo_rl/{cls.__name__}-v0" for name, cls in TASKS.items()}  # gymnasium ids, from the one registry


def register_envs() -> None:
    for task, env_id in TASK_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="robo_rl.sim.envs:BimanualEnv", kwargs={"task": task})


register_envs()


class TaskTwin:
    """The twin of a task as a Robot that runs episodes: what the episode loop
    (robo_rl/runtime/episodes.py) steps for evaluation, intervention collection and critic
    rollouts, what `robo-rl deploy robot=sim` / `record robot=sim` command in real time, and the
    task `robo-rl sim-bridge` serves. `observe()` adds the task's object state (`obs/env_state`,
    which only the twin has) and renders the cameras the env observes; `act()` steps the physics
    with the task's disturbances when the env has them on (as evaluation does) and keeps the
    stage; `outcome()` says where the episode stands (success, the time limit)."""

    def __init__(self, env: BimanualEnv):
        self.env, self.spec = env, env.robot.spec
        self.final_stage = len(env.task.stage_names) - 1
        self._new_episode()

    def _new_episode(self) -> None:
        self.stage = self.max_stage = self.steps = 0
        self.disturbed = False

    def connect(self) -> None:
        self.env.robot.connect()

    def reset(self, seed: int) -> None:
        """A new scene from `seed` (a new episode): the stage count starts again."""
        self.env.reset(seed=seed)
        self._new_episode()

    def observe(self) -> Observation:
        r = self.env.robot
        return Observation(qpos=r.joint_positions(), qvel=r.joint_velocities(),
                           images=r.render() if self.env.pixels else {}, timestamp=r.time,
                           extra={"obs/env_state": self.env.task.state(r)})

    def act(self, action: np.ndarray) -> np.ndarray:
        env = self.env
        executed = env.robot.act(action)
        if env.disturb and env.task.disturb(env.robot) is not None:
            self.disturbed = True
        self.steps += 1
        self.stage = env.task.stage(env.robot)
        self.max_stage = max(self.max_stage, self.stage)
        return executed

    def outcome(self) -> Outcome:
        return Outcome(self.stage, self.max_stage, self.stage == self.final_stage, self.steps >= self.env.max_steps,
                       self.disturbed)

    @property
    def success(self) -> bool:
        return self.max_stage == self.final_stage

    def sim_state(self) -> np.ndarray:
        return self.env.sim_state()

    def close(self) -> None:
        self.env.close()
