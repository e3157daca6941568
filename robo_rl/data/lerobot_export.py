"""Export an EpisodeStore as a LeRobot dataset in format v3.0, the layout LeRobot 0.4's loader reads.

What is written under OUT (checked first by robo_rl/data/outputs.py: never the store, and an existing
OUT is replaced only with overwrite=true and only if it is a LeRobot dataset; built in OUT.exporting and
swapped into place only when complete):

    meta/info.json                 format version, fps, counts, path templates, `features` (every column and
                                   camera with dtype, shape, names; cameras carry the video's codec info), and
                                   `robo_rl.schema`: the store's own schema, so an import restores exact key
                                   names, shapes and dtypes
    meta/stats.json                {feature: {min, max, mean, std, count, q01, q10, q50, q90, q99}} over all
                                   episodes; cameras per channel, shape (3, 1, 1), scaled to [0, 1]
    meta/tasks.parquet             columns task_index, task; row i is task i; pandas metadata makes `task`
                                   the index, which is how LeRobot looks tasks up
    meta/episodes/chunk-CCC/file-FFF.parquet
                                   one row per episode, in episode order: length, task, where its rows and
                                   video lie (data/chunk_index, data/file_index, dataset_from/to_index,
                                   videos/<camera>/chunk_index, file_index, from_timestamp, to_timestamp),
                                   per-episode stats/<feature>/<stat>, and robo_rl/episode_meta (EpisodeMeta JSON)
    data/chunk-CCC/file-FFF.parquet
                                   the steps of many episodes one after another; a numeric key is a column of
                                   the store's own dtype (a vector as fixed_size_list<dtype>[n], shape () and
                                   (1,) as a scalar column, more dimensions flattened), so values come back
                                   bit for bit; plus LeRobot's timestamp (k/fps, float32, from 0 in each
                                   episode), frame_index, episode_index, index, task_index, and ours:
                                   segment (the Segment label) and timestamp_recorded (the store's float64 time)
    videos/observation.images.<camera>/chunk-CCC/file-FFF.mp4
                                   yuv420p video of many episodes back to back; each episode is encoded on
                                   its own, so it starts on a keyframe, and its packets are appended with a
                                   time offset: episode e's frame k shows at from_timestamp + k/fps

A new data (or episodes-metadata) file starts when the next episode would take the current one past
`data_file_mb` (LeRobot's default 100 MB, counted as arrow bytes, which bound the compressed file), a
new video file past `video_file_mb` (200 MB); an episode never spans two files. File indices run
0..999 in a chunk directory, then the chunk index goes up (LeRobot's chunks_size).

Store keys map to LeRobot names as the import in robo_rl/data/lerobot.py expects: obs/qpos ->
observation.state, obs/qvel -> observation.velocity, obs/images/<cam> -> observation.images.<cam>,
obs/<a>/<b> -> observation.<a>.<b>, any other a/b -> a.b.

The export streams episode by episode (camera frames a block at a time), then decodes every written
mp4 back and compares it with the store: that checks each frame's time and keyframe, and measures the
codec's loss (PSNR, largest and mean absolute error), which the report returns.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robo_rl.data.codecs import CRF_RANGE, canonical_codec
from robo_rl.data.codecs import encode_mp4 as _encode_episode  # the name tests patch to fail an encode
from robo_rl.data.lerobot import (EPISODE_META_FIELD, INDEX_COLUMNS, RECORDED_TIME_COLUMN, SEGMENT_COLUMN,
                                  key_to_feature)
from robo_rl.data.outputs import check_destination, move_into_place, staging_dir
from robo_rl.data.schema import IMAGE_PREFIX, SEGMENT_KEY, TIMESTAMP_KEY, KeySpec, Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError, RoboRLError

log = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
DEFAULT_DATA_FILE_MB = 100
DEFAULT_VIDEO_FILE_MB = 200
FILES_PER_CHUNK = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

# The column names (LeRobot's INDEX_COLUMNS and our SEGMENT_COLUMN, RECORDED_TIME_COLUMN,
# EPISODE_META_FIELD) and the key <-> feature mapping live in robo_rl/data/lerobot.py, beside the reader.
# No store key may map onto a column the export writes itself; and LeRobot's __getitem__ puts the task
# string under "task", so a feature of that name would be hidden.
RESERVED_NAMES = (*INDEX_COLUMNS, SEGMENT_COLUMN, RECORDED_TIME_COLUMN, "task")

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_NAMES = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILE_NAMES)

FRAME_BLOCK = 64  # camera frames read from the store at a time: memory stays bounded on long episodes
TIME_TOLERANCE_S = 1e-4  # LeRobot's default tolerance_s when it matches a frame to a timestamp
ROW_GROUP_BYTES = 16 << 20  # small episodes are gathered into row groups of about this size


def _next_file(chunk_index: int, file_index: int) -> tuple[int, int]:
    """The file after (chunk, file): FILES_PER_CHUNK files per chunk directory, as LeRobot numbers them."""
    if file_index == FILES_PER_CHUNK - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


# ---------------------------------------------------------------------- the plan: what goes where
@dataclass
class _Column:
    """A numeric store key as a parquet column."""

    key: str
    name: str
    dtype: np.dtype
    width: int  # values per step; 1 and a scalar shape give a plain (non-list) column
    scalar: bool

    @property
    def arrow_type(self) -> pa.DataType:
        value = pa.from_numpy_dtype(self.dtype)
        return value if self.scalar else pa.list_(value, self.width)

    def array(self, values: np.ndarray) -> pa.Array:
        flat = np.ascontiguousarray(values).reshape(-1)
        if self.scalar:
            return pa.array(flat, type=self.arrow_type)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.from_numpy_dtype(self.dtype)), self.width)


@dataclass
class _Camera:
    key: str
    name: str
    height: int
    width: int


@dataclass
class _Plan:
    schema: Schema
    fps: int
    columns: list[_Column]
    cameras: list[_Camera]
    features: dict[str, dict]


def _plan(store: EpisodeStore) -> _Plan:
    """Check the store can be written as LeRobot v3.0 and decide every column and camera."""
    where = store.location
    schema = store.schema
    if store.n_episodes == 0:
        raise ConfigError(f"{where}: no committed episodes to export")
    fps = schema.fps
    if abs(fps - round(fps)) > 1e-9:
        raise ConfigError(f"{where}: fps {fps:g} is not a whole number; a LeRobot dataset has an integer fps")
    fps = int(round(fps))
    seen: dict[str, str] = {}
    for key in schema.keys:
        name = key_to_feature(key)
        if name in RESERVED_NAMES:
            raise ConfigError(f"{where}: key '{key}' would become the LeRobot column '{name}', which the export "
                              f"writes itself; rename the key")
        if name in seen:
            raise ConfigError(f"{where}: keys '{seen[name]}' and '{key}' would both become the LeRobot feature "
                              f"'{name}'; rename one")
        seen[name] = key
    columns, cameras, features = [], [], {}
    for key, spec in schema.keys.items():
        name = key_to_feature(key)
        if spec.is_image:
            cameras.append(_camera(where, spec, name))
            h, w = spec.shape[:2]
            features[name] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"]}
            continue
        width = int(np.prod(spec.shape, dtype=np.int64)) if spec.shape else 1
        column = _Column(key, name, np.dtype(spec.dtype), width, scalar=len(spec.shape) == 0 or spec.shape == (1,))
        columns.append(column)
        features[name] = {"dtype": spec.dtype, "shape": [width], "names": None}
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64"), (SEGMENT_COLUMN, "int64"),
                        (RECORDED_TIME_COLUMN, "float64")):
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    return _Plan(schema, fps, columns, cameras, features)


def _camera(where: str, spec: KeySpec, name: str) -> _Camera:
    h, w, channels = spec.shape
    cam = spec.name[len(IMAGE_PREFIX):]
    if channels != 3:
        raise ConfigError(f"{where}: camera '{cam}' ({spec.name}) has {channels} channel(s); LeRobot video "
                          f"features are RGB (H, W, 3)")
    if h % 2 or w % 2:
        raise ConfigError(f"{where}: camera '{cam}' ({spec.name}) frames are {w}x{h}; yuv420p video needs an "
                          f"even width and height")
    return _Camera(spec.name, name, h, w)


# ---------------------------------------------------------------------- statistics (LeRobot's shapes)
def _numeric_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Per-dimension stats of (T, d) values."""
    x = values.astype(np.float64)
    stats = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([len(x)])}
    for name, q in zip(QUANTILE_NAMES, np.quantile(x, QUANTILES, axis=0)):
        stats[name] = q
    return stats


