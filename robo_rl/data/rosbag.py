"""rosbag2 (MCAP or sqlite3) -> EpisodeStore, with the `rosbags` library (no ROS install).

What a bag holds: sensor_msgs/JointState, read by joint name, on one topic per arm or one for
all joints, and the commands that were sent (trajectory_msgs/JointTrajectory: the first point, by
joint name; std_msgs/Float64MultiArray: the data, in the declared joint order) on one topic per
arm or one for all joints. Messages arrive at their own rates and times; the store is at one fps. So each
output step k at t0 + k / fps takes:
  - obs/qpos, obs/qvel: each joint linearly interpolated between the joint states around it;
  - action: the newest command at or before it (a command holds until the next one), or, for a
    bag without commands (`action_from=next_qpos`), the next step's joint positions.
  - obs/images/<camera>: the newest frame at or before it (held) of the camera's topic,
    sensor_msgs/Image (rgb8, bgr8, mono8) or sensor_msgs/CompressedImage (JPEG, PNG), as RGB.
Steps start once every joint-state topic has a message (and every command topic a command) and
every camera a frame, and end at the last joint state or command. Grippers travel in their wire
unit; `grippers` maps them back to 0..1.
Frames are decoded in a second pass over the bag and written a shard at a time, so a long bag's
images never sit in memory at once.

A bag is one episode; `split_topic` (any message type, e.g. std_msgs/Bool from a record key)
starts a new episode at each of its messages. The store is written to `OUT.importing` and moved to
OUT only when every episode is in (robo_rl.data.outputs), so a failed import leaves OUT as it was;
overwrite replaces only an existing store, never a file or another folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from robo_rl.data.codecs import rgb_from_message
from robo_rl.data.outputs import check_destination, new_store
from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.errors import ConfigError

if TYPE_CHECKING:
    from robo_rl.data.store import EpisodeStore


@dataclass(frozen=True)
class TopicJoints:
    """A topic and the joints it carries: by name (joint states, trajectory commands) or in this
    order (forward commands), as the robot names them, in action order."""

    topic: str
    joints: tuple[str, ...]
    indices: tuple[int, ...]   # where these joints sit in the action vector


@dataclass
class BagImport:
    states: Sequence[TopicJoints]     # the joint-state topics (together: every joint once)
    commands: Sequence[TopicJoints]   # the command topics (together: every joint once)
    action_dim: int
    fps: float = 50.0
    grippers: dict[int, tuple[float, float]] = field(default_factory=dict)  # index -> (closed, open) on the wire
    action_from: str = "command"   # command | next_qpos
    split_topic: str | None = None
    task: str = ""
    robot: str = "unknown"
    images: dict[str, str] = field(default_factory=dict)  # image topic -> camera (store key obs/images/<camera>)
    images_required: bool = True  # False: a bag without some of `images` imports without those cameras


IMAGE_MSGTYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.LATEST)


@dataclass
class BagContents:
    """What the first pass over one bag found: its episodes without frames, and which frames they hold."""

    path: Path
    # each {obs/qpos, obs/qvel, action, timestamp, frame_index: {image topic: the index of the
    # message on that topic each step holds}}, resampled to cfg.fps
    episodes: list[dict[str, Any]]
    images: dict[str, str]  # the image topics this bag has: topic -> camera
    shapes: dict[str, tuple[int, ...]]  # camera -> frame shape (its first frame's)


def read_bag(bag: str | Path, cfg: BagImport) -> BagContents:
    """The bag's episodes, resampled to cfg.fps; camera frames are only located, not kept."""
    from rosbags.rosbag2 import Reader

    path = Path(bag)
    if not path.exists():
        raise ConfigError(f"bag {path} does not exist")
    store = _typestore()
    states: dict[str, list[tuple[float, dict[str, float], dict[str, float]]]] = {t.topic: [] for t in cfg.states}
    commands: dict[str, list[tuple[float, list[float]]]] = {t.topic: [] for t in cfg.commands}
    command_joints = {t.topic: t.joints for t in cfg.commands}
    splits: list[float] = []
    image_times: dict[str, list[float]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with Reader(path) as reader:
            topics = {c.topic: c for c in reader.connections}
            required = set(states) | ({cfg.split_topic} if cfg.split_topic else set())
            if cfg.action_from == "command":
                required |= set(commands)
            if cfg.images_required:
                required |= set(cfg.images)
            missing = sorted(required - set(topics))
            if missing:
                raise ConfigError(f"{path}: no topic {', '.join(missing)}; the bag has {sorted(topics)}")
            for topic in cfg.images:
                if topic in topics:
                    if topics[topic].msgtype not in IMAGE_MSGTYPES:
                        raise ConfigError(f"{path}: {topic} carries {topics[topic].msgtype}; an image topic carries "
                                          f"{' or '.join(IMAGE_MSGTYPES)}")
                    image_times[topic] = []
            conns = [topics[t] for t in required | (set(commands) & set(topics)) | set(image_times)]
            for conn, stamp_ns, raw in reader.messages(connections=conns):
                t = stamp_ns * 1e-9
                if conn.topic == cfg.split_topic:
                    splits.append(t)
                    continue
                if conn.topic in image_times:  # only when and how big; frames are decoded when written
                    image_times[conn.topic].append(t)
                    camera = cfg.images[conn.topic]
                    if camera not in shapes:
                        shapes[camera] = decode_frame(path, conn.topic, t, store.deserialize_cdr(raw, conn.msgtype)).shape
                    continue
                msg = store.deserialize_cdr(raw, conn.msgtype)
                if conn.topic in states:
                    names = list(msg.name)
                    vel = list(msg.velocity) if len(msg.velocity) == len(names) else [0.0] * len(names)
                    states[conn.topic].append((t, dict(zip(names, map(float, msg.position))), dict(zip(names, map(float, vel)))))
                elif conn.msgtype == "trajectory_msgs/msg/JointTrajectory":
                    if len(msg.points):
                        by_name = dict(zip(msg.joint_names, map(float, msg.points[0].positions)))
                        commands[conn.topic].append((t, [by_name.get(j, np.nan) for j in command_joints[conn.topic]]))
                else:
                    commands[conn.topic].append((t, [float(x) for x in msg.data]))
    except ConfigError:
        raise
    except Exception as e:  # rosbags' own errors: not a bag, unknown storage, broken file
        raise ConfigError(f"{path}: cannot read as a rosbag2 ({type(e).__name__}: {e})") from None
    episodes = _resample(path, cfg, states, commands, splits, image_times)
    return BagContents(path, episodes, {t: cfg.images[t] for t in image_times}, shapes)


def decode_frame(path: Path, topic: str, t: float, msg: Any) -> np.ndarray:
    """One image message of the bag as RGB; a frame that does not decode says where it is."""
    try:
        return rgb_from_message(msg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {topic} at {t:.3f} s: {e}") from None


def iter_frames(contents: BagContents) -> Iterator[dict[str, np.ndarray]]:
    """Second pass: {camera: frame} for every step of every episode of the bag, in order. Only the
    messages some step holds are decoded, and a frame is dropped once no later step needs it."""
    from rosbags.rosbag2 import Reader

    topics = contents.images
    need = {t: np.concatenate([ep["frame_index"][t] for ep in contents.episodes]) for t in topics}
    n = sum(len(ep["timestamp"]) for ep in contents.episodes)
    wanted = {t: set(need[t].tolist()) for t in topics}
    seen = dict.fromkeys(topics, -1)
    held: dict[str, dict[int, np.ndarray]] = {t: {} for t in topics}  # message index -> frame
    k = 0
    store = _typestore()
    try:
        with Reader(contents.path) as reader:
            for conn, stamp_ns, raw in reader.messages(connections=[c for c in reader.connections if c.topic in topics]):
                topic = conn.topic
                seen[topic] += 1
                if seen[topic] not in wanted[topic]:
                    continue
                frame = decode_frame(contents.path, topic, stamp_ns * 1e-9, store.deserialize_cdr(raw, conn.msgtype))
                shape = contents.shapes[topics[topic]]
                if frame.shape != shape:
                    raise ConfigError(f"{contents.path}: {topic} at {stamp_ns * 1e-9:.3f} s is {frame.shape[1]}x{frame.shape[0]}, "
                                      f"earlier frames {shape[1]}x{shape[0]}; a camera's frames have one size in a store")
                held[topic][seen[topic]] = frame
                while k < n and all(need[t][k] in held[t] for t in topics):
                    yield {topics[t]: held[t][need[t][k]] for t in topics}
                    k += 1
                    for t in topics:
                        for i in [i for i in held[t] if k == n or i < need[t][k]]:
                            del held[t][i]
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{contents.path}: cannot read as a rosbag2 ({type(e).__name__}: {e})") from None
    if k < n:
        raise ConfigError(f"{contents.path}: frames for {n - k} steps were not found on the second read; "
                          "did the bag change during the import?")


def _resample(path: Path, cfg: BagImport, states, commands, splits, image_times) -> list[dict[str, Any]]:
    use_commands = cfg.action_from == "command"
    for topic, msgs in states.items():
        if not msgs:
            raise ConfigError(f"{path}: no messages on {topic}")
    for topic, cmds in commands.items():
        if use_commands and not cmds:
            raise ConfigError(f"{path}: no commands on {topic}; pass action_from=next_qpos for a bag without them")
    for topic, ts in image_times.items():
        if not ts:
            raise ConfigError(f"{path}: no frames on {topic}")
    starts = [msgs[0][0] for msgs in states.values()] + [ts[0] for ts in image_times.values()]
    if use_commands:
        starts += [cmds[0][0] for cmds in commands.values()]
    t0 = max(starts)
    t1 = max(max(s[-1][0] for s in states.values()), max((c[-1][0] for c in commands.values() if c), default=0.0))
    times = t0 + np.arange(int(np.floor((t1 - t0) * cfg.fps)) + 1) / cfg.fps
    qpos = np.zeros((len(times), cfg.action_dim))
    qvel = np.zeros_like(qpos)
    action = np.zeros_like(qpos)
    for mapping in cfg.states:
        msgs = states[mapping.topic]
        ts = np.array([m[0] for m in msgs])
        for i, j in zip(mapping.indices, mapping.joints):
            if any(j not in m[1] for m in msgs):
                raise ConfigError(f"{path}: {mapping.topic} lacks joint {j!r} in some messages")
            qpos[:, i] = np.interp(times, ts, [m[1][j] for m in msgs])
            qvel[:, i] = np.interp(times, ts, [m[2][j] for m in msgs])
    for mapping in cfg.commands if use_commands else ():
        cmds = commands[mapping.topic]
        ct = np.array([c[0] for c in cmds])
        sizes = sorted({len(c[1]) for c in cmds})
        if sizes != [len(mapping.indices)]:
            raise ConfigError(f"{path}: commands on {mapping.topic} have {' or '.join(map(str, sizes))} values; the "
                              f"robot description declares {len(mapping.indices)} joints there ({', '.join(mapping.joints)})")
        values = np.array([c[1] for c in cmds])
        newest = np.searchsorted(ct, times + 1e-9, side="right") - 1  # held until the next one
        action[:, list(mapping.indices)] = values[newest]
    for i, (closed, opened) in cfg.grippers.items():
        qpos[:, i] = (qpos[:, i] - closed) / (opened - closed)
        qvel[:, i] = qvel[:, i] / (opened - closed)
        if use_commands:
            action[:, i] = (action[:, i] - closed) / (opened - closed)
    if not use_commands:
        action[:-1], action[-1] = qpos[1:], qpos[-1]
    if not np.isfinite(action).all():
        raise ConfigError(f"{path}: a command leaves some joints unset (a JointTrajectory naming other joints?)")
    # the newest frame at or before each step (held until the next), as its message index
    frame_index = {topic: np.searchsorted(np.array(ts), times + 1e-9, side="right") - 1 for topic, ts in image_times.items()}
    bounds = [t0, *sorted(s for s in splits if t0 < s < t1), np.inf]
    episodes = []
    for a, b in zip(bounds, bounds[1:]):
        keep = (times >= a) & (times < b)
        if keep.sum() >= 2:
            episodes.append({"obs/qpos": qpos[keep].astype(np.float32), "obs/qvel": qvel[keep].astype(np.float32),
                             "action": action[keep].astype(np.float32),
                             # k / fps, not t - t_first: bag times near 1.7e9 s would cost 0.2 us of precision
                             "timestamp": np.arange(int(keep.sum())) / cfg.fps,
                             "frame_index": {topic: idx[keep] for topic, idx in frame_index.items()}})
    return episodes


LOWDIM_KEYS = ("obs/qpos", "obs/qvel", "action")
BLOCK_STEPS = 64  # steps handed to the store at once: frames reach disk a shard at a time


def import_bags(bags: Sequence[str | Path], out: str | Path, cfg: BagImport, overwrite: bool = False,
                train_image_size: Sequence[int] | None = None) -> EpisodeStore:
    """Every bag (its episodes) into a new store at `out`; all or nothing."""
    from robo_rl.data.store import EpisodeStore  # here, not above: reading a bag needs no zarr

    if cfg.action_from not in ("command", "next_qpos"):
        raise ConfigError(f"action_from={cfg.action_from!r}; choose command or next_qpos")
    cameras = list(cfg.images.values())
    for topic, camera in cfg.images.items():
        if not camera or "/" in camera or cameras.count(camera) > 1:
            raise ConfigError(f"image topic {topic} -> camera {camera!r}: a camera is a name without '/', one topic each")
    out = check_destination(out, overwrite, sources=bags)  # a file, a bag, or a folder not a store: refused
    contents = [read_bag(b, cfg) for b in bags]  # read everything but the frames before writing
    if not any(c.episodes for c in contents):
        raise ConfigError(f"no episode of 2 or more steps in {', '.join(map(str, bags))}")
    first = contents[0]
    for c in contents[1:]:  # one schema for the store: the same cameras, each at one size, in every bag
        if sorted(c.images.values()) != sorted(first.images.values()):
            raise ConfigError(f"{c.path}: has cameras {sorted(c.images.values())}, {first.path} has "
                              f"{sorted(first.images.values())}; every bag of a store needs the same cameras")
        for camera, shape in c.shapes.items():
            if shape != first.shapes[camera]:
                raise ConfigError(f"{c.path}: camera {camera} frames are {shape[1]}x{shape[0]}, {first.path}'s "
                                  f"{first.shapes[camera][1]}x{first.shapes[camera][0]}; a camera has one size in a store")
    n = cfg.action_dim
    keys = {k: ((n,), "float32") for k in LOWDIM_KEYS}
    keys.update({f"obs/images/{cam}": (shape, "uint8") for cam, shape in sorted(first.shapes.items())})
    schema = Schema.build(keys, fps=cfg.fps, robot=cfg.robot, cameras=sorted(first.shapes))
    with new_store(out, schema, train_image_size) as store:  # OUT.importing, renamed to OUT only when every episode is in
        for bag in contents:
            frames = iter_frames(bag) if bag.images else None
            for ep in bag.episodes:
                writer = store.begin_episode(EpisodeMeta(task=cfg.task, source=f"rosbag2:{bag.path.name}",
                                                         extra={"bag": str(bag.path)}))
                steps = len(ep["timestamp"])
                for a in range(0, steps, BLOCK_STEPS):
                    b = min(steps, a + BLOCK_STEPS)
                    data = {k: ep[k][a:b] for k in LOWDIM_KEYS}
                    if frames is not None:
                        block = [next(frames) for _ in range(b - a)]
                        data.update({f"obs/images/{cam}": np.stack([f[cam] for f in block]) for cam in bag.images.values()})
                    writer.add_block(data, ep["timestamp"][a:b], Segment.TELEOP)
                writer.commit()
            if frames is not None:
                frames.close()  # its reader
    return EpisodeStore.open(out)
