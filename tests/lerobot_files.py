"""LeRobot datasets on disk, laid out as LeRobot v2.1 and v3.0 write them, for the import tests.

Written with pyarrow and PyAV only, never with robo_rl's own exporter: the importer is tested
against the published format, not against ourselves. What each file holds follows LeRobot's
writers: for v2.1, lerobot 0.3.3 `lerobot/datasets/utils.py` (info.json, the DEFAULT_*_PATH
templates, tasks.jsonl, episodes.jsonl, episodes_stats.jsonl) and `lerobot_dataset.py`
(save_episode: one parquet and one mp4 per episode); for v3.0, lerobot 0.4.4
`lerobot/datasets/utils.py` (DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH, DEFAULT_EPISODES_PATH,
write_tasks / load_tasks through a pandas index), `lerobot_dataset.py` (episodes appended to
data and video files, dataset_from/to_index, videos/<key>/from_timestamp) and `video_utils.py`
(the encoder settings and how videos are joined).

  v2.1: meta/info.json, meta/tasks.jsonl, meta/episodes.jsonl, meta/episodes_stats.jsonl,
        data/chunk-000/episode_NNNNNN.parquet (one episode each),
        videos/chunk-000/<camera>/episode_NNNNNN.mp4 (one episode each)
  v3.0: meta/info.json, meta/tasks.parquet (the task strings as a pandas index), meta/stats.json,
        meta/episodes/chunk-000/file-NNN.parquet (one row per episode, several files),
        data/chunk-000/file-NNN.parquet (several episodes each),
        videos/<camera>/chunk-000/file-NNN.mp4 (several episodes each, joined packet by packet
        with each episode's from/to_timestamp in the episodes rows)

The content is made to be checkable: numbers are random but exact, and camera frames are smooth
(gradients, a soft blob that moves 2 px a step, all brightening 5 levels a step), so a
video codec keeps them well above 30 dB and no two frames of a camera look alike.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

os.environ.setdefault("SVT_LOG", "1")  # libsvtav1 prints a banner per file otherwise; errors only

INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
TASKS = ("pick up the red cube", "put the cube in the bin")
CAMERAS = ("observation.images.top", "observation.images.wrist")
# The non-camera features every fixture has: name -> (dtype, shape). A string feature is among them
# because LeRobot allows one; a store has no place for it.
NUMERIC = {
    "observation.state": ("float32", (6,)),
    "action": ("float32", (6,)),
    "observation.environment_state": ("float64", (4,)),
    "observation.contact": ("int64", (2,)),
    "next.reward": ("float32", (1,)),
    "next.done": ("bool", (1,)),
}
STRING_FEATURE = "annotation.note"
JOINT_NAMES = ["waist", "shoulder", "elbow", "wrist_angle", "wrist_rotate", "gripper"]


@dataclass
class LeRobotFiles:
    """A dataset written to `root` and the values it holds, to compare an import against."""

    root: Path
    version: str
    fps: int
    lengths: list[int]
    robot_type: str
    columns: dict[str, np.ndarray]  # feature -> (N, *shape) exactly as written
    task_index: np.ndarray  # (N,) int64
    frames: dict[str, np.ndarray]  # camera feature -> (N, H, W, 3) uint8 the video was encoded from
    camera_dtypes: dict[str, str]  # camera feature -> "video" | "image"
    tasks: tuple[str, ...] = TASKS
    video_files: dict[str, list[Path]] = field(default_factory=dict)  # camera -> its mp4s

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)


# ---------------------------------------------------------------------- content
def camera_frame(camera: int, episode: int, step: int, height: int, width: int) -> np.ndarray:
    """Frame `step` of an episode: smooth, so lossy codecs keep it, and unlike every other frame."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cx, cy = 6 + 2.0 * step + 3 * episode, height / 2 + 5 * camera
    blob = 40 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * 5.0 ** 2))
    # the whole frame brightens 5 levels a step (and 20 an episode): far more than a codec's error
    level = 20 + (5 * step + 20 * episode) % 140
    red = level + 1.2 * x + blob
    green = level + 2 * y + 10 * camera
    blue = np.full_like(x, level + 30 + 20 * camera)
    return np.clip(np.stack([red, green, blue], -1), 0, 255).round().astype(np.uint8)


