"""LeRobot datasets (format v2.0, v2.1 and v3.0) read into a new EpisodeStore.

A LeRobot dataset is a folder; `meta/info.json` says which format it is (`codebase_version`):

    v2.0 / v2.1                                         v3.0
    meta/info.json                                      meta/info.json
    meta/tasks.jsonl     {task_index, task} per line    meta/tasks.parquet   task_index + the task string
    meta/episodes.jsonl  {episode_index, tasks, length} meta/episodes/chunk-*/file-*.parquet  a row per episode
    data/chunk-C/episode_E.parquet    one episode       data/chunk-C/file-F.parquet          episodes back to back
    videos/chunk-C/<feature>/episode_E.mp4              videos/<feature>/chunk-C/file-F.mp4  episodes back to back

(the exact names come from info.json's `data_path` and `video_path` templates). info.json's
`features` declares every column as {dtype, shape, names}. Each data parquet row is one frame
with a column per non-video feature plus `timestamp` (seconds since the episode start),
`frame_index` (0.. within the episode), `episode_index`, `index` (0.. across the dataset) and
`task_index`. A `video` feature lives in mp4 files: frame k of an episode is the frame shown at
its `timestamp`, shifted in v3.0 by the episode's `videos/<feature>/from_timestamp` in its file.
An `image` feature sits in the parquet as {bytes, path} with PNG bytes.

How it maps into the store (the exporter, lerobot_export.py, writes the inverse):

    LeRobot feature                          store key
    observation.state                        obs/qpos
    observation.velocity                     obs/qvel
    observation.images.<cam> (video, image)  obs/images/<cam>     uint8 (H, W, 3)
    observation.<a>.<b>                      obs/<a>/<b>
    <a>.<b> (action, next.done, ...)         <a>/<b>

- Shapes and dtypes are the declared ones ([1] stays (1,)); a vector column may be
  fixed_size_list or plain list. `string` features have no place in a store and are skipped.
- Store timestamps: the `timestamp_recorded` column when present (our exporter writes the
  store's own times there); otherwise float64(`timestamp`) as is, so each episode starts at 0,
  as `robo-rl collect` and the HDF5 importer record them.
- Segment labels: the `segment` column when present, else TELEOP.
- EpisodeMeta: the episode's `robo_rl/episode_meta` JSON when present (our exporter writes it);
  otherwise the task of the episode's first step, source `lerobot:<folder>`, and in `extra` the
  LeRobot episode index and, if the episode has several, all its tasks.
- info.json's `robo_rl.schema` (our exporter writes it) restores the store's exact key shapes
  and dtypes, e.g. () where LeRobot says [1].

Every check below is made before a row is trusted, and each failure is a ConfigError naming the
file and the field: the version is one of v2.0, v2.1, v3.0; fps a positive integer; every
declared column present with the declared width and a dtype that casts safely to the declared
one; episodes listed 0..N-1 with their files
present; in the data, `episode_index` and `frame_index` agree with the episode list, `index`
counts without gaps, `task_index` names a task, `timestamp` (and `timestamp_recorded`) are
finite and increase within an episode; a video holds a frame of the declared size
at every step's time. OUT is checked first (robo_rl/data/outputs.py: never the source, and an
existing OUT is replaced only with overwrite=true and only if it is a store); the import writes
to OUT.importing and swaps it in only when all is written, so a failure leaves OUT as it was. Frames go to the store a block at a time, so an
episode's frames are never all in memory.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from robo_rl.data.codecs import VideoReader, decode_image
from robo_rl.data.outputs import check_destination, new_store
from robo_rl.data.schema import IMAGE_PREFIX, EpisodeMeta, KeySpec, Schema, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError, SchemaError

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
# Columns LeRobot writes for every frame; they are never store keys.
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
SEGMENT_COLUMN = "segment"  # our exporter: the store's Segment label per step
RECORDED_TIME_COLUMN = "timestamp_recorded"  # our exporter: the store's float64 timestamp per step
EPISODE_META_FIELD = "robo_rl/episode_meta"  # our exporter: EpisodeMeta JSON per episode
CAMERA_DTYPES = ("video", "image")
CAMERA_FEATURE_PREFIX = "observation.images."
BLOCK_STEPS = 64  # steps handed to the store at once: frames reach disk a shard at a time


# ---------------------------------------------------------------------- feature names <-> store keys
# The two features whose store names are not their LeRobot names with dots made slashes.
RENAMED_FEATURES = {"observation.state": "obs/qpos", "observation.velocity": "obs/qvel"}
RENAMED_KEYS = {key: name for name, key in RENAMED_FEATURES.items()}


def feature_to_key(name: str, camera: bool = False) -> str:
    """The store key of a LeRobot feature (see the table in the module docstring). A camera
    outside `observation.images.` (ported datasets have `observation.image`) becomes
    obs/images/<its last word>."""
    if name.startswith(CAMERA_FEATURE_PREFIX):
        return IMAGE_PREFIX + name[len(CAMERA_FEATURE_PREFIX):]
    if camera:
        return IMAGE_PREFIX + name.rsplit(".", 1)[-1]
    if name in RENAMED_FEATURES:
        return RENAMED_FEATURES[name]
    if name.startswith("observation."):
        return "obs/" + name[len("observation."):].replace(".", "/")
    return name.replace(".", "/")


def key_to_feature(key: str) -> str:
    """The LeRobot feature name of a store key: the inverse of `feature_to_key`."""
    if key.startswith(IMAGE_PREFIX):
        return CAMERA_FEATURE_PREFIX + key[len(IMAGE_PREFIX):]
    if key in RENAMED_KEYS:
        return RENAMED_KEYS[key]
    if key.startswith("obs/"):
        return "observation." + key[len("obs/"):].replace("/", ".")
    return key.replace("/", ".")


# ---------------------------------------------------------------------- what a dataset holds
@dataclass(frozen=True)
class Feature:
    """A feature that becomes a store key: its declared dtype (uint8 for cameras) and store shape."""

    name: str
    key: str
    kind: str  # "numeric", "video" or "image"
    dtype: str
    shape: tuple[int, ...]  # store shape: cameras (H, W, C) whatever order info.json declares
    declared_shape: tuple[int, ...]


@dataclass
class Episode:
    index: int
    length: int
    first_index: int  # its first frame's `index` (its row in the whole dataset)
    data_file: Path
    videos: dict[str, tuple[Path, float]]  # video feature -> (mp4, the episode's start time in it)
    listed_in: Path  # the metadata file that lists it, for messages
    meta: dict | None = None  # EpisodeMeta JSON written by our exporter


@dataclass
class LeRobotDataset:
    root: Path
    version: str
    fps: int
    robot_type: str | None
    features: dict[str, Feature]  # the features that become store keys
    tasks: dict[int, str]
    tasks_file: Path
    episodes: list[Episode]
    store_schema: dict[str, KeySpec] = field(default_factory=dict)  # info.json robo_rl.schema keys, if any
    skipped: list[str] = field(default_factory=list)  # string features: no place for them in a store

    @property
    def info_path(self) -> Path:
        return self.root / "meta" / "info.json"


def read_dataset(src: str | Path) -> LeRobotDataset:
    """Everything but the rows and frames, checked: info.json, tasks, the episode list, and that
    every file it names exists."""
    root = Path(src)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder; give a LeRobot dataset's root, the folder with meta/info.json")
    info_path = root / "meta" / "info.json"
    info = _read_info(info_path)
    version = info["codebase_version"]
    store_schema = _robo_rl_schema(info, info_path)
    features = _features(info, info_path, store_schema)
    skipped = [name for name, spec in info["features"].items() if spec["dtype"] == "string"]
    if version == "v3.0":
        tasks_file = root / "meta" / "tasks.parquet"
        tasks = _read_tasks_parquet(tasks_file)
        episodes = _read_v3_episodes(root, info, info_path, features)
    else:
        tasks_file = root / "meta" / "tasks.jsonl"
        tasks = _read_tasks_jsonl(tasks_file)
        episodes = _read_v2_episodes(root, info, info_path, features)
    if not episodes:
        raise ConfigError(f"{episodes_source(root, version)}: lists no episodes; there is nothing to import")
    for field_name, claimed, found in (("total_episodes", info.get("total_episodes"), len(episodes)),
                                       ("total_frames", info.get("total_frames"), sum(e.length for e in episodes))):
        if claimed is not None and claimed != found:
            raise ConfigError(f"{info_path}: {field_name}: says {claimed}, but {episodes_source(root, version)} "
                              f"lists {found}")
    return LeRobotDataset(root, version, int(info["fps"]), info.get("robot_type"), features, tasks, tasks_file,
                          episodes, store_schema, skipped)


def episodes_source(root: Path, version: str) -> Path:
    return root / "meta" / ("episodes" if version == "v3.0" else "episodes.jsonl")


def _read_info(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: missing; every LeRobot dataset has meta/info.json (is {path.parents[1]} the "
                          "dataset's root folder?)")
    try:
        info = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(info, dict):
        raise ConfigError(f"{path}: holds a {type(info).__name__}, expected a JSON object")
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError(f"{path}: codebase_version: {version!r} is not supported; this reads "
                          f"{', '.join(SUPPORTED_VERSIONS)} (convert older datasets with LeRobot first)")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0 or not float(fps).is_integer():
        raise ConfigError(f"{path}: fps: {fps!r}; LeRobot's fps is a positive integer")
    features = info.get("features")
    if not isinstance(features, dict) or not features:
        raise ConfigError(f"{path}: features: missing or empty; it declares every column as {{dtype, shape, names}}")
    for name, spec in features.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str):
            raise ConfigError(f"{path}: features.{name}: no dtype; each feature is {{dtype, shape, names}}")
        shape = spec.get("shape")
        if (not isinstance(shape, list) or not shape
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise ConfigError(f"{path}: features.{name}.shape: {shape!r}; expected a list of positive integers")
    if not isinstance(info.get("data_path"), str):
        raise ConfigError(f"{path}: data_path: missing; it is the template of the data files' paths")
    if any(f["dtype"] == "video" for f in features.values()) and not isinstance(info.get("video_path"), str):
        raise ConfigError(f"{path}: video_path: {info.get('video_path')!r}, but features declare video; it is the "
                          "template of the video files' paths")
    chunks_size = info.get("chunks_size", 1000)
    if isinstance(chunks_size, bool) or not isinstance(chunks_size, int) or chunks_size <= 0:
        raise ConfigError(f"{path}: chunks_size: {chunks_size!r}; expected a positive integer")
    return info


def _robo_rl_schema(info: dict, path: Path) -> dict[str, KeySpec]:
    """The store schema our exporter records in info.json, as {key: KeySpec}; {} for other datasets."""
    ours = info.get("robo_rl")
    if ours is None:
        return {}
    try:
        return dict(Schema.from_json(ours["schema"], where=str(path)).keys)
    except (SchemaError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: robo_rl.schema: not a robo_rl store schema ({type(e).__name__}: {e})") from None


def _camera_shape(name: str, spec: dict, path: Path) -> tuple[int, int, int]:
    """(H, W, C) of a camera feature. Most declare [H, W, C] with names [height, width, channel(s)];
    a few ports declare channels first, and say so in `names`."""
    shape = tuple(spec["shape"])
    names = spec.get("names")
    if len(shape) != 3:
        raise ConfigError(f"{path}: features.{name}.shape: {list(shape)}; a camera is [height, width, channels]")
    if isinstance(names, list) and names and names[0] in ("channel", "channels"):
        shape = (shape[1], shape[2], shape[0])
    channels = (3,) if spec["dtype"] == "video" else (1, 3)
    if shape[2] not in channels:
        raise ConfigError(f"{path}: features.{name}.shape: {spec['shape']} has {shape[2]} channels; "
                          f"a {spec['dtype']} feature is imported with {' or '.join(map(str, channels))}")
    return shape


def _features(info: dict, path: Path, store_schema: dict[str, KeySpec]) -> dict[str, Feature]:
    features: dict[str, Feature] = {}
    for name, spec in info["features"].items():
        dtype = spec["dtype"]
        if name in (*INDEX_COLUMNS, SEGMENT_COLUMN, RECORDED_TIME_COLUMN) or dtype == "string":
            continue
        declared = tuple(spec["shape"])
        if dtype in CAMERA_DTYPES:
            kind, store_dtype, shape = dtype, "uint8", _camera_shape(name, spec, path)
            key = feature_to_key(name, camera=True)
        else:
            try:
                store_dtype = np.dtype(dtype).name
            except TypeError:
                raise ConfigError(f"{path}: features.{name}.dtype: {dtype!r} is not a numpy dtype, "
                                  "string, image or video") from None
            kind, shape, key = "numeric", declared, feature_to_key(name)
        if key in store_schema:  # our own export: the store's exact shape and dtype
            ours = store_schema[key]
            if math.prod(ours.shape) != math.prod(shape):
                raise ConfigError(f"{path}: robo_rl.schema.keys.{key}.shape: {list(ours.shape)} does not fit "
                                  f"features.{name}.shape {list(declared)}")
            shape, store_dtype = ours.shape, ours.dtype
        clash = next((f.name for f in features.values() if f.key == key), None)
        if clash:
            raise ConfigError(f"{path}: features.{name}: becomes store key {key!r}, as features.{clash} does; "
                              "rename one of them")
        try:
            KeySpec(key, shape, store_dtype)
        except SchemaError as e:
            raise ConfigError(f"{path}: features.{name}: cannot be a store key ({e})") from None
        features[name] = Feature(name, key, kind, store_dtype, shape, declared)
    missing = sorted(set(store_schema) - {f.key for f in features.values()})
    if missing:
        raise ConfigError(f"{path}: robo_rl.schema.keys: {missing} have no feature ({[key_to_feature(k) for k in missing]})")
    if not features:
        raise ConfigError(f"{path}: features: declares nothing to import besides {', '.join(INDEX_COLUMNS)}")
    return features


def _format_path(template: str, info_path: Path, field_name: str, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"{info_path}: {field_name}: {template!r} does not fill in with "
                          f"{', '.join(values)} ({type(e).__name__}: {e})") from None


def _read_jsonl(path: Path, what: str) -> list[dict]:
    if not path.is_file():
        raise ConfigError(f"{path}: missing; a LeRobot v2 dataset lists its {what} there")
    lines = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}: line {n}: not valid JSON ({e})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: line {n}: holds a {type(value).__name__}, expected a JSON object")
        lines.append(value | {"_line": n})
    return lines


def _int_field(value: Any, where: str, field_name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{where}: {field_name}: {value!r}; expected an integer >= {minimum}")
    return int(value)


def _read_tasks_jsonl(path: Path) -> dict[int, str]:
    tasks = {}
    for line in _read_jsonl(path, "tasks"):
        where = f"{path}: line {line['_line']}"
        index = _int_field(line.get("task_index"), where, "task_index")
        if not isinstance(line.get("task"), str):
            raise ConfigError(f"{where}: task: {line.get('task')!r}; expected the task's text")
        tasks[index] = line["task"]
    return tasks


def _read_tasks_parquet(path: Path) -> dict[int, str]:
    """v3.0 tasks: pandas wrote a DataFrame indexed by the task strings; pandas metadata names the
    index column (`task` in newer LeRobot, `__index_level_0__` in 0.4.x)."""
    table = _read_parquet(path)
    names = table.column_names
    pandas_meta = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    candidates = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)] + ["task", "__index_level_0__"]
    column = next((c for c in candidates if c in names), None)
    if "task_index" not in names or column is None:
        raise ConfigError(f"{path}: columns {names}; expected task_index and the task strings (column task or "
                          "__index_level_0__)")
    tasks = {}
    for row, (index, task) in enumerate(zip(table["task_index"].to_pylist(), table[column].to_pylist())):
        index = _int_field(index, f"{path}: row {row}", "task_index")
        if not isinstance(task, str):
            raise ConfigError(f"{path}: row {row}: {column}: {task!r}; expected the task's text")
        tasks[index] = task
    return tasks


def _read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    if not path.is_file():
        raise ConfigError(f"{path}: missing")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None


def _video_features(features: dict[str, Feature]) -> list[str]:
    return [f.name for f in features.values() if f.kind == "video"]


def _check_exists(path: Path, where: str, what: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{where}: names {what} {path}, which does not exist")
    return path


def _episode_meta_json(value: Any, where: str) -> dict | None:
    """The EpisodeMeta our exporter stores with an episode (a JSON string, or an object in v2 jsonl)."""
    if value is None:
        return None
    try:
        meta = json.loads(value) if isinstance(value, str) else value
    except ValueError as e:
        raise ConfigError(f"{where}: {EPISODE_META_FIELD}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: {EPISODE_META_FIELD}: holds a {type(meta).__name__}, expected a JSON object")
    return meta


def _read_v2_episodes(root: Path, info: dict, info_path: Path, features: dict[str, Feature]) -> list[Episode]:
    listing = root / "meta" / "episodes.jsonl"
    lines = sorted(_read_jsonl(listing, "episodes"),
                   key=lambda x: x.get("episode_index") if isinstance(x.get("episode_index"), int) else -1)
    chunks_size = info.get("chunks_size", 1000)
    episodes = []
    first_index = 0
    for position, line in enumerate(lines):
        where = f"{listing}: line {line['_line']}"
        index = _int_field(line.get("episode_index"), where, "episode_index")
        if index != position:
            raise ConfigError(f"{where}: episode_index: {index}; the episodes are 0..{len(lines) - 1}, each once "
                              f"(episode {position} is missing or listed twice)")
        length = _int_field(line.get("length"), where, "length", minimum=1)
        chunk = index // chunks_size
        where = f"{listing}: episode {index}"
        data = root / _format_path(info["data_path"], info_path, "data_path", episode_chunk=chunk, episode_index=index)
        _check_exists(data, where, "data file")
        videos = {}
        for name in _video_features(features):
            mp4 = root / _format_path(info["video_path"], info_path, "video_path", episode_chunk=chunk,
                                      video_key=name, episode_index=index)
            videos[name] = (_check_exists(mp4, where, f"video of {name}"), 0.0)
        episodes.append(Episode(index, length, first_index, data, videos, listing,
                                _episode_meta_json(line.get(EPISODE_META_FIELD), where)))
        first_index += length
    return episodes


def _read_v3_episodes(root: Path, info: dict, info_path: Path, features: dict[str, Feature]) -> list[Episode]:
    folder = root / "meta" / "episodes"
    files = sorted(folder.glob("*/*.parquet"))
    if not files:
        raise ConfigError(f"{folder}: no chunk-*/file-*.parquet; a v3.0 dataset lists its episodes there")
    videos = _video_features(features)
    required = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
                "dataset_to_index"]
    for name in videos:
        required += [f"videos/{name}/chunk_index", f"videos/{name}/file_index", f"videos/{name}/from_timestamp"]
    episodes: list[Episode] = []
    data_files_done: set[Path] = set()  # data files whose episodes are all listed: one may not come back
    for listing in files:
        try:
            names = pq.read_schema(listing).names
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{listing}: cannot read as parquet ({type(e).__name__}: {e})") from None
        missing = [c for c in required if c not in names]
        if missing:
            raise ConfigError(f"{listing}: no column {', '.join(map(repr, missing))}; a v3.0 episodes file has "
                              f"{', '.join(required)}")
        wanted = required + [c for c in (EPISODE_META_FIELD,) if c in names]
        for row in _read_parquet(listing, wanted).to_pylist():
            position = len(episodes)
            where = f"{listing}: episode {position}"
            index = _int_field(row["episode_index"], where, "episode_index")
            if index != position:
                raise ConfigError(f"{listing}: episode_index: {index} where episode {position} is due; the rows of "
                                  "meta/episodes (files in name order) list episodes 0, 1, 2, ... each once")
            length = _int_field(row["length"], where, "length", minimum=1)
            start = _int_field(row["dataset_from_index"], where, "dataset_from_index")
            stop = _int_field(row["dataset_to_index"], where, "dataset_to_index")
            expected_start = episodes[-1].first_index + episodes[-1].length if episodes else 0
            if start != expected_start or stop - start != length:
                raise ConfigError(f"{where}: dataset_from_index, dataset_to_index: [{start}, {stop}) for length "
                                  f"{length}; expected [{expected_start}, {expected_start + length}) right after "
                                  "the previous episode")
            chunk = _int_field(row["data/chunk_index"], where, "data/chunk_index")
            file_index = _int_field(row["data/file_index"], where, "data/file_index")
            data = root / _format_path(info["data_path"], info_path, "data_path", chunk_index=chunk, file_index=file_index)
            _check_exists(data, f"{where}: data/chunk_index={chunk}, data/file_index={file_index}", "data file")
            if episodes and episodes[-1].data_file != data:
                data_files_done.add(episodes[-1].data_file)
            if data in data_files_done:
                raise ConfigError(f"{where}: data/file_index: {file_index} goes back to {data.name} after other files; "
                                  "a data file holds consecutive episodes")
            spans = {}
            for name in videos:
                v_chunk = _int_field(row[f"videos/{name}/chunk_index"], where, f"videos/{name}/chunk_index")
                v_file = _int_field(row[f"videos/{name}/file_index"], where, f"videos/{name}/file_index")
                start_s = row[f"videos/{name}/from_timestamp"]
                if not isinstance(start_s, (int, float)) or not start_s >= 0:
                    raise ConfigError(f"{where}: videos/{name}/from_timestamp: {start_s!r}; expected seconds >= 0")
                mp4 = root / _format_path(info["video_path"], info_path, "video_path", video_key=name,
                                          chunk_index=v_chunk, file_index=v_file)
                spans[name] = (_check_exists(mp4, f"{where}: videos/{name}/file_index={v_file}", "video"),
                               float(start_s))
            episodes.append(Episode(index, length, start, data, spans, listing,
                                    _episode_meta_json(row.get(EPISODE_META_FIELD), where)))
    return episodes


# ---------------------------------------------------------------------- data files
def column_values(column: pa.ChunkedArray, shape: tuple[int, ...], path: Path, name: str, info_path: Path) -> np.ndarray:
    """A column as a (rows, *shape) array, whether it is scalar, fixed_size_list, list or nested lists."""
    values = column.combine_chunks()
    if isinstance(values.type, pa.ExtensionType):  # datasets' Array2D..5D
        values = values.storage
    rows = len(values)
    width = 1
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        if values.null_count:
            raise ConfigError(f"{path}: column '{name}': holds nulls")
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise ConfigError(f"{path}: column '{name}': rows hold from {lengths.min() * width} to "
                              f"{lengths.max() * width} values; {info_path.name} features.{name}.shape says "
                              f"{list(shape)}")
        width *= int(lengths[0]) if len(lengths) else 1
        values = values.flatten()
    if values.null_count:
        raise ConfigError(f"{path}: column '{name}': holds nulls")
    if rows and width != math.prod(shape):
        raise ConfigError(f"{path}: column '{name}': {width} value(s) per row; {info_path.name} "
                          f"features.{name}.shape says {list(shape)}")
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise ConfigError(f"{path}: column '{name}': holds {values.type}, not numbers")
    return values.to_numpy(zero_copy_only=False).reshape(rows, *shape)


class DataFile:
    """One data parquet: numeric columns read whole (small), camera images streamed a block at a
    time, episodes taken from the top in order."""

    def __init__(self, ds: LeRobotDataset, path: Path):
        self.path = path
        try:
            self._file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None
        try:
            self._load(ds)
        except BaseException:
            self._file.close()
            raise

    def _load(self, ds: LeRobotDataset) -> None:
        path = self.path
        names = self._file.schema_arrow.names
        rel = path.relative_to(ds.root)
        for name in INDEX_COLUMNS:
            if name not in names:
                raise ConfigError(f"{path}: no column '{name}'; every LeRobot data file has {', '.join(INDEX_COLUMNS)}")
        for feature in ds.features.values():
            if feature.kind != "video" and feature.name not in names:
                raise ConfigError(f"{ds.info_path}: features.{feature.name}: declared but {rel} has no column "
                                  f"'{feature.name}'")
        numeric = [f for f in ds.features.values() if f.kind == "numeric"]
        extras = [c for c in (SEGMENT_COLUMN, RECORDED_TIME_COLUMN) if c in names]
        table = self._read([f.name for f in numeric] + list(INDEX_COLUMNS) + extras)
        self.rows = table.num_rows
        self.columns: dict[str, np.ndarray] = {}
        for f in numeric:
            array = column_values(table[f.name], f.declared_shape, path, f.name, ds.info_path)
            _check_dtype(array.dtype, f.dtype, path, f.name, ds.info_path)
            self.columns[f.name] = array.reshape(self.rows, *f.shape).astype(f.dtype, copy=False)
        for name in (*INDEX_COLUMNS, *extras):
            self.columns[name] = column_values(table[name], (1,), path, name, ds.info_path)[:, 0]
        if RECORDED_TIME_COLUMN in self.columns:
            _check_dtype(self.columns[RECORDED_TIME_COLUMN].dtype, "float64", path, RECORDED_TIME_COLUMN, ds.info_path)
        self.images = [f for f in ds.features.values() if f.kind == "image"]
        self._image_batches = (self._file.iter_batches(batch_size=BLOCK_STEPS, columns=[f.name for f in self.images])
                               if self.images else None)
        self._image_rows: list[pa.RecordBatch] = []
        self.position = 0  # the next row an episode starts at

    def _read(self, columns: list[str]) -> pa.Table:
        try:
            return self._file.read(columns=columns)
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{self.path}: cannot read as parquet ({type(e).__name__}: {e})") from None

    def take(self, ds: LeRobotDataset, ep: Episode) -> dict[str, np.ndarray]:
        """The next `ep.length` rows, checked to be that episode's frames, in order."""
        a, b = self.position, self.position + ep.length
        if b > self.rows:
            raise ConfigError(f"{self.path}: has {self.rows} rows; episode {ep.index} ({ep.length} steps in "
                              f"{ep.listed_in.name}) would need rows {a}..{b - 1}")
        cols = {name: values[a:b] for name, values in self.columns.items()}
        steps = np.arange(ep.length)
        self._expect(cols["episode_index"], np.full(ep.length, ep.index), "episode_index", ep, a,
                     f"{ep.listed_in.name} puts episode {ep.index} ({ep.length} steps) here")
        self._expect(cols["frame_index"], steps, "frame_index", ep, a, "it restarts at 0 each episode and counts up by 1")
        self._expect(cols["index"], ep.first_index + steps, "index", ep, a,
                     "it counts the dataset's frames from 0 without gaps")
        for name in ("timestamp", RECORDED_TIME_COLUMN):
            if name in cols:
                self._check_times(cols[name].astype(np.float64), name, ep)
        unknown = ~np.isin(cols["task_index"], list(ds.tasks))
        if unknown.any():
            step = int(np.argmax(unknown))
            raise ConfigError(f"{self.path}: task_index: episode {ep.index} step {step} is {cols['task_index'][step]}; "
                              f"{ds.tasks_file.name} has task_index {sorted(ds.tasks)}")
        if SEGMENT_COLUMN in cols:
            bad = (cols[SEGMENT_COLUMN] < 0) | (cols[SEGMENT_COLUMN] >= len(Segment))
            if bad.any():
                step = int(np.argmax(bad))
                raise ConfigError(f"{self.path}: {SEGMENT_COLUMN}: episode {ep.index} step {step} is "
                                  f"{cols[SEGMENT_COLUMN][step]}; labels are 0..{len(Segment) - 1}")
        for feature in ds.features.values():
            values = cols.get(feature.name)
            if values is not None and values.dtype.kind == "f" and not np.isfinite(values).all():
                step = int(np.argmax(~np.isfinite(values.reshape(len(values), -1)).all(axis=1)))
                raise ConfigError(f"{self.path}: column '{feature.name}': episode {ep.index} step {step} holds NaN "
                                  "or inf; a store holds finite numbers")
        self.position = b
        return cols

    def _check_times(self, time: np.ndarray, column: str, ep: Episode) -> None:
        finite = np.isfinite(time)
        if not finite.all() or (len(time) > 1 and not (np.diff(time) > 0).all()):
            bad = int(np.argmax(~finite)) if not finite.all() else int(np.argmax(np.diff(time) <= 0)) + 1
            raise ConfigError(f"{self.path}: {column}: episode {ep.index} step {bad} is {float(time[bad])!r}; "
                              "timestamps are finite and increase within an episode")

    def _expect(self, got: np.ndarray, want: np.ndarray, column: str, ep: Episode, first_row: int, why: str) -> None:
        if not np.array_equal(got, want):
            step = int(np.argmax(got != want))
            raise ConfigError(f"{self.path}: {column}: row {first_row + step} (episode {ep.index} step {step}) is "
                              f"{got[step]}, expected {want[step]}; {why}")

    def images_block(self, n: int) -> dict[str, list[Any]]:
        """The next n rows of the image columns, each cell {bytes, path}."""
        out: dict[str, list[Any]] = {f.name: [] for f in self.images}
        while n > 0:
            if not self._image_rows:
                batch = next(self._image_batches, None)
                if batch is None:
                    raise ConfigError(f"{self.path}: image rows ran out before the numeric ones")
                self._image_rows.append(batch)
            batch = self._image_rows[0]
            take = min(n, batch.num_rows)
            for f in self.images:
                out[f.name] += batch.column(f.name).slice(0, take).to_pylist()
            if take == batch.num_rows:
                self._image_rows.pop(0)
            else:
                self._image_rows[0] = batch.slice(take)
            n -= take
        return out

    def finish(self, listed_in: Path) -> None:
        """Check every row was taken, then close the file."""
        self.close()
        if self.position != self.rows:
            extra = np.unique(self.columns["episode_index"][self.position:])
            raise ConfigError(f"{self.path}: episode_index: rows {self.position}..{self.rows - 1} (episodes "
                              f"{extra.tolist()}) belong to no episode {listed_in.name} puts in this file")

    def close(self) -> None:
        self._image_batches = None
        self._file.close()