def _image_stats(histogram: np.ndarray, frames: int) -> dict[str, np.ndarray]:
    """Per-channel stats in [0, 1], shape (3, 1, 1), from (3, 256) counts of pixel values.
    `count` is the number of frames, as LeRobot counts camera samples."""
    levels = np.arange(256, dtype=np.float64)
    total = histogram.sum(1)
    mean = histogram @ levels / total
    var = histogram @ (levels**2) / total - mean**2
    present = histogram > 0
    cum = np.cumsum(histogram, axis=1)
    stats = {
        "min": present.argmax(1).astype(np.float64),
        "max": (255 - present[:, ::-1].argmax(1)).astype(np.float64),
        "mean": mean,
        "std": np.sqrt(np.maximum(var, 0.0)),
    }
    for name, q in zip(QUANTILE_NAMES, QUANTILES):
        # the smallest level with at least a fraction q of the pixels at or below it
        stats[name] = np.array([np.searchsorted(cum[c], q * total[c]) for c in range(3)], dtype=np.float64)
    out = {k: (v / 255.0).reshape(3, 1, 1) for k, v in stats.items()}
    out["count"] = np.array([frames])
    return out


def _aggregate_stats(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset stats from episode stats, as LeRobot aggregates them: pooled mean and variance, overall
    min and max, and quantiles averaged with the episodes' step counts as weights."""
    counts = np.array([s["count"][0] for s in per_episode], dtype=np.float64)
    total = counts.sum()
    means = np.stack([s["mean"] for s in per_episode])
    w = counts.reshape(-1, *([1] * (means.ndim - 1)))
    mean = (means * w).sum(0) / total
    var = ((np.stack([s["std"] for s in per_episode]) ** 2 + (means - mean) ** 2) * w).sum(0) / total
    out = {
        "min": np.min(np.stack([s["min"] for s in per_episode]), axis=0),
        "max": np.max(np.stack([s["max"] for s in per_episode]), axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(total)]),
    }
    for name in QUANTILE_NAMES:
        out[name] = (np.stack([s[name] for s in per_episode]) * w).sum(0) / total
    return out


