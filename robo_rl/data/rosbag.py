"""rosbag2 (MCAP or sqlite3) -> EpisodeStore, with the `rosbags` library (no ROS install).

What a bag holds: sensor_msgs/JointState on one topic per arm, and the commands that were sent
(trajectory_msgs/JointTrajectory: the first point; std_msgs/Float64MultiArray: the data) on one
topic per arm. Messages arrive at their own rates and times; the store is at one fps. So each
output step k at t0 + k / fps takes:
  - obs/qpos, obs/qvel: each joint linearly interpolated between the joint states around it;
  - action: the newest command at or before it (a command holds until the next one), or, for a
    bag without commands (`action_from=next_qpos`), the next step's joint positions.
Steps start once every arm has a joint state (and a command) and end at the last message.
Grippers travel as finger positions; `grippers` maps them back to 0..1.

A bag is one episode; `split_topic` (any message type, e.g. std_msgs/Bool from a record key)
starts a new episode at each of its messages. The store is written to a temporary folder and
renamed only when every episode is in, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class ArmMapping:
    """One arm's topics and its joints' names on the wire, in action order."""

    joint_states: str
    command: str | None
    joints: tuple[str, ...]
    indices: tuple[int, ...]   # where these joints sit in the action vector


@dataclass
class BagImport:
    arms: Sequence[ArmMapping]
    action_dim: int
    fps: float = 50.0
    grippers: dict[int, tuple[float, float]] = field(default_factory=dict)  # index -> (closed, open) finger position
    action_from: str = "command"   # command | next_qpos
    split_topic: str | None = None
    task: str = ""
    robot: str = "unknown"


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.LATEST)


def read_bag(bag: str | Path, cfg: BagImport) -> list[dict[str, np.ndarray]]:
    """The bag's episodes, each {obs/qpos, obs/qvel, action, timestamp}, resampled to cfg.fps."""
    from rosbags.rosbag2 import Reader

    path = Path(bag)
    if not path.exists():
        raise ConfigError(f"bag {path} does not exist")
    store = _typestore()
    states: dict[str, list[tuple[float, dict[str, float], dict[str, float]]]] = {a.joint_states: [] for a in cfg.arms}
    commands: dict[str, list[tuple[float, list[float]]]] = {a.command: [] for a in cfg.arms if a.command}
    splits: list[float] = []
    try:
        with Reader(path) as reader:
            topics = {c.topic: c for c in reader.connections}
            required = set(states) | ({cfg.split_topic} if cfg.split_topic else set())
            if cfg.action_from == "command":
                required |= set(commands)
            missing = sorted(required - set(topics))
            if missing:
                raise ConfigError(f"{path}: no topic {', '.join(missing)}; the bag has {sorted(topics)}")
            conns = [topics[t] for t in required | (set(commands) & set(topics))]
            for conn, stamp_ns, raw in reader.messages(connections=conns):
                t = stamp_ns * 1e-9
                if conn.topic == cfg.split_topic:
                    splits.append(t)
                    continue
                msg = store.deserialize_cdr(raw, conn.msgtype)
                if conn.topic in states:
                    names = list(msg.name)
                    vel = list(msg.velocity) if len(msg.velocity) == len(names) else [0.0] * len(names)
                    states[conn.topic].append((t, dict(zip(names, map(float, msg.position))), dict(zip(names, map(float, vel)))))
                elif conn.msgtype == "trajectory_msgs/msg/JointTrajectory":
                    if len(msg.points):
                        by_name = dict(zip(msg.joint_names, map(float, msg.points[0].positions)))
                        arm = next(a for a in cfg.arms if a.command == conn.topic)
                        commands[conn.topic].append((t, [by_name.get(j, np.nan) for j in arm.joints]))
                else:
                    commands[conn.topic].append((t, [float(x) for x in msg.data]))
    except ConfigError:
        raise
    except Exception as e:  # rosbags' own errors: not a bag, unknown storage, broken file
        raise ConfigError(f"{path}: cannot read as a rosbag2 ({type(e).__name__}: {e})") from None
    return _resample(path, cfg, states, commands, splits)


