"""Replay a recorded episode in the twin: restore its recorded initial physics state, step its
recorded (executed) actions, and measure how far the twin drifts from the recording: per-joint
divergence of joint positions, object-pose divergence (obs/env_state), and whether the replay
reaches the same success and stage. The twin is deterministic, so a faithful store replays with
zero divergence; anything else means the store, the scene or the physics changed since recording.

Used by `robo-rl replay` and by `robo-rl video` (which re-renders episodes stored without frames).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from robo_rl.data.schema import SEGMENT_KEY, TIMESTAMP_KEY, EpisodeMeta
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.tasks import TASKS, make_task

QPOS_KEY, ENV_STATE_KEY, ACTION_KEY = "obs/qpos", "obs/env_state", "action"


def episode_task(store: EpisodeStore, i: int, meta: EpisodeMeta, override: str | None) -> str:
    task = override or meta.task
    if not task:
        raise ConfigError(f"{store.location}: episode {i} names no task; pass task=" + "|".join(TASKS))
    make_task(task)  # unknown task -> ConfigError naming the known ones
    return task


def init_state(store: EpisodeStore, i: int, meta: EpisodeMeta) -> np.ndarray:
    state = meta.extra.get("init_state") if isinstance(meta.extra, dict) else None
    if state is None or len(state) == 0:
        raise ConfigError(f"{store.location}: episode {i} has no recorded initial state (meta.extra['init_state']), "
                          f"so it cannot be replayed in the twin; only episodes recorded in the twin carry one")
    arr = np.asarray(state, dtype=np.float64)
    if arr.ndim != 1 or not np.isfinite(arr).all():
        raise ConfigError(f"{store.location}: episode {i}: recorded initial state is not a finite vector")
    return arr


@dataclass
class Episode:
    """What a replay needs from the store: task, initial state, actions, and what was recorded."""

    index: int
    meta: EpisodeMeta
    task: str
    init_state: np.ndarray
    action: np.ndarray
    qpos: np.ndarray
    env_state: np.ndarray | None
    timestamp: np.ndarray
    segment: np.ndarray

    @property
    def length(self) -> int:
        return len(self.action)


def load_episode(store: EpisodeStore, i: int, task: str | None = None) -> Episode:
    meta = store.meta(i)
    missing = [k for k in (QPOS_KEY, ACTION_KEY) if k not in store.schema.keys]
    if missing:
        raise ConfigError(f"{store.location}: has no {missing} key(s); replay needs obs/qpos and action "
                          f"(keys are {list(store.schema.keys)})")
    state = init_state(store, i, meta)
    name = episode_task(store, i, meta, task)
    keys = [QPOS_KEY, ACTION_KEY, TIMESTAMP_KEY, SEGMENT_KEY]
    if ENV_STATE_KEY in store.schema.keys:
        keys.append(ENV_STATE_KEY)
    data = store.episode(i, keys)
    return Episode(i, meta, name, state, data[ACTION_KEY], data[QPOS_KEY], data.get(ENV_STATE_KEY),
                   data[TIMESTAMP_KEY], data[SEGMENT_KEY])


def make_env(task: str, cameras: list[str] | None = None, image_size: tuple[int, int] = (240, 320)) -> BimanualEnv:
    if cameras:
        return BimanualEnv(task, obs_mode="state+pixels", cameras=cameras, image_size=tuple(image_size))
    return BimanualEnv(task, obs_mode="state")


def check_fits(env, ep: Episode) -> None:
    """Refuse, before anything runs, an episode whose actions or initial state do not fit the scene."""
    n = env.robot.spec.action_dim
    if ep.action.shape[1:] != (n,) or ep.qpos.shape[1:] != (n,):
        raise ConfigError(f"episode {ep.index}: actions {ep.action.shape} / qpos {ep.qpos.shape} do not fit "
                          f"the twin's {n}-D action space")
    m = env.robot.model
    expected = 1 + m.nq + m.nv + m.na + m.nu
    if ep.init_state.shape != (expected,):
        raise ConfigError(f"episode {ep.index}: recorded initial state has {ep.init_state.shape[0]} values, the "
                          f"{ep.task} scene needs {expected} (recorded in another scene or task?)")


def start_replay(env, ep: Episode) -> None:
    """Put the twin where the episode started: reset (clears solver warm-start, step counters, task
    state) with the recorded seed, then overwrite the physics state with the recorded one."""
    check_fits(env, ep)
    seed = ep.meta.extra.get("seed")
    env.reset(seed=int(seed) if isinstance(seed, int) else None)
    env.set_sim_state(ep.init_state)  # a state of the wrong size is a ConfigError naming both sizes


# ---------------------------------------------------------------------- replay and divergence
@dataclass
class ReplayResult:
    index: int
    task: str
    steps: int
    joint_names: list[str]
    joint_div: np.ndarray  # (T, 14) |replayed - recorded| joint positions, row t = before action t
    object_rows: list[tuple[str, str, float, float]] = field(default_factory=list)  # (object, measure, max, mean)
    object_max_pos: float | None = None
    recorded_success: bool | None = None
    replayed_success: bool = False
    recorded_stage: int | None = None
    replayed_stage: int = 0
    stage_names: tuple[str, ...] = ()

    @property
    def max_joint(self) -> float:
        return float(self.joint_div.max())

    @property
    def mean_joint(self) -> float:
        return float(self.joint_div.mean())

    @property
    def outcome_matches(self) -> bool:
        ok = self.recorded_success is None or self.recorded_success == self.replayed_success
        return ok and (self.recorded_stage is None or self.recorded_stage == self.replayed_stage)


def replay_episode(env, ep: Episode, bar: Any = None) -> ReplayResult:
    """Restore, step every recorded action, compare the observation after action t with the recorded
    observation of step t+1 (and the restored state with step 0)."""
    start_replay(env, ep)
    T = ep.length
    robot, task = env.robot, env.task
    qpos = np.empty_like(ep.qpos)
    qpos[0] = robot.joint_positions()
    env_state = None
    if ep.env_state is not None:
        env_state = np.empty_like(ep.env_state)
        env_state[0] = task.state(robot)
    info: dict[str, Any] = {"success": False, "max_stage": 0}
    for t in range(T):
        obs, _, _, _, info = env.step(ep.action[t])
        if t + 1 < T:
            qpos[t + 1] = obs["qpos"]
            if env_state is not None:
                env_state[t + 1] = obs["env_state"]
        if bar is not None:
            bar.update()
    joint_div = np.abs(qpos.astype(np.float64) - ep.qpos.astype(np.float64))
    res = ReplayResult(
        index=ep.index, task=ep.task, steps=T, joint_names=list(robot.spec.joint_names), joint_div=joint_div,
        recorded_success=ep.meta.success, replayed_success=bool(info["success"]),
        recorded_stage=_int_or_none(ep.meta.extra.get("max_stage")), replayed_stage=int(info["max_stage"]),
        stage_names=tuple(task.stage_names),
    )
    if env_state is not None:
        res.object_rows, res.object_max_pos = object_divergence(ep.task, env_state, ep.env_state)
    return res


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def object_divergence(task: str, replayed: np.ndarray,
                      recorded: np.ndarray) -> tuple[list[tuple[str, str, float, float]], float | None]:
    """Per object: position error (m, Euclidean) and orientation error (rad, angle of the relative
    rotation, sign of the quaternion ignored); scalar joints: |difference|."""
    a, b = replayed.astype(np.float64), recorded.astype(np.float64)
    k = a.shape[1]
    t = make_task(task)
    bodies, scalars = t.state_bodies, t.state_joints
    if 7 * len(bodies) + len(scalars) != k:  # unknown task or another layout: generic names
        bodies, scalars = tuple(f"object {j}" for j in range(k // 7)), tuple(f"env_state[{j}]" for j in range(7 * (k // 7), k))
    rows, pos_max = [], None
    for j, name in enumerate(bodies):
        p = np.linalg.norm(a[:, 7 * j:7 * j + 3] - b[:, 7 * j:7 * j + 3], axis=1)
        ang = quat_angle(a[:, 7 * j + 3:7 * j + 7], b[:, 7 * j + 3:7 * j + 7])
        rows.append((name, "position (m)", float(p.max()), float(p.mean())))
        rows.append((name, "orientation (rad)", float(ang.max()), float(ang.mean())))
        pos_max = float(p.max()) if pos_max is None else max(pos_max, float(p.max()))
    for j, name in enumerate(scalars):
        d = np.abs(a[:, 7 * len(bodies) + j] - b[:, 7 * len(bodies) + j])
        rows.append((name, "joint", float(d.max()), float(d.mean())))
    return rows, pos_max


def quat_angle(q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """Rotation angle between unit quaternions (w, x, y, z), rows of q1 and q2; robust near zero."""
    q1 = q1 / np.linalg.norm(q1, axis=1, keepdims=True)
    q2 = q2 / np.linalg.norm(q2, axis=1, keepdims=True)
    w1, v1 = q1[:, :1], q1[:, 1:]
    w2, v2 = q2[:, :1], q2[:, 1:]
    # relative rotation conj(q1) * q2
    w = w1 * w2 + np.sum(v1 * v2, axis=1, keepdims=True)
    v = w1 * v2 - w2 * v1 - np.cross(v1, v2)
    return 2 * np.arctan2(np.linalg.norm(v, axis=1), np.abs(w[:, 0]))


def rendered_frames(env, ep, cameras: list[str], divergence: list[float]) -> Iterator[list[np.ndarray]]:
    """Frame t is the scene before action t, as a recorded frame is. Appends, per step, the largest
    joint divergence from the recording to `divergence` (a check that the re-render is faithful)."""
    start_replay(env, ep)
    images = env.robot.render()
    divergence.append(float(np.abs(env.robot.joint_positions() - ep.qpos[0]).max()))
    for t in range(ep.length):
        yield [images[c] for c in cameras]
        if t + 1 < ep.length:
            obs, *_ = env.step(ep.action[t])
            images = obs["images"]
            divergence.append(float(np.abs(obs["qpos"] - ep.qpos[t + 1]).max()))