def _stats_type(stat: str, is_camera: bool) -> pa.DataType:
    if stat == "count":
        return pa.list_(pa.int64())
    return pa.list_(pa.list_(pa.list_(pa.float64()))) if is_camera else pa.list_(pa.float64())


# ---------------------------------------------------------------------- parquet files that roll over
class _RollingParquet:
    """Parquet files named by a chunk/file template; a new file starts when the next episode would take
    the current one to `limit_bytes`. Small episodes are gathered into bigger row groups."""

    def __init__(self, root: Path, template: str, schema: pa.Schema, limit_bytes: float):
        self.root, self.template, self.schema, self.limit = root, template, schema, limit_bytes
        self.chunk_index, self.file_index = 0, 0
        self.bytes_in_file = 0
        self.rows_in_file = 0
        self.files: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0

    def place(self, nbytes: int) -> tuple[int, int]:
        """The (chunk, file) that the next `nbytes` go to, starting a new file when they would not fit."""
        if self.rows_in_file and self.bytes_in_file + nbytes >= self.limit:
            self._close_file()
            self.chunk_index, self.file_index = _next_file(self.chunk_index, self.file_index)
        return self.chunk_index, self.file_index

    def append(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        self.bytes_in_file += table.nbytes
        self.rows_in_file += table.num_rows
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None:
            rel = self.template.format(chunk_index=self.chunk_index, file_index=self.file_index)
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(path, self.schema, compression="snappy")
            self.files.append(rel)
        self._writer.write_table(pa.concat_tables(self._pending))
        self._pending, self._pending_bytes = [], 0

    def _close_file(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.bytes_in_file = self.rows_in_file = 0

    def close(self) -> None:
        self._close_file()

    def abort(self) -> None:
        """Close an open file without writing what is pending (the export failed; the folder is deleted next)."""
        self._pending, self._pending_bytes = [], 0
        if self._writer is not None:
            with contextlib.suppress(Exception):  # already failing: keep the first error
                self._writer.close()
            self._writer = None


# ---------------------------------------------------------------------- video
@dataclass
class _VideoEpisode:
    episode_index: int
    start: int  # first step in the store
    length: int
    from_timestamp: float


@dataclass
class _ImageLoss:
    squared_error: float = 0.0
    abs_error: float = 0.0
    values: int = 0
    max_abs: int = 0

    def add(self, decoded: np.ndarray, original: np.ndarray) -> None:
        diff = np.abs(decoded.astype(np.int16) - original.astype(np.int16))
        self.squared_error += float(np.square(diff, dtype=np.int64).sum())
        self.abs_error += float(diff.sum(dtype=np.int64))
        self.values += diff.size
        self.max_abs = max(self.max_abs, int(diff.max()))

    def report(self) -> dict[str, Any]:
        mse = self.squared_error / max(self.values, 1)
        psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
        return {"psnr_db": psnr, "max_abs_error": self.max_abs, "mean_abs_error": self.abs_error / max(self.values, 1)}


class _CameraVideos:
    """One camera's mp4 files: episodes appended with a time offset, a new file past `limit_bytes`.
    A closed file is decoded back and checked against the store."""

    def __init__(self, root: Path, camera: _Camera, fps: int, limit_bytes: float,
                 read_frames: Callable[[str, int, int], np.ndarray]):
        self.root, self.camera, self.fps, self.limit = root, camera, fps, limit_bytes
        self.read_frames = read_frames
        self.chunk_index, self.file_index = 0, 0
        self.files: list[str] = []
        self.loss = _ImageLoss()
        self._container = None
        self._stream = None
        self._path: Path | None = None
        self._bytes = 0
        self._ticks = 0  # end of the last episode in the current file, in the stream's time base
        self._time_base: Fraction | None = None
        self._episodes: list[_VideoEpisode] = []

    def append(self, episode_index: int, start: int, length: int, encoded: bytes) -> dict[str, Any]:
        """Add one episode's mp4; returns its videos/<camera>/... metadata."""
        import av

        if self._container is not None and self._bytes + len(encoded) >= self.limit:
            self._close_file()
            self.chunk_index, self.file_index = _next_file(self.chunk_index, self.file_index)
        with av.open(io.BytesIO(encoded)) as source:
            src = source.streams.video[0]
            if self._container is None:
                self._open_file(src)
            if src.time_base != self._time_base:
                raise RoboRLError(f"{self.camera.key}: episode {episode_index} encoded with time base {src.time_base}, "
                                  f"the file's is {self._time_base}")
            offset = self._ticks
            for packet in source.demux(src):
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                packet.pts += offset
                packet.dts += offset
                packet.stream = self._stream
                self._container.mux(packet)
            duration = src.duration
        if duration != length * (1 / Fraction(self.fps)) / self._time_base:
            raise RoboRLError(f"{self.camera.key}: episode {episode_index} video lasts {duration} ticks of "
                              f"{self._time_base}, expected {length} frames at {self.fps} fps")
        self._ticks += duration
        self._bytes += len(encoded)
        from_ts = float(offset * self._time_base)
        self._episodes.append(_VideoEpisode(episode_index, start, length, from_ts))
        prefix = f"videos/{self.camera.name}"
        return {f"{prefix}/chunk_index": self.chunk_index, f"{prefix}/file_index": self.file_index,
                f"{prefix}/from_timestamp": from_ts, f"{prefix}/to_timestamp": float(self._ticks * self._time_base)}

    def _open_file(self, template_stream: Any) -> None:
        import av

        rel = VIDEO_PATH.format(video_key=self.camera.name, chunk_index=self.chunk_index, file_index=self.file_index)
        self._path = self.root / rel
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self._path), mode="w", format="mp4", options={"movflags": "faststart"})
        self._stream = self._container.add_stream_from_template(template_stream, opaque=True)
        self._stream.time_base = template_stream.time_base
        self._time_base = template_stream.time_base
        self.files.append(rel)

    def _close_file(self) -> None:
        if self._container is None:
            return
        self._container.close()
        self._container = None
        self._check_file(self._path, self._episodes)
        self._episodes, self._bytes, self._ticks = [], 0, 0

    def close(self) -> None:
        self._close_file()

    def abort(self) -> None:
        """Close an open file without checking it (the export failed; the folder is deleted next)."""
        if self._container is not None:
            with contextlib.suppress(Exception):  # already failing: keep the first error
                self._container.close()
            self._container = None

    def _check_file(self, path: Path, episodes: list[_VideoEpisode]) -> None:
        """Decode the file: every frame at from_timestamp + k/fps, each episode starting on a keyframe, and
        the pixels compared with the store's (the codec's loss)."""
        import av

        with av.open(str(path)) as container:
            decoded = container.decode(video=0)
            for ep in episodes:
                for block_start in range(0, ep.length, FRAME_BLOCK):
                    block_stop = min(ep.length, block_start + FRAME_BLOCK)
                    original = self.read_frames(self.camera.key, ep.start + block_start, ep.start + block_stop)
                    for k in range(block_start, block_stop):
                        frame = next(decoded, None)
                        where = f"{path}: episode {ep.episode_index} frame {k}"
                        if frame is None:
                            raise RoboRLError(f"{where}: missing from the written video")
                        want = ep.from_timestamp + k / self.fps
                        if abs(float(frame.time) - want) > TIME_TOLERANCE_S:
                            raise RoboRLError(f"{where}: shows at {float(frame.time):.6f} s, expected {want:.6f} s")
                        if k == 0 and not frame.key_frame:
                            raise RoboRLError(f"{where}: the episode does not start on a keyframe")
                        self.loss.add(frame.to_ndarray(format="rgb24"), original[k - block_start])
            if next(decoded, None) is not None:
                raise RoboRLError(f"{path}: more frames than the {sum(e.length for e in episodes)} written")

    def video_info(self) -> dict[str, Any]:
        """The `info` LeRobot keeps for a video feature, read from the first file."""
        import av

        with av.open(str(self.root / self.files[0])) as container:
            s = container.streams.video[0]
            return {"video.height": s.height, "video.width": s.width, "video.codec": s.codec.canonical_name,
                    "video.pix_fmt": s.pix_fmt, "video.is_depth_map": False, "video.fps": int(s.base_rate),
                    "video.channels": 3, "has_audio": False}