def make_content(lengths: list[int], hw: tuple[int, int], seed: int = 0):
    """Columns, per-step task indices and camera frames for episodes of the given lengths."""
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    columns = {}
    for name, (dtype, shape) in NUMERIC.items():
        if dtype == "bool":
            columns[name] = np.zeros((n, *shape), bool)
        elif dtype == "int64":
            columns[name] = rng.integers(-5, 1000, (n, *shape)).astype(np.int64)
        else:
            columns[name] = rng.standard_normal((n, *shape)).astype(dtype)
    ends = np.cumsum(lengths)
    columns["next.done"][ends - 1] = True
    task_index = np.zeros(n, np.int64)
    frames = {cam: np.zeros((n, *hw, 3), np.uint8) for cam in CAMERAS}
    start = 0
    for e, length in enumerate(lengths):
        task_index[start:start + length] = e % 2
        if e == 1:  # this episode changes task half way: it has two tasks
            task_index[start + length // 2:start + length] = 0
        for c, cam in enumerate(CAMERAS):
            for k in range(length):
                frames[cam][start + k] = camera_frame(c, e, k, *hw)
        start += length
    return columns, task_index, frames


# ---------------------------------------------------------------------- video and images
def encode_mp4(frames: np.ndarray, fps: int, codec: str) -> bytes:
    """One episode's frames as an mp4, encoded the way LeRobot does it (PyAV, yuv420p, a keyframe
    every 2 frames, crf 30; libsvtav1 also at preset 12)."""
    options = {"g": "2", "crf": "30"}
    if codec == "libsvtav1":
        options["preset"] = "12"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream(codec, fps, options=options)
        stream.pix_fmt = "yuv420p"
        stream.height, stream.width = frames.shape[1:3]
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def write_mp4(path: Path, frames: np.ndarray, fps: int, codec: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_mp4(frames, fps, codec))


def join_mp4(path: Path, episodes: list[bytes]) -> list[tuple[float, float]]:
    """Per-episode mp4s joined into one by copying packets (no re-encoding), each episode's times
    shifted by the durations of those before it, as LeRobot's concatenate_video_files does. So
    every episode starts on a keyframe. Returns each episode's (from_timestamp, to_timestamp)."""
    spans = []
    start = 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as out:
        target = None
        for data in episodes:
            with av.open(io.BytesIO(data)) as part:
                stream = part.streams.video[0]
                if target is None:
                    target = out.add_stream_from_template(stream, opaque=True)  # copy packets, no codec
                    target.time_base = stream.time_base
                duration = float(stream.duration * stream.time_base)
                shift = round(start / stream.time_base)
                for packet in part.demux(stream):
                    if packet.dts is None:  # the demuxer's empty end-of-stream packet
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = target
                    out.mux(packet)
            spans.append((start, start + duration))
            start += duration
    return spans


def png_cell(img: np.ndarray, name: str) -> dict:
    """An image as the Hugging Face `Image` feature stores it in parquet: PNG bytes and a file name."""
    buffer = io.BytesIO()
    Image.fromarray(img).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": name}


# ---------------------------------------------------------------------- parquet columns and metadata
def arrow_column(values: np.ndarray, shape: tuple[int, ...], fixed: bool) -> pa.Array:
    """A feature's column: shape [1] a plain scalar column; [n] a fixed_size_list<type>[n] (what
    `datasets` writes for Sequence(length=n)) or, ported-hub style, a plain list<type>."""
    flat = pa.array(values.reshape(-1))
    if shape == (1,):
        return flat
    if fixed:
        return pa.FixedSizeListArray.from_arrays(flat, shape[0])
    offsets = pa.array(np.arange(0, len(values) * shape[0] + 1, shape[0], dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, flat)


def hf_feature(dtype: str, shape: tuple[int, ...], list_name: str, fixed: bool = True) -> dict:
    """The `datasets` feature JSON kept in the parquet's `huggingface` schema metadata."""
    if dtype == "image":
        return {"_type": "Image"}
    value = {"dtype": dtype, "_type": "Value"}
    if shape == (1,):
        return value
    return {"feature": value, "length": shape[0] if fixed else -1, "_type": list_name}


def data_table(fx: LeRobotFiles, rows: slice, features: dict, fixed: bool, list_name: str) -> pa.Table:
    """The data parquet rows of `rows` (whole episodes), columns in info.json's feature order."""
    starts = fx.starts
    n = sum(fx.lengths)
    episode_index = np.repeat(np.arange(len(fx.lengths)), fx.lengths)
    frame_index = np.arange(n) - np.repeat(starts, fx.lengths)
    index_values = {
        "timestamp": (frame_index / fx.fps).astype(np.float32),
        "frame_index": frame_index.astype(np.int64),
        "episode_index": episode_index.astype(np.int64),
        "index": np.arange(n, dtype=np.int64),
        "task_index": fx.task_index,
    }
    columns, hf = {}, {}
    for name, spec in features.items():
        if spec["dtype"] == "video":
            continue
        if spec["dtype"] == "image":
            columns[name] = pa.array(
                [png_cell(fx.frames[name][g], f"frame_{int(frame_index[g]):06d}.png") for g in range(n)[rows]],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        elif spec["dtype"] == "string":
            columns[name] = pa.array([f"step {int(k)}" for k in frame_index[rows]], pa.string())
        elif name in index_values:
            columns[name] = pa.array(index_values[name][rows])
        else:
            columns[name] = arrow_column(fx.columns[name][rows], tuple(spec["shape"]), fixed)
        hf[name] = hf_feature(spec["dtype"], tuple(spec["shape"]), list_name, fixed)
    table = pa.table(columns)
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": hf}})})


def feature_stats(values: np.ndarray, camera: bool) -> dict:
    """min/max/mean/std/count as LeRobot computes them; cameras per channel in [0, 1], shape (3, 1, 1)."""
    if camera:
        x = values.astype(np.float64) / 255.0
        per = lambda f: f(x, axis=(0, 1, 2)).reshape(3, 1, 1).tolist()  # noqa: E731
        return {"min": per(np.min), "max": per(np.max), "mean": per(np.mean), "std": per(np.std), "count": [len(values)]}
    x = values.astype(np.float64).reshape(len(values), -1)
    return {"min": x.min(0).tolist(), "max": x.max(0).tolist(), "mean": x.mean(0).tolist(), "std": x.std(0).tolist(),
            "count": [len(values)]}


def all_stats(fx: LeRobotFiles, rows: slice, features: dict) -> dict:
    n = sum(fx.lengths)
    frame_index = np.arange(n) - np.repeat(fx.starts, fx.lengths)
    extra = {"timestamp": frame_index / fx.fps, "frame_index": frame_index,
             "episode_index": np.repeat(np.arange(len(fx.lengths)), fx.lengths), "index": np.arange(n),
             "task_index": fx.task_index}
    stats = {}
    for name, spec in features.items():
        if spec["dtype"] == "string":
            continue
        camera = spec["dtype"] in ("video", "image")
        values = fx.frames[name] if camera else fx.columns.get(name, extra.get(name))
        stats[name] = feature_stats(values[rows], camera)
    return stats


def info_features(fx: LeRobotFiles, hw: tuple[int, int], codec: str) -> dict:
    features = {}
    for name, (dtype, shape) in NUMERIC.items():
        names = JOINT_NAMES if shape == (6,) else None
        if name == "action":
            names = {"motors": JOINT_NAMES}  # ported datasets name dimensions this way
        features[name] = {"dtype": dtype, "shape": list(shape), "names": names}
    features[STRING_FEATURE] = {"dtype": "string", "shape": [1], "names": None}
    for cam in CAMERAS:
        spec = {"dtype": fx.camera_dtypes[cam], "shape": [*hw, 3], "names": ["height", "width", "channels"]}
        if spec["dtype"] == "video":
            spec["info"] = {"video.height": hw[0], "video.width": hw[1], "video.codec": "av1" if codec == "libsvtav1" else "h264",
                            "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fx.fps,
                            "video.channels": 3, "has_audio": False}
        features[cam] = spec
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in INDEX_FEATURES[1:]:
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _files(root: Path, version: str, lengths: list[int], fps: int, hw: tuple[int, int], image_camera: bool,
           robot_type: str) -> LeRobotFiles:
    columns, task_index, frames = make_content(lengths, hw)
    dtypes = {cam: "video" for cam in CAMERAS}
    if image_camera:
        dtypes[CAMERAS[1]] = "image"
    return LeRobotFiles(root, version, fps, list(lengths), robot_type, columns, task_index, frames, dtypes,
                        video_files={cam: [] for cam in CAMERAS if dtypes[cam] == "video"})


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4))


# ---------------------------------------------------------------------- v2.1
def write_v21(root: Path, *, codec: str = "libsvtav1", lengths=(11, 20, 9), fps: int = 10, hw=(32, 48),
              image_camera: bool = False, fixed_size_lists: bool = True, robot_type: str = "aloha") -> LeRobotFiles:
    """A LeRobot v2.1 dataset: one parquet and one mp4 per camera for each episode."""
    fx = _files(Path(root), "v2.1", lengths, fps, hw, image_camera, robot_type)
    features = info_features(fx, hw, codec)
    n_videos = sum(1 for d in fx.camera_dtypes.values() if d == "video")
    info = {
        "codebase_version": "v2.1", "robot_type": robot_type, "total_episodes": len(lengths),
        "total_frames": sum(lengths), "total_tasks": len(TASKS), "total_videos": len(lengths) * n_videos,
        "total_chunks": 1, "chunks_size": 1000, "fps": fps, "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4" if n_videos else None,
        "features": features,
    }
    _write_json(fx.root / "meta" / "info.json", info)
    (fx.root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS)))
    episodes, stats = [], []
    for e, (start, length) in enumerate(zip(fx.starts, lengths)):
        rows = slice(int(start), int(start + length))
        path = fx.root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data_table(fx, rows, features, fixed_size_lists, "Sequence"), path)
        for cam, dtype in fx.camera_dtypes.items():
            if dtype == "video":
                mp4 = fx.root / f"videos/chunk-000/{cam}/episode_{e:06d}.mp4"
                write_mp4(mp4, fx.frames[cam][rows], fps, codec)
                fx.video_files[cam].append(mp4)
        episode_tasks = list(dict.fromkeys(TASKS[t] for t in fx.task_index[rows]))
        episodes.append({"episode_index": e, "tasks": episode_tasks, "length": length})
        stats.append({"episode_index": e, "stats": all_stats(fx, rows, features)})
    (fx.root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in episodes))
    (fx.root / "meta" / "episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stats))
    return fx


# ---------------------------------------------------------------------- v3.0
def tasks_table(index_name: str | None) -> pa.Table:
    """meta/tasks.parquet as pandas writes a DataFrame indexed by the task strings: LeRobot 0.4.4
    leaves the index unnamed (column `__index_level_0__`), newer LeRobot names it `task`."""
    column = index_name or "__index_level_0__"
    table = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()), column: pa.array(TASKS, pa.string())})
    pandas_meta = {
        "index_columns": [column],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": index_name, "field_name": column, "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)})