def _resample(path: Path, cfg: BagImport, states, commands, splits) -> list[dict[str, np.ndarray]]:
    use_commands = cfg.action_from == "command"
    for arm in cfg.arms:
        if not states[arm.joint_states]:
            raise ConfigError(f"{path}: no messages on {arm.joint_states}")
        if use_commands and not commands.get(arm.command):
            raise ConfigError(f"{path}: no commands on {arm.command}; pass action_from=next_qpos for a bag without them")
    starts = [states[a.joint_states][0][0] for a in cfg.arms]
    if use_commands:
        starts += [commands[a.command][0][0] for a in cfg.arms]
    t0 = max(starts)
    t1 = max(max(s[-1][0] for s in states.values()), max((c[-1][0] for c in commands.values() if c), default=0.0))
    times = t0 + np.arange(int(np.floor((t1 - t0) * cfg.fps)) + 1) / cfg.fps
    qpos = np.zeros((len(times), cfg.action_dim))
    qvel = np.zeros_like(qpos)
    action = np.zeros_like(qpos)
    for arm in cfg.arms:
        msgs = states[arm.joint_states]
        ts = np.array([m[0] for m in msgs])
        for i, j in zip(arm.indices, arm.joints):
            if any(j not in m[1] for m in msgs):
                raise ConfigError(f"{path}: {arm.joint_states} lacks joint {j!r} in some messages")
            qpos[:, i] = np.interp(times, ts, [m[1][j] for m in msgs])
            qvel[:, i] = np.interp(times, ts, [m[2][j] for m in msgs])
        if use_commands:
            cmds = commands[arm.command]
            ct = np.array([c[0] for c in cmds])
            values = np.array([c[1] for c in cmds])
            if values.shape[1] != len(arm.indices):
                raise ConfigError(f"{path}: commands on {arm.command} have {values.shape[1]} values; "
                                  f"{len(arm.indices)} joints expected")
            newest = np.searchsorted(ct, times + 1e-9, side="right") - 1  # held until the next one
            action[:, list(arm.indices)] = values[newest]
    for i, (closed, opened) in cfg.grippers.items():
        qpos[:, i] = (qpos[:, i] - closed) / (opened - closed)
        qvel[:, i] = qvel[:, i] / (opened - closed)
        if use_commands:
            action[:, i] = (action[:, i] - closed) / (opened - closed)
    if not use_commands:
        action[:-1], action[-1] = qpos[1:], qpos[-1]
    if not np.isfinite(action).all():
        raise ConfigError(f"{path}: a command leaves some joints unset (a JointTrajectory naming other joints?)")
    bounds = [t0, *sorted(s for s in splits if t0 < s < t1), np.inf]
    episodes = []
    for a, b in zip(bounds, bounds[1:]):
        keep = (times >= a) & (times < b)
        if keep.sum() >= 2:
            episodes.append({"obs/qpos": qpos[keep].astype(np.float32), "obs/qvel": qvel[keep].astype(np.float32),
                             "action": action[keep].astype(np.float32),
                             # k / fps, not t - t_first: bag times near 1.7e9 s would cost 0.2 us of precision
                             "timestamp": np.arange(int(keep.sum())) / cfg.fps})
    return episodes


def import_bags(bags: Sequence[str | Path], out: str | Path, cfg: BagImport, overwrite: bool = False) -> EpisodeStore:
    """Every bag (its episodes) into a new store at `out`; all or nothing."""
    if cfg.action_from not in ("command", "next_qpos"):
        raise ConfigError(f"action_from={cfg.action_from!r}; choose command or next_qpos")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} already exists; pass overwrite=true to replace it")
    episodes = [(Path(b), ep) for b in bags for ep in read_bag(b, cfg)]  # read everything before writing
    if not episodes:
        raise ConfigError(f"no episode of 2 or more steps in {', '.join(map(str, bags))}")
    n = cfg.action_dim
    schema = Schema.build({"obs/qpos": ((n,), "float32"), "obs/qvel": ((n,), "float32"), "action": ((n,), "float32")},
                          fps=cfg.fps, robot=cfg.robot)
    tmp = out.with_name(out.name + ".importing")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        store = EpisodeStore.create(tmp, schema)
        for bag, ep in episodes:
            data = {k: ep[k] for k in ("obs/qpos", "obs/qvel", "action")}
            store.add_episode(data, ep["timestamp"], Segment.TELEOP,
                              EpisodeMeta(task=cfg.task, source=f"rosbag2:{bag.name}", extra={"bag": str(bag)}))
        store.close()
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return EpisodeStore.open(out)