# ---------------------------------------------------------------------- the export
@dataclass
class _Totals:
    frames: int = 0
    tasks: dict[str, int] = field(default_factory=dict)  # task -> task_index, in order of first use
    episode_stats: dict[str, list[dict[str, np.ndarray]]] = field(default_factory=dict)  # feature -> per episode
    drift_warned: bool = False  # recorded times off a steady fps: said once, not per episode


def export_lerobot(
    src: str | os.PathLike | EpisodeStore,
    out: str | os.PathLike,
    *,
    codec: str = "libsvtav1",
    crf: int = 30,
    overwrite: bool = False,
    progress: bool = True,
    data_file_mb: float = DEFAULT_DATA_FILE_MB,
    video_file_mb: float = DEFAULT_VIDEO_FILE_MB,
) -> dict[str, Any]:
    """Write the store `src` as a LeRobot v3.0 dataset at `out`; returns what was written and the
    image loss measured by decoding the videos back (see the module docstring for the layout)."""
    codec = canonical_codec(codec)
    lo, hi = CRF_RANGE[codec]
    if not lo <= int(crf) <= hi:
        raise ConfigError(f"crf={crf} out of range for {codec}: {lo}..{hi} (lower is better quality)")
    if data_file_mb <= 0 or video_file_mb <= 0:
        raise ConfigError(f"file size limits must be positive, got data_file_mb={data_file_mb}, "
                          f"video_file_mb={video_file_mb}")
    opened = not isinstance(src, EpisodeStore)
    store = EpisodeStore.open(src) if opened else src
    try:
        plan = _plan(store)
        sources = [] if "://" in store.location else [store.location]
        out = check_destination(out, overwrite, sources=sources, marker="meta/info.json", kind="LeRobot dataset")
        staging = staging_dir(out, "exporting")  # removes what a killed earlier export of this OUT left
        staging.mkdir()
        try:
            report = _write(store, plan, staging, codec, int(crf), data_file_mb, video_file_mb, progress)
            move_into_place(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        if opened:
            store.close()
    report["out"] = str(out)
    return report


def _data_schema(plan: _Plan) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, c.arrow_type) for c in plan.columns]
        + [pa.field("timestamp", pa.float32()), pa.field("frame_index", pa.int64()),
           pa.field("episode_index", pa.int64()), pa.field("index", pa.int64()), pa.field("task_index", pa.int64()),
           pa.field(SEGMENT_COLUMN, pa.int64()), pa.field(RECORDED_TIME_COLUMN, pa.float64())])