def write_v30(root: Path, *, codec: str = "libsvtav1", lengths=(11, 20, 9), fps: int = 10, hw=(32, 48),
              image_camera: bool = False, fixed_size_lists: bool = True, robot_type: str = "aloha",
              episodes_per_data_file: int = 2, episodes_per_video_file: int = 3, episodes_per_meta_file: int = 2,
              task_index_name: str | None = None) -> LeRobotFiles:
    """A LeRobot v3.0 dataset: episodes packed several to a data file, a video file and an episodes
    metadata file (each grouping on its own, as LeRobot's size limits make them)."""
    fx = _files(Path(root), "v3.0", lengths, fps, hw, image_camera, robot_type)
    features = info_features(fx, hw, codec)
    for spec in features.values():
        if spec["dtype"] != "video":
            spec["fps"] = fps  # the v2.1 -> v3.0 converter adds this; loaders ignore it
    has_video = any(d == "video" for d in fx.camera_dtypes.values())
    info = {
        "codebase_version": "v3.0", "robot_type": robot_type, "total_episodes": len(lengths),
        "total_frames": sum(lengths), "total_tasks": len(TASKS), "chunks_size": 1000,
        "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if has_video else None,
        "features": features,
    }
    _write_json(fx.root / "meta" / "info.json", info)
    pq.write_table(tasks_table(task_index_name), fx.root / "meta" / "tasks.parquet")
    n = sum(lengths)
    _write_json(fx.root / "meta" / "stats.json", all_stats(fx, slice(0, n), features))
    starts = fx.starts
    ranges = [slice(int(s), int(s + length)) for s, length in zip(starts, lengths)]
    rows: list[dict] = [{"episode_index": e, "tasks": list(dict.fromkeys(TASKS[t] for t in fx.task_index[r])),
                         "length": lengths[e]} for e, r in enumerate(ranges)]

    for file_index, first in enumerate(range(0, len(lengths), episodes_per_data_file)):
        group = range(first, min(len(lengths), first + episodes_per_data_file))
        span = slice(ranges[group[0]].start, ranges[group[-1]].stop)
        path = fx.root / f"data/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data_table(fx, span, features, fixed_size_lists, "List"), path)
        for e in group:
            rows[e].update({"data/chunk_index": 0, "data/file_index": file_index,
                            "dataset_from_index": ranges[e].start, "dataset_to_index": ranges[e].stop})
    for cam, dtype in fx.camera_dtypes.items():
        if dtype != "video":
            continue
        for file_index, first in enumerate(range(0, len(lengths), episodes_per_video_file)):
            group = range(first, min(len(lengths), first + episodes_per_video_file))
            path = fx.root / f"videos/{cam}/chunk-000/file-{file_index:03d}.mp4"
            spans = join_mp4(path, [encode_mp4(fx.frames[cam][ranges[e]], fps, codec) for e in group])
            fx.video_files[cam].append(path)
            for e, (t0, t1) in zip(group, spans):
                rows[e].update({f"videos/{cam}/chunk_index": 0, f"videos/{cam}/file_index": file_index,
                                f"videos/{cam}/from_timestamp": t0, f"videos/{cam}/to_timestamp": t1})
    for e, r in enumerate(ranges):
        for name, values in all_stats(fx, r, features).items():
            for stat, value in values.items():
                rows[e][f"stats/{name}/{stat}"] = value
    for file_index, first in enumerate(range(0, len(lengths), episodes_per_meta_file)):
        group = rows[first:first + episodes_per_meta_file]
        for row in group:
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": file_index})
        path = fx.root / f"meta/episodes/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(group), path)
    return fx


def write_dataset(root: Path, version: str, **options) -> LeRobotFiles:
    return {"v2.1": write_v21, "v3.0": write_v30}[version](root, **options)