def _check_dtype(actual: np.dtype, declared: str, path: Path, name: str, info_path: Path) -> None:
    """A column's values must fit the declared dtype without loss (int32 into int64 does, float64 into
    float32 or int64 does not)."""
    if actual != np.dtype(declared) and not np.can_cast(actual, declared, "safe"):
        raise ConfigError(f"{path}: column '{name}' holds {actual.name}; {info_path}: features.{name}.dtype says "
                          f"{np.dtype(declared).name}")


# ---------------------------------------------------------------------- import
def import_lerobot(src: str | Path, out: str | Path, *, overwrite: bool = False, robot: str | None = None,
                   progress: bool = True, train_image_size: Sequence[int] | None = None) -> EpisodeStore:
    """A local LeRobot dataset (v2.0, v2.1 or v3.0) into a new store at `out`; all or nothing.
    Returns the store, opened read-only."""
    out = check_destination(out, overwrite, sources=[src], marker="zarr.json", kind="robo_rl store")
    ds = read_dataset(src)  # every metadata check before anything is written
    keys = {f.key: KeySpec(f.key, f.shape, f.dtype) for f in ds.features.values()}
    schema = Schema(keys=keys, fps=float(ds.fps), robot=robot or ds.robot_type or "unknown")
    with new_store(out, schema, train_image_size) as store:
        _write_episodes(ds, store, progress)
    if ds.skipped:  # said once the import has worked, so a failure stays one line
        log.warning("%s: string feature(s) %s not imported: a store holds numbers and images",
                    ds.info_path, ", ".join(ds.skipped))
    return EpisodeStore.open(out)