def _episodes_schema(plan: _Plan) -> pa.Schema:
    cameras = {c.name for c in plan.cameras}
    return pa.schema(
        [pa.field("episode_index", pa.int64()), pa.field("tasks", pa.list_(pa.string())),
         pa.field("length", pa.int64()),
         pa.field("data/chunk_index", pa.int64()), pa.field("data/file_index", pa.int64()),
         pa.field("dataset_from_index", pa.int64()), pa.field("dataset_to_index", pa.int64())]
        + [pa.field(f"videos/{c.name}/{what}", pa.int64() if what.endswith("index") else pa.float64())
           for c in plan.cameras for what in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        + [pa.field(f"stats/{name}/{stat}", _stats_type(stat, name in cameras))
           for name in plan.features for stat in STAT_NAMES]
        + [pa.field("meta/episodes/chunk_index", pa.int64()), pa.field("meta/episodes/file_index", pa.int64()),
           pa.field(EPISODE_META_FIELD, pa.string())])


def _write(store: EpisodeStore, plan: _Plan, root: Path, codec: str, crf: int, data_file_mb: float,
           video_file_mb: float, progress: bool) -> dict[str, Any]:
    """Every file under `root`; returns the report less `out`."""
    os.environ.setdefault("SVT_LOG", "1")  # svt-av1 prints its banner for every encoder unless told errors only
    from tqdm import tqdm

    mb = 1 << 20
    data_files = _RollingParquet(root, DATA_PATH, _data_schema(plan), data_file_mb * mb)
    episode_files = _RollingParquet(root, EPISODES_PATH, _episodes_schema(plan), data_file_mb * mb)
    videos = [_CameraVideos(root, cam, plan.fps, video_file_mb * mb, store.read) for cam in plan.cameras]
    totals = _Totals(episode_stats={name: [] for name in plan.features})
    bar = tqdm(total=store.n_episodes, desc=f"export-lerobot {codec}", unit="episode", disable=not progress,
               dynamic_ncols=True)
    try:
        for e in range(store.n_episodes):
            _write_episode(store, plan, e, codec, crf, data_files, episode_files, videos, totals)
            bar.update(1)
        data_files.close()
        episode_files.close()
        for video in videos:
            video.close()  # decodes the last file of each camera back: the check and the loss
    except BaseException:
        for files in (data_files, episode_files, *videos):
            files.abort()
        raise
    finally:
        bar.close()

    for cam, video in zip(plan.cameras, videos):
        plan.features[cam.name]["info"] = video.video_info()
    files = [*data_files.files, *episode_files.files, *(f for v in videos for f in v.files)]
    files.append(_write_tasks(root, totals.tasks))
    stats = {name: {k: v.tolist() for k, v in _aggregate_stats(per_episode).items()}
             for name, per_episode in totals.episode_stats.items()}
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=2))
    files.append("meta/stats.json")
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": plan.schema.robot,
        "total_episodes": store.n_episodes,
        "total_frames": totals.frames,
        "total_tasks": len(totals.tasks),
        "chunks_size": FILES_PER_CHUNK,
        "data_files_size_in_mb": _plain_number(data_file_mb),
        "video_files_size_in_mb": _plain_number(video_file_mb),
        "fps": plan.fps,
        "splits": {"train": f"0:{store.n_episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if plan.cameras else None,
        "features": plan.features,
        "robo_rl": {"schema": plan.schema.to_json()},
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    files.append("meta/info.json")
    return {
        "episodes": store.n_episodes,
        "frames": totals.frames,
        "codec": codec,
        "files": sorted(files),
        "image_loss": {cam.key[len(IMAGE_PREFIX):]: video.loss.report() for cam, video in zip(plan.cameras, videos)},
        # a lossy store's frames were already JPEG: the video's loss comes on top of this one
        "store_image_loss": store.image_psnr(),
        "store_image_codec": store.image_codec_label,
    }


def _write_episode(store: EpisodeStore, plan: _Plan, e: int, codec: str, crf: int, data_files: _RollingParquet,
                   episode_files: _RollingParquet, videos: list[_CameraVideos], totals: _Totals) -> None:
    """Episode e's rows, its video in each camera's file, and its metadata row with its stats."""
    import av

    start, stop = store.episode_range(e)
    length = stop - start
    meta = store.meta(e)
    task_index = totals.tasks.setdefault(meta.task, len(totals.tasks))
    steps = store.episode(e, [c.key for c in plan.columns] + [TIMESTAMP_KEY, SEGMENT_KEY])
    recorded = steps[TIMESTAMP_KEY]
    drift = float(np.abs(recorded - recorded[0] - np.arange(length) / plan.fps).max())
    if drift > 0.5 / plan.fps and not totals.drift_warned:
        log.warning("%s: episode %d's recorded times drift %.3f s from a steady %d fps; LeRobot's timestamp column "
                    "is k/fps (the recorded times are kept in %s)", store.location, e, drift, plan.fps,
                    RECORDED_TIME_COLUMN)
        totals.drift_warned = True

    frame_index = np.arange(length, dtype=np.int64)
    derived = {
        "timestamp": (frame_index / plan.fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.full(length, e, dtype=np.int64),
        "index": np.arange(totals.frames, totals.frames + length, dtype=np.int64),
        "task_index": np.full(length, task_index, dtype=np.int64),
        SEGMENT_COLUMN: steps[SEGMENT_KEY].astype(np.int64),
        RECORDED_TIME_COLUMN: recorded.astype(np.float64),
    }
    columns = {c.name: c.array(steps[c.key]) for c in plan.columns}
    columns.update({name: pa.array(v) for name, v in derived.items()})
    table = pa.Table.from_pydict(columns, schema=data_files.schema)
    data_chunk, data_file = data_files.place(table.nbytes)
    data_files.append(table)

    stats = {c.name: _numeric_stats(steps[c.key].reshape(length, -1)) for c in plan.columns}
    stats.update({name: _numeric_stats(v.reshape(length, 1)) for name, v in derived.items()})
    row: dict[str, Any] = {
        "episode_index": e, "tasks": [meta.task], "length": length,
        "data/chunk_index": data_chunk, "data/file_index": data_file,
        "dataset_from_index": totals.frames, "dataset_to_index": totals.frames + length,
    }
    for cam, video in zip(plan.cameras, videos):
        histogram = np.zeros((3, 256), dtype=np.int64)
        if codec == "libsvtav1" and min(cam.height, cam.width) < 4:  # some svt-av1 builds take it, others refuse
            raise ConfigError(f"{store.location}: camera {cam.key} ({cam.width}x{cam.height}) cannot be encoded "
                              f"with {codec}: its frames must be 4x4 or larger")
        try:
            encoded = _encode_episode(_frame_blocks(store, cam.key, start, stop, histogram), plan.fps, codec, crf,
                                      cam.height, cam.width)
        except av.FFmpegError as err:  # e.g. svt-av1 refuses frames under 4x4
            raise ConfigError(f"{store.location}: camera {cam.key} ({cam.width}x{cam.height}) cannot be encoded "
                              f"with {codec}: {err}") from err
        row.update(video.append(e, start, length, encoded))
        stats[cam.name] = _image_stats(histogram, length)
    for name, feature_stats in stats.items():
        totals.episode_stats[name].append(feature_stats)
        row.update({f"stats/{name}/{stat}": value.tolist() for stat, value in feature_stats.items()})
    row[EPISODE_META_FIELD] = json.dumps(meta.to_json())
    # The row's own file indices are part of it: size it with placeholders, then place it.
    sized = pa.Table.from_pylist([{**row, "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}],
                                 schema=episode_files.schema)
    row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = episode_files.place(sized.nbytes)
    episode_files.append(pa.Table.from_pylist([row], schema=episode_files.schema))
    totals.frames += length


def _frame_blocks(store: EpisodeStore, key: str, start: int, stop: int, histogram: np.ndarray) -> Iterator[np.ndarray]:
    """The episode's frames FRAME_BLOCK at a time, counting pixel values per channel on the way (for stats)."""
    for s in range(start, stop, FRAME_BLOCK):
        block = store.read(key, s, min(stop, s + FRAME_BLOCK))
        for c in range(3):
            histogram[c] += np.bincount(block[..., c].reshape(-1), minlength=256)
        yield block


def _write_tasks(root: Path, tasks: dict[str, int]) -> str:
    """meta/tasks.parquet as pandas would write a frame indexed by task: LeRobot reads it with pandas and
    looks tasks up through that index; the `pandas` schema metadata is what makes `task` the index."""
    ordered = sorted(tasks, key=tasks.get)
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
    }
    schema = pa.schema([pa.field("task_index", pa.int64()), pa.field("task", pa.string())],
                       metadata={b"pandas": json.dumps(pandas_meta).encode()})
    table = pa.table({"task_index": pa.array([tasks[t] for t in ordered], pa.int64()),
                      "task": pa.array(ordered, pa.string())}, schema=schema)
    rel = "meta/tasks.parquet"
    pq.write_table(table, root / rel)
    return rel


def _plain_number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)
