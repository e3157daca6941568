"""EpisodeStore: an append-only, crash-safe zarr v3 store of episodes.

Layout (one zarr group):

    zarr.json               root attributes: {"robo_rl": schema (version, fps, robot, cameras, keys)}
    data/<key>              one array per key, all episodes concatenated along time
    data/timestamp          float64 seconds per step
    data/segment            uint8 Segment label per step
    repeat/<image key>      uint16 per step: 0, or how many steps back the step holding this step's
                            frame is (a camera at 30 fps read by a 50 Hz loop repeats frames; a
                            repeated frame is stored once, its rows hold the fill value, which
                            zarr does not write)
    small/<image key>       with `train_image_size`: each frame downscaled to the size policies
                            train on, so training never decodes a full frame
    meta/episode_info       one JSON string per episode (EpisodeMeta)
    meta/episode_ends       int64 end index per episode -- written last: the commit point
    meta/stats              attributes: normalisation statistics and the step count they cover

Why a crash never loses committed data:
- zarr's LocalStore replaces every file atomically (write to a temp file, then rename), so any
  chunk, shard or metadata file is either its old or its new version, never half of each;
- a commit writes every data array first, then the episode's info, then its end. Until the end
  is in `meta/episode_ends`, readers ignore the new rows; rows past the last end are a crashed,
  uncommitted episode, dropped by the next writer or by `repair()`;
- rewriting a shard that also holds committed rows is a read-modify-write of the whole file, so
  those rows come back bit for bit in the new version.

Why a reader never returns torn data while a writer appends: reading a shard is several reads
(its index, then byte ranges), and the writer may replace the file between them. Every chunk
carries a CRC32C checksum (the shard index has its own), so a read that mixes two versions of a
shard fails loudly instead of decoding wrong bytes, and `read()` tries again: every version of a
shard holds the committed rows unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from robo_rl.data.schema import (
    SEGMENT_KEY,
    TIMESTAMP_KEY,
    EpisodeMeta,
    Schema,
    Segment,
)
from robo_rl.data.codecs import JPEG_CODEC_NAME, decode_frame_jpeg, encode_jpeg, jpeg_frames_codec, psnr, resize_rgb
from robo_rl.errors import SchemaError, StoreError

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
TEMP_SUFFIX = ".partial"  # zarr's LocalStore names its in-flight writes *.<hex>.partial

# Codecs for camera frames, chosen by measurement (bench/image_codecs.py; docs/results.md "Choice of
# image codec"). zstd level 1 over 4-frame chunks: ~7x on rendered frames at ~700 MB/s encode on one
# thread. On noisy real-camera frames no lossless codec does better than ~1.3x; blosc-zstd with
# bitshuffle is the best of them there, at a quarter of the encode speed.
IMAGE_CODECS = {
    "zstd": lambda: ZstdCodec(level=1),
    "blosc-zstd": lambda: BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle", typesize=1),
    "blosc-lz4": lambda: BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle", typesize=1),
}
DEFAULT_IMAGE_CODEC = "zstd"
# Lossy, for real cameras (bench/lossy_codecs.py; docs/results.md "Lossy frames"): per-frame JPEG,
# each frame decodable alone. Quality is a setting of the store (`image_quality`).
LOSSY_IMAGE_CODECS = ("jpeg",)
DEFAULT_IMAGE_QUALITY = 85
jpeg_frames_codec()  # registered with zarr before any store that uses it is opened
IMAGE_CHUNK = 4  # frames per chunk: neighbouring frames compress together; a random frame read decodes 4
READ_RETRIES = 8
LOWDIM_CHUNK = 1024  # steps per chunk for low-dimensional keys
LOWDIM_SHARD = 16384  # steps per shard file (~5.5 min at 50 Hz)
IMAGE_SHARD = 128  # frames per shard file: an hour at 50 Hz is ~1,400 files per camera
SMALL_IMAGE_SHARD = 1024  # training-size frames per shard file (96x96: ~5 MB as JPEG)
MAX_REPEAT = np.iinfo(np.uint16).max  # a camera frozen longer than this stores its frame again


def _is_remote(path: str) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


def _local_path(path: str | os.PathLike) -> Path:
    p = str(path)
    return Path(p[len("file://"):] if p.startswith("file://") else p)


@dataclass
class RepairReport:
    """What `repair()` found and did."""

    episodes: int
    dropped_steps: int = 0
    dropped_info_rows: int = 0
    dropped_end_rows: int = 0
    removed_temp_files: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.dropped_steps or self.dropped_info_rows or self.dropped_end_rows or self.removed_temp_files)

    def summary(self) -> str:
        if not self.changed:
            return f"store is clean: {self.episodes} committed episodes, nothing dropped"
        parts = []
        if self.dropped_steps:
            parts.append(f"dropped {self.dropped_steps} steps of an uncommitted (interrupted) episode")
        if self.dropped_end_rows or self.dropped_info_rows:
            parts.append(f"dropped {max(self.dropped_end_rows, self.dropped_info_rows)} unfinished episode record(s)")
        if self.removed_temp_files:
            parts.append(f"removed {len(self.removed_temp_files)} temporary file(s) of interrupted writes")
        return f"{self.episodes} committed episodes kept intact; " + "; ".join(parts)


class EpisodeStore:
    """Episodes on disk. Open with `EpisodeStore.create(...)` or `EpisodeStore.open(...)`."""

    def __init__(self, group: zarr.Group, location: str, mode: str, lock_fd: int | None):
        self._group = group
        self.location = location
        self.mode = mode
        self._lock_fd = lock_fd
        attrs = group.attrs.asdict()
        if "robo_rl" not in attrs:
            raise StoreError(f"{location}: is a zarr group but not a robo_rl episode store (no 'robo_rl' attributes)")
        self.schema = Schema.from_json(attrs["robo_rl"], where=location)
        self.image_codec: str = attrs["robo_rl"].get("image_codec", DEFAULT_IMAGE_CODEC)
        self.image_quality: int | None = attrs["robo_rl"].get("image_quality")  # lossy codecs only
        small = attrs["robo_rl"].get("train_image_size")
        # the size the store keeps a copy of every frame at for training (None: frames are that size)
        self.train_image_size: tuple[int, int] | None = (int(small[0]), int(small[1])) if small else None
        self.frame_repeats: bool = bool(attrs["robo_rl"].get("frame_repeats", False))  # stores older than it: False
        self._arrays: dict[str, zarr.Array] = {}
        self._buffers: dict[str, _FrameBuffer] = {}  # a writer's pending camera frames, reused
        self._held_frames: dict[str, np.ndarray] = {}  # camera key -> the newest frame stored, to spot repeats
        self._direct: dict[str, bool] = {}  # array path -> read from its JPEG shards directly
        self._ends = np.zeros(0, dtype=np.int64)
        self._infos: list[EpisodeMeta] = []
        self._dropped_at_open: RepairReport | None = None  # what opening for append cut off
        self.refresh()

    # ------------------------------------------------------------------ opening and creating
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        schema: Schema,
        overwrite: bool = False,
        image_codec: str = DEFAULT_IMAGE_CODEC,
        image_quality: int = DEFAULT_IMAGE_QUALITY,
        train_image_size: Sequence[int] | None = None,
    ) -> "EpisodeStore":
        """Create an empty store at a local path and open it for appending. `image_codec`: a
        lossless one (IMAGE_CODECS) or `jpeg` at `image_quality` (1..100). `train_image_size`
        [height, width]: also keep every frame downscaled to it (`read(..., small=True)`)."""
        if _is_remote(str(path)):
            raise StoreError(f"{path}: stores are created locally; copy to remote storage afterwards")
        if image_codec not in IMAGE_CODECS and image_codec not in LOSSY_IMAGE_CODECS:
            raise StoreError(f"image_codec {image_codec!r} unknown; choose one of "
                             f"{sorted(IMAGE_CODECS) + list(LOSSY_IMAGE_CODECS)}")
        if image_codec in LOSSY_IMAGE_CODECS and not 1 <= int(image_quality) <= 100:
            raise StoreError(f"image_quality={image_quality}: JPEG quality is 1..100")
        small = _train_size(schema, train_image_size, str(path))
        root = _local_path(path)
        if root.exists() and any(root.iterdir()):
            if not overwrite:
                raise StoreError(f"{root}: already exists; open it to append, or pass overwrite=True to replace it")
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = _acquire_lock(root)
        try:
            group = zarr.open_group(str(root), mode="a", zarr_format=3)  # "w" would delete the lock file
            lossy = {"image_quality": int(image_quality)} if image_codec in LOSSY_IMAGE_CODECS else {}
            extras = {"frame_repeats": True, **({"train_image_size": list(small)} if small else {})}
            group.attrs["robo_rl"] = {**schema.to_json(), "image_codec": image_codec, **lossy, **extras}
            for spec in schema.keys.values():
                _create_data_array(group, spec.name, spec.shape, spec.dtype, spec.is_image, image_codec,
                                   int(image_quality))
                if spec.is_image:
                    group.create_array(f"repeat/{spec.name}", shape=(0,), chunks=(LOWDIM_CHUNK,), shards=(LOWDIM_SHARD,),
                                       dtype="uint16", compressors=(ZstdCodec(level=3), Crc32cCodec()), fill_value=0)
                    if small:
                        _create_data_array(group, spec.name, (*small, spec.shape[2]), spec.dtype, True, image_codec,
                                           int(image_quality), prefix="small", shard=SMALL_IMAGE_SHARD)
            _create_data_array(group, TIMESTAMP_KEY, (), "float64", False, image_codec)
            _create_data_array(group, SEGMENT_KEY, (), "uint8", False, image_codec)
            group.create_array("meta/episode_ends", shape=(0,), chunks=(4096,), dtype="int64", fill_value=0)
            group.create_array("meta/episode_info", shape=(0,), chunks=(1024,), dtype=str)
            group.create_group("meta/stats")
        except BaseException:
            _release_lock(lock_fd)
            raise
        return cls(group, str(root), "a", lock_fd)

    @classmethod
    def open_or_create(cls, path: str | os.PathLike, schema: Schema, overwrite: bool = False, **create_options: Any) -> "EpisodeStore":
        """A local store opened to append, created first if missing (or replaced: overwrite=True).
        An existing store must hold `schema`, so episodes of another shape never mix in."""
        if overwrite or not (_local_path(path) / "zarr.json").is_file():
            return cls.create(path, schema, overwrite=overwrite, **create_options)
        store = cls.open(path, mode="a")
        if store.schema.to_json() != schema.to_json():
            store.close()
            raise SchemaError(f"{path}: holds episodes with keys {store.schema.to_json()['keys']}, not the ones given; "
                              "pass another path (or overwrite)")
        return store

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r", storage_options: dict | None = None) -> "EpisodeStore":
        """Open a store. mode 'r' reads (local or any fsspec URL); 'a' appends (local only, one writer)."""
        if mode not in ("r", "a"):
            raise StoreError(f"mode must be 'r' or 'a', got {mode!r}")
        location = str(path)
        if _is_remote(location):
            if mode != "r":
                raise StoreError(f"{location}: remote stores open read-only (mode='r')")
            try:
                group = zarr.open_group(location, mode="r", storage_options=storage_options or {})
            except Exception as e:  # fsspec raises many types; say what failed, keep the cause
                raise StoreError(f"{location}: cannot open as a robo_rl store ({type(e).__name__}: {e})") from e
            return cls(group, location, "r", None)
        root = _local_path(path)
        if not root.is_dir():
            leftovers = sorted(root.parent.glob(f"{root.name}.old-*")) if root.parent.is_dir() else []
            if leftovers:
                raise StoreError(f"{root}: missing, but an interrupted delete left the original at {leftovers[-1]}; "
                                 f"rename it back to {root}")
            raise StoreError(f"{root}: no such store (not a directory)")
        if not (root / "zarr.json").is_file():
            raise StoreError(f"{root}: not a robo_rl store (no zarr.json); create one with EpisodeStore.create")
        lock_fd = _acquire_lock(root) if mode == "a" else None
        try:
            group = zarr.open_group(str(root), mode="r+" if mode == "a" else "r", zarr_format=3)
            store = cls(group, str(root), mode, lock_fd)
        except BaseException:
            _release_lock(lock_fd)
            raise
        if mode == "a":
            store._dropped_at_open = store._drop_uncommitted()
        return store

    def close(self) -> None:
        _release_lock(self._lock_fd)
        self._lock_fd = None

    def __enter__(self) -> "EpisodeStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ reading
    def refresh(self) -> None:
        """Re-read what is committed (a reader calls this to see a writer's new episodes)."""
        self._arrays.clear()
        ends = np.asarray(self._group["meta/episode_ends"][:], dtype=np.int64)
        self._ends = ends[: _committed_prefix(ends)]
        raw = self._group["meta/episode_info"]
        n = min(len(self._ends), raw.shape[0])
        texts = raw[:n] if n else []
        self._infos = [EpisodeMeta.from_json(json.loads(t)) for t in texts]
        if len(self._infos) < len(self._ends):
            raise StoreError(f"{self.location}: {len(self._ends)} episodes committed but only {len(self._infos)} have info")

    @property
    def n_episodes(self) -> int:
        return len(self._ends)

    def __len__(self) -> int:
        return self.n_episodes

    @property
    def n_steps(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def episode_ends(self) -> np.ndarray:
        return self._ends.copy()

    @property
    def episode_starts(self) -> np.ndarray:
        return np.concatenate([[0], self._ends[:-1]]).astype(np.int64)

    @property
    def episode_lengths(self) -> np.ndarray:
        return np.diff(np.concatenate([[0], self._ends])).astype(np.int64)

    @property
    def writable(self) -> bool:
        return self.mode == "a"

    @property
    def data_keys(self) -> list[str]:
        """User keys plus 'timestamp' and 'segment'."""
        return [*self.schema.keys, TIMESTAMP_KEY, SEGMENT_KEY]

    def _check_episode(self, i: int) -> int:
        n = self.n_episodes
        if not -n <= i < n:
            raise StoreError(f"{self.location}: episode {i} out of range ({n} committed episodes)")
        return i % n

    def episode_range(self, i: int) -> tuple[int, int]:
        i = self._check_episode(i)
        return (int(self._ends[i - 1]) if i else 0), int(self._ends[i])

    def meta(self, i: int) -> EpisodeMeta:
        return self._infos[self._check_episode(i)]

    @property
    def metas(self) -> list[EpisodeMeta]:
        return list(self._infos)

    def array(self, key: str) -> zarr.Array:
        """The raw zarr array of a key (rows past `n_steps` are not committed; a repeated camera
        frame's row holds zeros: `read` fills it in)."""
        if key not in self.data_keys:
            raise StoreError(f"{self.location}: no key {key!r}; keys are {self.data_keys}")
        return self._node(f"data/{key}")

    def _node(self, path: str) -> zarr.Array:
        if path not in self._arrays:
            node = self._group[path]
            if path.startswith(("data/obs/images/", "small/")):
                # a frame of zeros is a repeated one, which the frame codecs store in a few bytes:
                # zarr's own test for empty chunks compares every 1 MB frame against a fresh one
                node = node.with_config({"write_empty_chunks": True})
            self._arrays[path] = node
        return self._arrays[path]

    def _jpeg_shards(self, path: str, node: zarr.Array) -> bool:
        """Whether `path` is a local array of one-frame JPEG chunks in shards, which `read` decodes
        itself: zarr's pipeline costs ~0.7 ms per chunk, ten times a 96x96 frame's decoding.
        Worked out once per array."""
        if path not in self._direct:
            self._direct[path] = self._is_jpeg_shards(path, node)
        return self._direct[path]

    def _is_jpeg_shards(self, path: str, node: zarr.Array) -> bool:
        if self.image_quality is None or _is_remote(self.location) or not path.startswith(("data/obs/images/", "small/")):
            return False
        codecs = node.metadata.to_dict().get("codecs", [])
        if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
            return False
        conf = codecs[0]["configuration"]
        return (conf.get("index_location", "end") == "end" and conf["chunk_shape"][0] == 1
                and [c["name"] for c in conf["codecs"]] == [JPEG_CODEC_NAME, "crc32c"]
                and [c["name"] for c in conf["index_codecs"]] == ["bytes", "crc32c"])

    @property
    def _frame_paths(self) -> list[str]:
        """The camera arrays: full frames and training-size copies."""
        return [f"data/{k}" for k in self.schema.image_keys] + \
            ([f"small/{k}" for k in self.schema.image_keys] if self.train_image_size else [])

    def _frame_buffer(self, path: str) -> "_FrameBuffer":
        if path not in self._buffers:
            arr = self._node(path)
            capacity = arr.shards[0] if arr.shards else arr.chunks[0]
            self._buffers[path] = _FrameBuffer(arr.shape[1:], arr.dtype, capacity)
        return self._buffers[path]

    @property
    def _step_arrays(self) -> list[str]:
        """Every array with one row per step: the data keys and the frames' repeat counts and
        training-size copies. All are cut back together when an episode is dropped."""
        paths = [f"data/{k}" for k in self.data_keys]
        for k in self.schema.image_keys:
            paths += [f"repeat/{k}"] if self.frame_repeats else []
            paths += [f"small/{k}"] if self.train_image_size else []
        return paths

    def read(self, key: str, start: int = 0, stop: int | None = None, small: bool = False) -> np.ndarray:
        """Rows [start, stop) of a key, never past the committed end. `small`: a camera's frames
        at the store's `train_image_size` (the copies kept for training), not full size."""
        stop = self.n_steps if stop is None else min(stop, self.n_steps)
        if key not in self.data_keys:
            raise StoreError(f"{self.location}: no key {key!r}; keys are {self.data_keys}")
        path = f"data/{key}"
        if small:
            if key not in self.schema.image_keys or self.train_image_size is None:
                raise StoreError(f"{self.location}: no training-size copies of {key!r} "
                                 f"({'not a camera' if key not in self.schema.image_keys else 'none kept'})")
            path = f"small/{key}"
        if not self.frame_repeats or key not in self.schema.image_keys or stop <= start:
            return self._read_rows(path, slice(start, stop))
        back = self._read_rows(f"repeat/{key}", slice(start, stop)).astype(np.int64)
        if not back.any():
            return self._read_rows(path, slice(start, stop))
        # a repeated frame's row is empty: its frame is the one of the step that holds it, which
        # is never a repeat itself and may lie before `start`
        src = np.arange(start, stop) - back
        if self._jpeg_shards(path, self._node(path)):
            return self._read_rows(path, src)  # decodes each frame once, repeats copied
        rows = self._read_rows(path, slice(start, stop))
        if not rows.flags.writeable:
            rows = rows.copy()
        inside = (back > 0) & (src >= start)
        rows[inside] = rows[src[inside] - start]
        before = src < start
        if before.any():
            held = np.unique(src[before])
            rows[before] = self._read_rows(path, held)[np.searchsorted(held, src[before])]
        return rows

    def _read_rows(self, path: str, rows: slice | np.ndarray) -> np.ndarray:
        for attempt in range(READ_RETRIES):
            try:
                node = self._node(path)
                if self._jpeg_shards(path, node):
                    return _read_jpeg_shards(Path(self.location) / path, node, rows)
                return np.asarray(node[rows] if isinstance(rows, slice) else node.oindex[rows])
            except (ValueError, RuntimeError, OSError) as e:
                # A shard replaced by the writer between our reads of it (checksum or codec
                # error): read it again from the new version.
                failure = e
                self._arrays.pop(path, None)
                time.sleep(0.005 * (attempt + 1))
        where = f"rows {rows.start}:{rows.stop}" if isinstance(rows, slice) else f"rows {rows.tolist()[:8]}"
        name = path.removeprefix("data/")  # a key's own name; "small/<key>" for its training-size copies
        raise StoreError(
            f"{self.location}: key '{name}' {where} unreadable after {READ_RETRIES} tries "
            f"({type(failure).__name__}: {failure}); run robo-rl dataset validate"
        )

    def episode(self, i: int, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        start, end = self.episode_range(i)
        return {k: self.read(k, start, end) for k in (keys or self.data_keys)}

    def select(
        self,
        task: str | None = None,
        success: bool | None = None,
        segment: Segment | str | Sequence[Segment | str] | None = None,
        source: str | None = None,
    ) -> list[int]:
        """Indices of episodes matching every given filter. `segment`: holds a step with that label."""
        keep = []
        wanted = None
        if segment is not None:
            segs = [segment] if isinstance(segment, (str, Segment, int)) else segment
            wanted = np.array(sorted({int(Segment.parse(s)) for s in segs}), dtype=np.uint8)
            seg_all = self.read(SEGMENT_KEY)
        for i, m in enumerate(self._infos):
            if task is not None and m.task != task:
                continue
            if success is not None and m.success != success:
                continue
            if source is not None and m.source != source:
                continue
            if wanted is not None:
                s, e = self.episode_range(i)
                if not np.isin(seg_all[s:e], wanted).any():
                    continue
            keep.append(i)
        return keep

    # ------------------------------------------------------------------ writing
    def _require_writable(self) -> None:
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to write")

    def begin_episode(self, meta: EpisodeMeta | None = None) -> "EpisodeWriter":
        """Start an episode; add steps to the returned writer, then `commit()` it."""
        self._require_writable()
        return EpisodeWriter(self, meta or EpisodeMeta())

    def add_episode(
        self,
        data: Mapping[str, Any],
        timestamps: Any,
        segments: Any = Segment.TELEOP,
        meta: EpisodeMeta | None = None,
    ) -> int:
        """Append a whole episode: `data[key]` is (T, *shape). Returns the episode's index."""
        writer = self.begin_episode(meta)
        writer.add_block(data, timestamps, segments)
        return writer.commit()

    def _drop_uncommitted(self, quiet: bool = False) -> RepairReport:
        """Cut every array back to the committed end (rows of an interrupted or discarded episode)."""
        report = RepairReport(episodes=self.n_episodes)
        end = self.n_steps
        for path in self._step_arrays:
            arr = self._node(path)
            if arr.shape[0] > end:
                report.dropped_steps = max(report.dropped_steps, arr.shape[0] - end)
                arr.resize((end, *arr.shape[1:]))
        ends = self._group["meta/episode_ends"]
        if ends.shape[0] > self.n_episodes:
            report.dropped_end_rows = ends.shape[0] - self.n_episodes
            ends.resize((self.n_episodes,))
        info = self._group["meta/episode_info"]
        if info.shape[0] > self.n_episodes:
            report.dropped_info_rows = info.shape[0] - self.n_episodes
            info.resize((self.n_episodes,))
        if report.changed and not quiet:
            log.warning("%s: %s", self.location, report.summary())
        self._arrays.clear()
        return report

    def repair(self) -> RepairReport:
        """Drop what an interrupted writer left behind and say what it was. Committed data is kept."""
        self._require_writable()
        root = Path(self.location)
        temps = [str(p.relative_to(root)) for p in root.rglob(f"*{TEMP_SUFFIX}")]
        report = self._drop_uncommitted()
        if self._dropped_at_open is not None:
            earlier, self._dropped_at_open = self._dropped_at_open, None
            report.dropped_steps = max(report.dropped_steps, earlier.dropped_steps)
            report.dropped_end_rows = max(report.dropped_end_rows, earlier.dropped_end_rows)
            report.dropped_info_rows = max(report.dropped_info_rows, earlier.dropped_info_rows)
        for rel in temps:
            (root / rel).unlink(missing_ok=True)
        report.removed_temp_files = temps
        return report

    # ------------------------------------------------------------------ copies, delete, merge
    def copy_episodes(self, out: str | os.PathLike, episodes: Sequence[int] | None = None, overwrite: bool = False) -> "EpisodeStore":
        """Write the chosen episodes (default all) to a new store at `out`; returns it open for appending."""
        dst = EpisodeStore.create(out, self.schema, overwrite=overwrite, image_codec=self.image_codec,
                                  image_quality=self.image_quality or DEFAULT_IMAGE_QUALITY,
                                  train_image_size=self.train_image_size)
        try:
            _copy_into(self, dst, range(self.n_episodes) if episodes is None else episodes)
        except BaseException:
            dst.close()
            shutil.rmtree(dst.location, ignore_errors=True)
            raise
        return dst

    def delete(self, episodes: Sequence[int]) -> int:
        """Remove episodes by rewriting the store without them. Returns how many remain.

        The new store is built beside the old one and swapped in with two renames; the old
        copy is removed only after the new one is in place.
        """
        self._require_writable()
        drop = {self._check_episode(i) for i in episodes}
        keep = [i for i in range(self.n_episodes) if i not in drop]
        root = Path(self.location)
        tmp = root.with_name(f"{root.name}.rewrite-{uuid.uuid4().hex[:8]}")
        old = root.with_name(f"{root.name}.old-{uuid.uuid4().hex[:8]}")
        new = self.copy_episodes(tmp, keep)
        new.close()
        os.rename(root, old)
        os.rename(tmp, root)
        self.close()
        shutil.rmtree(old, ignore_errors=True)
        self._reopen_for_append()
        return self.n_episodes

    def _reopen_for_append(self) -> None:
        self._lock_fd = _acquire_lock(Path(self.location))
        self._group = zarr.open_group(self.location, mode="r+", zarr_format=3)
        self.refresh()

    @staticmethod
    def merge(sources: Sequence["EpisodeStore | str"], out: str | os.PathLike, overwrite: bool = False) -> "EpisodeStore":
        """Concatenate stores with the same schema (keys, shapes, dtypes, fps) into a new one."""
        stores = [s if isinstance(s, EpisodeStore) else EpisodeStore.open(s) for s in sources]
        if not stores:
            raise StoreError("merge: give at least one source store")
        first = stores[0]
        for s in stores[1:]:
            if s.schema.to_json()["keys"] != first.schema.to_json()["keys"] or s.schema.fps != first.schema.fps:
                raise StoreError(
                    f"merge: {s.location} has schema {s.schema.to_json()['keys']} at {s.schema.fps} fps, "
                    f"{first.location} has {first.schema.to_json()['keys']} at {first.schema.fps} fps"
                )
        dst = EpisodeStore.create(out, first.schema, overwrite=overwrite, image_codec=first.image_codec,
                                  image_quality=first.image_quality or DEFAULT_IMAGE_QUALITY,
                                  train_image_size=first.train_image_size)
        try:
            for s in stores:
                _copy_into(s, dst, range(s.n_episodes))
        except BaseException:
            dst.close()
            shutil.rmtree(dst.location, ignore_errors=True)
            raise
        return dst

    # ------------------------------------------------------------------ stats and facts
    def load_stats(self) -> dict | None:
        """Saved normalisation statistics, or None when absent or stale (store has grown)."""
        attrs = self._group["meta/stats"].attrs.asdict()
        if attrs.get("n_steps") != self.n_steps or not attrs.get("keys"):
            return None
        return attrs["keys"]

    def save_stats(self, stats: dict) -> None:
        """Store statistics with the step count they cover. Works on a read-only handle of a local store."""
        if _is_remote(self.location):
            return
        node = zarr.open_group(str(Path(self.location) / "meta" / "stats"), mode="r+", zarr_format=3)
        node.attrs.put({"n_steps": self.n_steps, "keys": stats})

    def size_on_disk(self) -> int | None:
        if _is_remote(self.location):
            return None
        return sum(p.stat().st_size for p in Path(self.location).rglob("*") if p.is_file())

    def segment_counts(self) -> dict[str, int]:
        seg = self.read(SEGMENT_KEY)
        counts = np.bincount(seg, minlength=len(Segment))
        return {s.name: int(counts[s]) for s in Segment}

    def info(self) -> dict[str, Any]:
        lengths = self.episode_lengths
        succ = [m.success for m in self._infos if m.success is not None]
        return {
            "location": self.location,
            "robot": self.schema.robot,
            "episodes": self.n_episodes,
            "steps": self.n_steps,
            "duration_s": self.n_steps / self.schema.fps,
            "fps": self.schema.fps,
            "mean_length": float(lengths.mean()) if len(lengths) else 0.0,
            "success_rate": (sum(succ) / len(succ)) if succ else None,
            "labelled_success": len(succ),
            "segments": self.segment_counts(),
            "tasks": sorted({m.task for m in self._infos}),
            "keys": {k: (s.shape, s.dtype) for k, s in self.schema.keys.items()},
            "cameras": list(self.schema.cameras),
            "image_codec": self.image_codec_label,
            "image_psnr_db": self.image_psnr(),
            "train_image_size": list(self.train_image_size) if self.train_image_size else None,
            "bytes_on_disk": self.size_on_disk(),
            "schema_version": self.schema.version,
        }

    @property
    def image_codec_label(self) -> str | None:
        """How camera frames are stored, e.g. "jpeg (quality 85)"; None without cameras."""
        if not self.schema.image_keys:
            return None
        return self.image_codec + (f" (quality {self.image_quality})" if self.image_quality is not None else "")

    def image_psnr(self) -> dict[str, float] | None:
        """A lossy store's image loss per camera: the lowest PSNR (dB) measured at write time on
        each episode's sample frame (None for a lossless store)."""
        if self.image_quality is None:
            return None
        worst: dict[str, float] = {}
        for m in self._infos:
            for cam, db in (m.extra or {}).get("image_psnr_db", {}).items():
                worst[cam] = min(worst.get(cam, float("inf")), float(db))
        return worst

    def validate(self, check_values: bool = True) -> list[str]:
        """Every problem found, as one line each; an empty list means the store is sound."""
        problems: list[str] = []
        raw_ends = np.asarray(self._group["meta/episode_ends"][:])
        if len(raw_ends) > self.n_episodes:
            problems.append(f"{len(raw_ends) - self.n_episodes} unfinished episode record(s) past the last commit (run repair)")
        for path in self._step_arrays:
            arr = self._node(path)
            key = path.removeprefix("data/")
            if arr.shape[0] < self.n_steps:
                problems.append(f"key '{key}': {arr.shape[0]} rows but episodes end at {self.n_steps}")
            elif arr.shape[0] > self.n_steps:
                problems.append(f"key '{key}': {arr.shape[0] - self.n_steps} uncommitted rows past the last episode (run repair)")
        if problems or not check_values:
            return problems
        ts = self.read(TIMESTAMP_KEY)
        seg = self.read(SEGMENT_KEY)
        for i in range(self.n_episodes):
            s, e = self.episode_range(i)
            if e <= s:
                problems.append(f"episode {i}: empty")
                continue
            d = np.diff(ts[s:e])
            if not np.isfinite(ts[s:e]).all():
                problems.append(f"episode {i}: non-finite timestamp")
            elif (d < 0).any():
                problems.append(f"episode {i} step {int(np.argmax(d < 0)) + 1}: timestamp goes backwards")
        if (seg >= len(Segment)).any():
            problems.append(f"segment: unknown label at step {int(np.argmax(seg >= len(Segment)))}")
        if self.frame_repeats:
            starts = np.repeat(self.episode_starts, self.episode_lengths)
            for key in self.schema.image_keys:
                back = self._read_rows(f"repeat/{key}", slice(0, self.n_steps)).astype(np.int64)
                src = np.arange(self.n_steps) - back
                bad = (src < starts) | (back[src] != 0)
                if bad.any():
                    problems.append(f"key '{key}': step {int(np.argmax(bad))} repeats a frame outside its episode")
        reads = [(key, spec, False) for key, spec in self.schema.keys.items()]
        reads += [(key, self.schema.keys[key], True) for key in self.schema.image_keys if self.train_image_size]
        for key, spec, small in reads:
            # Read every row of every key: each chunk's checksum is verified on the way.
            block_rows = max(1, (64 << 20) // max(spec.nbytes, 1))
            for start in range(0, self.n_steps, block_rows):
                try:
                    block = self.read(key, start, start + block_rows, small=small)
                except StoreError as e:
                    problems.append(str(e))
                    break
                if np.dtype(spec.dtype).kind == "f":
                    bad = ~np.isfinite(block.reshape(len(block), -1)).all(axis=1)
                    if bad.any():
                        problems.append(f"key '{key}': NaN/inf at step {start + int(np.argmax(bad))}")
                        break
        if not _is_remote(self.location):
            temps = list(Path(self.location).rglob(f"*{TEMP_SUFFIX}"))
            if temps:
                problems.append(f"{len(temps)} temporary file(s) of interrupted writes (run repair)")
        return problems


class EpisodeWriter:
    """Builds one episode in a writable store. Camera frames go to disk a shard at a time while
    the episode runs, so memory stays bounded; everything else is written at `commit()`."""

    def __init__(self, store: EpisodeStore, meta: EpisodeMeta):
        self.store = store
        self.meta = meta
        self.start = store.n_steps
        self.length = 0
        # rows not yet written, by array path: camera frames in buffers the store reuses
        self._pending: dict[str, Any] = {p: [] for p in store._step_arrays}
        for path in store._frame_paths:
            self._pending[path] = store._frame_buffer(path)
            self._pending[path].n = 0
        self._flushed: dict[str, int] = {p: 0 for p in store._step_arrays}
        self._since: dict[str, int] = {}  # camera key -> steps since its newest stored frame (store._held_frames)
        self._last_ts: float | None = None
        self._done = False
        self._psnr_sample: dict[str, float] = {}  # lossy store: per camera, the loss on the episode's first frame

    @property
    def episode_index(self) -> int:
        return self.store.n_episodes

    def _where(self, step: int | None = None) -> str:
        return f"{self.store.location}: episode {self.episode_index} step {self.length if step is None else step}"

    def add(self, step: Mapping[str, Any], timestamp: float, segment: Segment | int | str = Segment.TELEOP, checked: bool = False,
            same_frames: Iterable[str] = ()) -> None:
        """Add one step: `step[key]` for every schema key, its capture time and who produced it.
        `same_frames`: cameras whose frame is known to be the previous step's (the Recorder's ring
        says so); their values in `step` are not read."""
        self._require_open()
        values = step if checked else self.store.schema.check_step(step, self._where)
        ts = float(timestamp)
        if not math.isfinite(ts):
            raise SchemaError(f"{self._where()}: timestamp is {ts}, expected a finite time in seconds")
        if self._last_ts is not None and ts < self._last_ts:
            raise SchemaError(f"{self._where()}: timestamp {ts:.6f} goes backwards (previous step {self._last_ts:.6f})")
        seg = Segment.parse(segment)
        images = self.store.schema.image_keys
        for k, v in values.items():
            if k in images:
                self._add_frame(k, v, same=k in same_frames)
            else:
                self._pending[f"data/{k}"].append(v)
        self._pending[f"data/{TIMESTAMP_KEY}"].append(np.float64(ts))
        self._pending[f"data/{SEGMENT_KEY}"].append(np.uint8(seg))
        self._last_ts = ts
        self.length += 1
        self._sample_image_loss({k: self.store._held_frames[k] for k in images})
        self._flush_frames()

    def add_block(self, data: Mapping[str, Any], timestamps: Any, segments: Any = Segment.TELEOP) -> None:
        """Add T steps at once: `data[key]` is (T, *shape)."""
        self._require_open()
        schema = self.store.schema
        where = f"{self.store.location}: episode {self.episode_index}"
        missing = [k for k in schema.keys if k not in data]
        extra = [k for k in data if k not in schema.keys]
        if missing or extra:
            raise SchemaError(f"{where}: " + "; ".join(
                ([f"missing {missing}"] if missing else []) + ([f"unknown {extra} (schema has {list(schema.keys)})"] if extra else [])))
        blocks = {k: schema.keys[k].check_block(data[k], where) for k in schema.keys}
        ts = np.asarray(timestamps, dtype=np.float64).reshape(-1)
        lengths = {k: len(v) for k, v in blocks.items()}
        lengths[TIMESTAMP_KEY] = len(ts)
        if len(set(lengths.values())) != 1:
            raise SchemaError(f"{where}: blocks have different lengths {lengths}")
        n = len(ts)
        if not np.isfinite(ts).all():
            raise SchemaError(f"{where} step {self.length + int(np.argmax(~np.isfinite(ts)))}: timestamp is not finite")
        prev = np.concatenate([[self._last_ts if self._last_ts is not None else -np.inf], ts[:-1]])
        back = ts < prev
        if back.any():
            j = int(np.argmax(back))
            raise SchemaError(f"{where} step {self.length + j}: timestamp {ts[j]:.6f} goes backwards (previous step {prev[j]:.6f})")
        if isinstance(segments, (str, Segment, int, np.integer)):
            seg = np.full(n, int(Segment.parse(segments)), dtype=np.uint8)
        else:
            seg = np.array([int(Segment.parse(s)) for s in segments], dtype=np.uint8)
            if len(seg) != n:
                raise SchemaError(f"{where}: {len(seg)} segment labels for {n} steps")
        for k, v in blocks.items():
            if k in schema.image_keys:
                for frame in v:
                    self._add_frame(k, frame)
            else:
                self._pending[f"data/{k}"].extend(v)
        self._pending[f"data/{TIMESTAMP_KEY}"].extend(ts)
        self._pending[f"data/{SEGMENT_KEY}"].extend(seg)
        if n:
            self._last_ts = float(ts[-1])
            self._sample_image_loss({k: blocks[k][0] for k in schema.image_keys})
        self.length += n
        self._flush_frames()

    def _add_frame(self, key: str, frame: np.ndarray | None, same: bool = False) -> None:
        """One step's frame of camera `key` (copied: the caller may reuse its array). The same
        frame as the previous step's (a camera slower than the loop; `same` when the caller knows,
        else compared) is stored once: this step's rows stay empty (zeros, which the frame codecs
        store in a few bytes) and `repeat` points back."""
        store, pending = self.store, self._pending
        since = self._since.get(key)
        held = store._held_frames.get(key)
        if same:
            if held is None:
                raise StoreError(f"{self._where()}: camera '{key}' marked as repeating a frame before any frame")
            frame = held
        small = f"small/{key}" if store.train_image_size else None
        for path in (f"data/{key}", small):
            if path and pending[path].full:
                self._flush(path, final=False)
        if (store.frame_repeats and since is not None and since < MAX_REPEAT
                and (same or np.array_equal(frame, held))):
            self._since[key] = since + 1
            pending[f"repeat/{key}"].append(np.uint16(since + 1))
            pending[f"data/{key}"].append_blank()
            if small:
                pending[small].append_blank()
            return
        self._since[key] = 0
        pending[f"data/{key}"].append(frame)
        if store.frame_repeats:
            pending[f"repeat/{key}"].append(np.uint16(0))
        if frame is not held:  # the newest frame, kept to spot (or be) the next step's repeat
            if held is None:
                held = store._held_frames[key] = np.empty_like(frame)
            np.copyto(held, frame)
        if small:
            pending[small].append(resize_rgb(frame, store.train_image_size))

    def _flush_frames(self) -> None:
        for path in self.store._frame_paths:
            self._flush(path, final=False)

    def _sample_image_loss(self, frames: Mapping[str, np.ndarray]) -> None:
        """A lossy store measures what its codec loses on the episode's first frame per camera
        (PSNR, dB), kept in the episode's info: `dataset info` reports the worst."""
        quality = self.store.image_quality
        if quality is None or self._psnr_sample or not frames:
            return
        self._psnr_sample = {k.rsplit("/", 1)[-1]: round(psnr(f, decode_frame_jpeg(encode_jpeg(f, quality))), 2)
                             for k, f in frames.items()}

    def _flush(self, path: str, final: bool) -> None:
        """Write pending rows of array `path`: whole shards while recording, everything at commit."""
        pending = self._pending[path]
        if not pending:
            return
        arr = self.store._node(path)
        pos = self.start + self._flushed[path]
        upto = pos + len(pending)
        if not final:
            shard = arr.shards[0] if arr.shards else arr.chunks[0]
            upto = (upto // shard) * shard
            if upto <= pos:
                return
        n = upto - pos
        if arr.shape[0] < upto:
            arr.resize((upto, *arr.shape[1:]))
        if isinstance(pending, _FrameBuffer):
            arr[pos:upto] = pending.rows[:n]
            pending.drop(n)
        else:
            arr[pos:upto] = np.stack(pending[:n])
            del pending[:n]
        self._flushed[path] += n

    def commit(self, success: bool | None = None, **meta_updates: Any) -> int:
        """Make the episode visible. Data first, then its info, then its end (the commit point)."""
        self._require_open()
        if self.length == 0:
            raise SchemaError(f"{self._where()}: cannot commit an empty episode")
        if success is not None:
            self.meta.success = bool(success)
        for k, v in meta_updates.items():
            if not hasattr(self.meta, k):
                raise SchemaError(f"{self._where()}: unknown episode field {k!r}")
            setattr(self.meta, k, v)
        store = self.store
        if store.image_quality is not None and self._psnr_sample:
            self.meta.extra = {**(self.meta.extra or {}), "image_psnr_db": self._psnr_sample}
        for path in store._step_arrays:
            self._flush(path, final=True)
        end = self.start + self.length
        idx = store.n_episodes
        group = store._group
        info = group["meta/episode_info"]
        info.resize((idx + 1,))
        info[idx] = json.dumps(self.meta.to_json())
        ends = group["meta/episode_ends"]
        ends.resize((idx + 1,))
        ends[idx] = end  # the commit point
        store._ends = np.append(store._ends, np.int64(end))
        store._infos.append(self.meta)
        self._done = True
        return idx

    def discard(self) -> None:
        """Abandon the episode; rows already flushed are cut off the arrays."""
        if self._done:
            return
        self._done = True
        self.store._drop_uncommitted(quiet=True)  # asked for, not a crash: nothing to warn about

    def _require_open(self) -> None:
        if self._done:
            raise StoreError(f"{self._where()}: episode already committed or discarded")
        if self.store.n_steps != self.start:
            raise StoreError(f"{self._where()}: another episode was committed meanwhile; one writer at a time")


# ---------------------------------------------------------------------- helpers
class _FrameBuffer:
    """Pending frames of one camera array, in rows allocated once per store and reused by every
    episode: a fresh 1 MB array per frame costs page faults that, for three 640x480 cameras,
    took more CPU than encoding them (bench/data.py, real cameras)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, capacity: int):
        self.rows = np.empty((capacity, *shape), dtype=dtype)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    @property
    def full(self) -> bool:
        return self.n == len(self.rows)

    def append(self, frame: np.ndarray) -> None:
        self.rows[self.n] = frame
        self.n += 1

    def append_blank(self) -> None:
        self.rows[self.n] = 0
        self.n += 1

    def drop(self, k: int) -> None:
        """Forget the first k rows (written); the rest move to the front."""
        rest = self.n - k
        if rest:
            self.rows[:rest] = self.rows[k:self.n].copy()
        self.n = rest


EMPTY_CHUNK = 2**64 - 1  # a shard index's offset for a chunk never written


def _read_jpeg_shards(root: Path, node: zarr.Array, rows: slice | np.ndarray) -> np.ndarray:
    """Rows of a one-frame-per-chunk JPEG array, read from its shard files directly (zarr's
    sharding layout: the chunks' bytes, then an index of (offset, length) per chunk and its CRC32C;
    each chunk ends with its own CRC32C). A shard file is replaced whole by the writer, so one read
    of it is one version; a checksum that does not match raises ValueError and `read` tries again."""
    import google_crc32c

    idx = np.arange(*rows.indices(node.shape[0])) if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
    frame = node.shape[1:]
    out = np.empty((len(idx), *frame), dtype=np.uint8)
    per_shard = node.shards[0]
    index_bytes = per_shard * 16 + 4

    def checked(data: bytes, what: str) -> bytes:
        if int.from_bytes(data[-4:], "little") != google_crc32c.value(data[:-4]):
            raise ValueError(f"{root}: {what}: stored and computed checksum do not match")
        return data[:-4]

    # rows asked for again (a repeated frame: `idx` ascending with duplicates) are copied, not decoded again
    again = np.flatnonzero(np.diff(idx) == 0) + 1 if len(idx) > 1 and (np.diff(idx) >= 0).all() else np.zeros(0, int)
    fresh = np.ones(len(idx), dtype=bool)
    fresh[again] = False
    for shard in np.unique(idx // per_shard):
        at = np.flatnonzero((idx // per_shard == shard) & fresh)
        try:
            raw = (root / "c" / str(int(shard)) / "0" / "0" / "0").read_bytes()
        except FileNotFoundError:
            out[at] = 0  # never written: every frame in it is empty
            continue
        index = np.frombuffer(checked(raw[-index_bytes:], f"shard {shard} index"), "<u8").reshape(per_shard, 2)
        offsets, lengths = index[:, 0].tolist(), index[:, 1].tolist()
        for j, row in zip(at.tolist(), (idx[at] % per_shard).tolist()):
            offset = offsets[row]
            if offset == EMPTY_CHUNK:
                out[j] = 0
                continue
            chunk = checked(raw[offset:offset + lengths[row]], f"frame {idx[j]}")
            n = int.from_bytes(chunk[4:8], "little")  # one frame per chunk: count, then its length
            out[j] = decode_frame_jpeg(chunk[8:8 + n]).reshape(frame) if n else 0
    for j in again.tolist():  # in order, so a run of repeats copies the frame along
        out[j] = out[j - 1]
    return out


def _committed_prefix(ends: np.ndarray) -> int:
    """Number of leading entries that form strictly increasing positive ends.

    An entry that reads as the fill value (0) or does not increase was allocated by a resize but
    never written: the writer died between growing the array and writing the end.
    """
    if len(ends) == 0:
        return 0
    prev = np.concatenate([[0], ends[:-1]])
    ok = ends > prev
    return int(len(ends) if ok.all() else np.argmin(ok))


def _train_size(schema: Schema, size: Sequence[int] | None, where: str) -> tuple[int, int] | None:
    """The training-size copies' (height, width), checked; None when there are none to keep."""
    if size is None or not schema.image_keys:
        return None
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise StoreError(f"{where}: train_image_size={size!r}; give [height, width], e.g. [96, 96]") from None
    full = {k: schema.keys[k].shape[:2] for k in schema.image_keys}
    if h < 8 or w < 8 or any(h > fh or w > fw for fh, fw in full.values()):
        raise StoreError(f"{where}: train_image_size=[{h}, {w}] must be at least 8 px and no larger than the "
                         f"frames ({', '.join(f'{k}: {list(v)}' for k, v in full.items())})")
    if all(tuple(v) == (h, w) for v in full.values()):
        return None  # the frames are that size already
    return h, w


def _create_data_array(group: zarr.Group, key: str, shape: tuple[int, ...], dtype: str, is_image: bool, image_codec: str,
                       image_quality: int = DEFAULT_IMAGE_QUALITY, prefix: str = "data", shard: int = IMAGE_SHARD) -> None:
    if is_image and image_codec in LOSSY_IMAGE_CODECS:
        # One frame per chunk: an append never re-reads and re-encodes a stored frame (a second
        # lossy round on a committed episode), and a random read decodes one JPEG. The checksum
        # is all that follows the JPEG bytes.
        group.create_array(f"{prefix}/{key}", shape=(0, *shape), chunks=(1, *shape), shards=(shard, *shape),
                           dtype=dtype, serializer=jpeg_frames_codec(image_quality), compressors=(Crc32cCodec(),),
                           fill_value=0)
        return
    if is_image:
        chunks = (IMAGE_CHUNK, *shape)
        shards = (shard, *shape)
        compressors = IMAGE_CODECS[image_codec]()
    else:
        chunks = (LOWDIM_CHUNK, *shape)
        shards = (LOWDIM_SHARD, *shape)
        compressors = BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", typesize=np.dtype(dtype).itemsize)
    group.create_array(
        f"{prefix}/{key}",
        shape=(0, *shape),
        chunks=chunks,
        shards=shards,
        dtype=dtype,
        compressors=(compressors, Crc32cCodec()),  # checksum: torn or corrupted reads fail loudly
        fill_value=0,
    )


def _copy_into(src: EpisodeStore, dst: EpisodeStore, episodes: Iterable[int]) -> None:
    for i in episodes:
        ep = src.episode(i)
        ts = ep.pop(TIMESTAMP_KEY)
        seg = ep.pop(SEGMENT_KEY)
        dst.add_episode(ep, ts, seg, EpisodeMeta.from_json(src.meta(i).to_json()))


def _acquire_lock(root: Path) -> int:
    """One writer per store. flock is released by the kernel when the holder dies, even by SIGKILL."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreError(f"{root}: open for writing by another process (pid {holder}); one writer at a time") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _release_lock(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