def _write_episodes(ds: LeRobotDataset, store: EpisodeStore, progress: bool) -> None:
    from tqdm import tqdm

    readers: dict[str, VideoReader] = {}  # video feature -> its open mp4
    data: DataFile | None = None
    previous: Episode | None = None
    # `disable` only when asked: passing it at all would override the TQDM_DISABLE environment variable
    bar = tqdm(total=len(ds.episodes), desc=f"import {ds.root.name}", unit="episode", dynamic_ncols=True,
               **({} if progress else {"disable": True}))
    try:
        for ep in ds.episodes:
            if data is None or data.path != ep.data_file:
                if data is not None:
                    data.finish(previous.listed_in)
                data = DataFile(ds, ep.data_file)
            cols = data.take(ds, ep)
            times = cols[RECORDED_TIME_COLUMN if RECORDED_TIME_COLUMN in cols else "timestamp"].astype(np.float64)
            segments = cols[SEGMENT_COLUMN].astype(np.uint8) if SEGMENT_COLUMN in cols else Segment.TELEOP
            for name, (mp4, _) in ep.videos.items():
                if name not in readers or readers[name].path != mp4:
                    if name in readers:
                        readers.pop(name).close()
                    readers[name] = VideoReader(mp4, name, ds.fps, ds.features[name].shape)
            writer = store.begin_episode(_episode_meta(ds, ep, cols["task_index"]))
            for a in range(0, ep.length, BLOCK_STEPS):
                b = min(ep.length, a + BLOCK_STEPS)
                block = {f.key: cols[f.name][a:b] for f in ds.features.values() if f.kind == "numeric"}
                for name, (mp4, start_s) in ep.videos.items():
                    video_times = start_s + cols["timestamp"][a:b].astype(np.float64)
                    block[ds.features[name].key] = np.stack([
                        readers[name].frame_at(t, f"episode {ep.index} step {a + k}") for k, t in enumerate(video_times)])
                if data.images:
                    cells = data.images_block(b - a)
                    for f in data.images:
                        block[f.key] = np.stack([
                            decode_image(cell, f.shape, f"{ep.data_file}: {f.name}: episode {ep.index} step {a + k}")
                            for k, cell in enumerate(cells[f.name])])
                writer.add_block(block, times[a:b], segments if isinstance(segments, Segment) else segments[a:b])
            writer.commit()
            previous = ep
            bar.update()
        if data is not None:
            data.finish(previous.listed_in)
    finally:
        if data is not None:
            data.close()
        for reader in readers.values():
            reader.close()
        bar.close()


def _episode_meta(ds: LeRobotDataset, ep: Episode, task_index: np.ndarray) -> EpisodeMeta:
    if ep.meta is not None:
        return EpisodeMeta.from_json(ep.meta)
    tasks = [ds.tasks[int(i)] for i in dict.fromkeys(task_index.tolist())]  # in order of first use
    extra: dict[str, Any] = {"lerobot_episode_index": ep.index}
    if len(tasks) > 1:
        extra["tasks"] = tasks
    return EpisodeMeta(task=tasks[0], source=f"lerobot:{ds.root.resolve().name}", extra=extra)

