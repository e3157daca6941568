"""LeRobot import: datasets laid out by tests/lerobot_files.py exactly as LeRobot v2.1 and v3.0
write them (pyarrow + PyAV, no robo_rl code) become stores with the same numbers, episodes, tasks
and camera frames; a dataset that is not what it claims to be fails with one line naming the
file and the field, and leaves nothing behind (an existing OUT stays as it was)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobot_files import CAMERAS, NUMERIC, TASKS, LeRobotFiles, write_dataset, write_mp4
from PIL import Image

from robo_rl.data.codecs import VideoReader, decode_image
from robo_rl.data.lerobot import feature_to_key, import_lerobot, key_to_feature
from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

ROBO_RL = Path(sys.executable).parent / "robo-rl"
MIN_PSNR_DB = 30.0


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROBO_RL), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TQDM_DISABLE": "1", "MUJOCO_GL": "egl"},
                          cwd=Path(__file__).parents[1], stdin=subprocess.DEVNULL)


def assert_matches(store: EpisodeStore, fx: LeRobotFiles) -> dict[str, float]:
    """The store holds what `fx` wrote; returns each camera's PSNR (dB) against the source frames."""
    assert store.n_episodes == len(fx.lengths)
    assert store.episode_lengths.tolist() == fx.lengths
    assert store.schema.fps == fx.fps and store.schema.robot == fx.robot_type
    assert store.schema.cameras == ["top", "wrist"]
    expected_keys = {feature_to_key(name): (shape, dtype) for name, (dtype, shape) in NUMERIC.items()}
    expected_keys |= {feature_to_key(cam): ((32, 48, 3), "uint8") for cam in CAMERAS}
    assert {k: (s.shape, s.dtype) for k, s in store.schema.keys.items()} == expected_keys  # no string feature
    for name in NUMERIC:
        got = store.read(feature_to_key(name))
        assert got.dtype == fx.columns[name].dtype and np.array_equal(got, fx.columns[name]), name

    # LeRobot's timestamp as is: each episode starts at 0 (as robo-rl collect records), one period a step
    times = store.read("timestamp")
    for e in range(store.n_episodes):
        s, t = store.episode_range(e)
        assert np.allclose(times[s:t], np.arange(t - s) / fx.fps, atol=1e-6), (e, times[s:t])
    assert (store.read("segment") == Segment.TELEOP).all()
    for e, meta in enumerate(store.metas):
        s, _ = store.episode_range(e)
        assert meta.task == TASKS[fx.task_index[s]]
        assert meta.source == f"lerobot:{fx.root.name}" and meta.extra["lerobot_episode_index"] == e
        assert meta.extra.get("tasks") == ([TASKS[1], TASKS[0]] if e == 1 else None)  # episode 1 changes task

    quality = {}
    for cam in CAMERAS:
        source, got = fx.frames[cam], store.read(feature_to_key(cam))
        if fx.camera_dtypes[cam] == "image":
            assert np.array_equal(got, source), f"{cam}: PNG frames are lossless"
            continue
        quality[cam] = psnr(got, source)
        assert quality[cam] > MIN_PSNR_DB, f"{cam}: PSNR {quality[cam]:.1f} dB against the source frames"
        # each frame is nearest to its own source frame: no shift within or across episodes
        error = np.abs(got[:, None].astype(np.int16) - source[None].astype(np.int16)).mean(axis=(2, 3, 4))
        assert (error.argmin(axis=1) == np.arange(len(got))).all(), f"{cam}: frames out of place"
    return quality


@pytest.mark.parametrize("version,codec,fps", [("v2.1", "libsvtav1", 10), ("v2.1", "h264", 30),
                                               ("v3.0", "libsvtav1", 30), ("v3.0", "h264", 10)])
def test_an_import_holds_the_datasets_numbers_episodes_tasks_and_frames(tmp_path, version, codec, fps):
    fx = write_dataset(tmp_path / "pick_cube", version, codec=codec, fps=fps)
    with import_lerobot(fx.root, tmp_path / "store", progress=False) as store:
        assert not store.writable
        quality = assert_matches(store, fx)
    print(f"{version} {codec}: PSNR " + ", ".join(f"{cam} {db:.1f} dB" for cam, db in quality.items()))


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_png_images_in_the_parquet_and_plain_list_columns_import(tmp_path, version):
    """Ported hub datasets: a camera of dtype image (PNG bytes in the parquet), vectors as list<float>;
    the v3.0 tasks file names its index `task` (newer LeRobot) instead of __index_level_0__."""
    extra = {"task_index_name": "task"} if version == "v3.0" else {}
    fx = write_dataset(tmp_path / "ported", version, codec="h264", image_camera=True, fixed_size_lists=False, **extra)
    assert pa.types.is_list(pq.read_schema(next((fx.root / "data").rglob("*.parquet"))).field("observation.state").type)
    with import_lerobot(fx.root, tmp_path / "store", progress=False, robot="vx300s") as store:
        assert store.schema.robot == "vx300s"
        fx.robot_type = "vx300s"
        assert_matches(store, fx)


def test_v20_reads_like_v21(tmp_path):
    fx = write_dataset(tmp_path / "old", "v2.1", codec="h264")
    edit_info(fx.root, lambda info: info.update(codebase_version="v2.0"))
    (fx.root / "meta" / "episodes_stats.jsonl").unlink()  # v2.0 had meta/stats.json instead
    with import_lerobot(fx.root, tmp_path / "store", progress=False) as store:
        assert_matches(store, fx)


def test_the_video_reader_finds_an_episode_inside_a_joined_video(tmp_path):
    """v3.0: the last episode's frames from its from_timestamp in a file of three (a seek, 3.1 s in)."""
    fx = write_dataset(tmp_path / "joined", "v3.0", codec="libsvtav1")
    (mp4,) = fx.video_files[CAMERAS[0]]
    start, n = fx.starts[2], fx.lengths[2]
    reader = VideoReader(mp4, CAMERAS[0], fx.fps)
    try:
        frames = np.stack([reader.frame_at((start + k) / fx.fps, f"frame {k}") for k in range(n)])
    finally:
        reader.close()
    source = fx.frames[CAMERAS[0]][start:start + n]
    assert psnr(frames, source) > MIN_PSNR_DB, f"PSNR {psnr(frames, source):.1f} dB"
    error = np.abs(frames[:, None].astype(np.int16) - source[None].astype(np.int16)).mean(axis=(2, 3, 4))
    assert (error.argmin(axis=1) == np.arange(n)).all()


def test_our_own_columns_restore_segments_times_episode_facts_and_shapes(tmp_path):
    """What our exporter adds to a v3.0 dataset (segment, timestamp_recorded, robo_rl/episode_meta,
    info.json robo_rl.schema) comes back exactly; LeRobot itself ignores all four."""
    fx = write_dataset(tmp_path / "ours", "v3.0", codec="h264")
    n = sum(fx.lengths)
    segments = np.arange(n) % len(Segment)
    recorded = 1.7e9 + np.cumsum(np.full(n, 0.1)) + np.linspace(0, 1e-3, n)  # jitter k/fps cannot hold
    for path in sorted((fx.root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        rows = table["index"].to_numpy()
        table = table.append_column("segment", pa.array(segments[rows], pa.int64()))
        table = table.append_column("timestamp_recorded", pa.array(recorded[rows], pa.float64()))
        pq.write_table(table, path)
    metas = [EpisodeMeta(task=f"task {e}", success=e != 1, source="sim", operator="ana", start_time=1.7e9 + e,
                         notes="n", extra={"rac": {"round": e}}) for e in range(len(fx.lengths))]
    for path in sorted((fx.root / "meta" / "episodes").rglob("*.parquet")):
        table = pq.read_table(path)
        texts = [json.dumps(metas[e].to_json()) for e in table["episode_index"].to_pylist()]
        pq.write_table(table.append_column("robo_rl/episode_meta", pa.array(texts, pa.string())), path)
    keys = {feature_to_key(name): (shape, dtype) for name, (dtype, shape) in NUMERIC.items()}
    keys |= {"next/reward": ((), "float32"), "next/done": ((), "bool")}  # the store's scalars
    keys |= {feature_to_key(cam): ((32, 48, 3), "uint8") for cam in CAMERAS}
    info = json.loads((fx.root / "meta" / "info.json").read_text())
    info["features"]["segment"] = {"dtype": "int64", "shape": [1], "names": None}
    info["features"]["timestamp_recorded"] = {"dtype": "float64", "shape": [1], "names": None}
    info["robo_rl"] = {"schema": Schema.build(keys, fps=fx.fps, robot="aloha").to_json()}
    (fx.root / "meta" / "info.json").write_text(json.dumps(info))

    with import_lerobot(fx.root, tmp_path / "store", progress=False) as store:
        assert np.array_equal(store.read("segment"), segments)
        assert np.array_equal(store.read("timestamp"), recorded)
        assert [m.to_json() for m in store.metas] == [m.to_json() for m in metas]
        assert store.schema.keys["next/reward"].shape == () and store.schema.keys["next/done"].dtype == "bool"
        assert np.array_equal(store.read("next/reward"), fx.columns["next.reward"][:, 0])
        assert np.array_equal(store.read("obs/qpos"), fx.columns["observation.state"])


def test_png_cells_decode_to_rgb_whatever_their_mode():
    """cv2 reads BGR(A) and gray; an image feature comes back RGB (or gray where declared with 1 channel)."""
    rgb = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)

    def png(array: np.ndarray, mode: str) -> dict:
        buffer = io.BytesIO()
        Image.fromarray(array).convert(mode).save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": "x.png"}

    assert np.array_equal(decode_image(png(rgb, "RGB"), (6, 8, 3), "x"), rgb)
    assert np.array_equal(decode_image(png(rgb, "RGBA"), (6, 8, 3), "x"), rgb)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    assert np.array_equal(decode_image(png(rgb, "L"), (6, 8, 3), "x"), np.repeat(gray[..., None], 3, axis=2))
    assert np.array_equal(decode_image(png(rgb, "L"), (6, 8, 1), "x"), gray[..., None])
    with pytest.raises(ConfigError, match="x: image is 8x6; info.json declares 4x6"):
        decode_image(png(rgb, "RGB"), (6, 4, 3), "x")
    with pytest.raises(ConfigError, match="does not decode"):
        decode_image({"bytes": b"not a png", "path": None}, (6, 8, 3), "x")


def test_feature_names_and_store_keys_map_both_ways():
    pairs = {"observation.state": "obs/qpos", "observation.velocity": "obs/qvel", "action": "action",
             "observation.images.cam_high": "obs/images/cam_high", "observation.environment_state":
             "obs/environment_state", "observation.effort.left": "obs/effort/left", "next.done": "next/done"}
    for name, key in pairs.items():
        assert feature_to_key(name) == key and key_to_feature(key) == name
    assert feature_to_key("observation.image", camera=True) == "obs/images/image"  # pusht-style camera


def test_the_cli_imports_and_refuses_to_replace_a_store(tmp_path):
    fx = write_dataset(tmp_path / "pick_cube", "v3.0", codec="h264")
    out = tmp_path / "store"
    r = cli("dataset", "import-lerobot", fx.root, out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{out}: 3 episode(s), 40 steps at 10 fps from {fx.root}, cameras top, wrist"
    r = cli("dataset", "import-lerobot", fx.root, out)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "already exists" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert EpisodeStore.open(out).n_episodes == 3
    r = cli("dataset", "import-lerobot", fx.root, out, "overwrite=true", "robot_name=vx300s")
    assert r.returncode == 0, r.stderr
    assert EpisodeStore.open(out).schema.robot == "vx300s" and not out.with_name("store.importing").exists()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".importing" in p.name or ".old-" in p.name)


def test_a_failed_import_with_overwrite_keeps_the_old_store(tmp_path, good_datasets):
    out = tmp_path / "store"
    import_lerobot(good_datasets["v2.1"], out, progress=False).close()
    src = tmp_path / "damaged"
    shutil.copytree(good_datasets["v2.1"], src)
    short_video(src)
    r = cli("dataset", "import-lerobot", src, out, "overwrite=true")
    assert r.returncode == 2 and "episode 1 step 17" in r.stderr, r.stderr
    with EpisodeStore.open(out) as store:
        assert store.n_episodes == 3 and store.episode_lengths.tolist() == [11, 20, 9]
    assert leftovers(tmp_path) == []


def test_out_may_not_be_the_source_inside_it_or_a_folder_that_is_not_a_store(tmp_path, good_datasets):
    src = tmp_path / "dataset"
    shutil.copytree(good_datasets["v3.0"], src)
    before = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    for out, words in ((src, "overlaps"), (src / "store", "overlaps")):
        r = cli("dataset", "import-lerobot", src, out, "overwrite=true")
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*")) == before
    assert (src / "meta/info.json").is_file() and leftovers(tmp_path) == []

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    r = cli("dataset", "import-lerobot", src, mine, "overwrite=true")
    assert r.returncode == 2 and "not a robo_rl store" in r.stderr, r.stderr
    assert (mine / "keep.txt").read_text() == "mine" and leftovers(tmp_path) == []


def test_a_relative_out_works_and_dot_is_refused(tmp_path, good_datasets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "note.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        import_lerobot(good_datasets["v3.0"], ".", progress=False)
    with pytest.raises(ConfigError, match="not a robo_rl store"):
        import_lerobot(good_datasets["v3.0"], ".", progress=False, overwrite=True)
    with import_lerobot(good_datasets["v3.0"], "./x", progress=False) as store:
        assert store.n_episodes == 3 and Path(store.location) == tmp_path / "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note.txt", "x"]


# ---------------------------------------------------------------------- bad input
def edit_info(root: Path, change) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def edit_parquet(path: Path, column: str, change=None) -> None:
    """Rewrite a scalar column (change(values) -> values of the same type) or, with no change, drop it."""
    table = pq.read_table(path)
    if change is None:
        table = table.drop_columns([column])
    else:
        i = table.column_names.index(column)
        field = table.schema.field(i)
        table = table.set_column(i, field, pa.array(change(table[column].to_numpy()), field.type))
    pq.write_table(table, path)


def narrow_state(root: Path) -> None:
    """Episode 0's observation.state with 5 values a row, where info.json declares 6."""
    path = root / "data/chunk-000/episode_000000.parquet"
    table = pq.read_table(path)
    i = table.column_names.index("observation.state")
    values = [row[:5] for row in table["observation.state"].to_pylist()]
    table = table.set_column(i, pa.field("observation.state", pa.list_(pa.float32())), pa.array(values, pa.list_(pa.float32())))
    pq.write_table(table, path)


def cast_column(path: Path, column: str, value_type: pa.DataType) -> None:
    """Rewrite a column with another value type (a vector column keeps its list shape)."""
    table = pq.read_table(path)
    i = table.column_names.index(column)
    kind = table.schema.field(i).type
    new_type = pa.list_(value_type, kind.list_size) if pa.types.is_fixed_size_list(kind) else value_type
    table = table.set_column(i, pa.field(column, new_type), table[column].cast(new_type))
    pq.write_table(table, path)


def add_recorded_times(path: Path, bad_row: int) -> None:
    """Our exporter's timestamp_recorded column, NaN at one row."""
    table = pq.read_table(path)
    times = 1.7e9 + table["index"].to_numpy() / 10.0
    times[bad_row] = np.nan
    pq.write_table(table.append_column("timestamp_recorded", pa.array(times, pa.float64())), path)


def short_video(root: Path) -> None:
    """Episode 1 (20 steps) of camera top re-encoded with 17 frames."""
    frames = np.stack([np.full((32, 48, 3), 10 * k, np.uint8) for k in range(17)])
    write_mp4(root / "videos/chunk-000/observation.images.top/episode_000001.mp4", frames, 10, "h264")


# (name, dataset version, the damage, words the error must hold: the file, then the field)
BAD_INPUTS = [
    ("no info.json", "v2.1", lambda r: (r / "meta/info.json").unlink(), ["meta/info.json", "missing"]),
    ("old format", "v3.0", lambda r: edit_info(r, lambda i: i.update(codebase_version="v1.6")),
     ["meta/info.json", "codebase_version", "'v1.6'"]),
    ("fps not an integer", "v2.1", lambda r: edit_info(r, lambda i: i.update(fps=12.5)), ["meta/info.json", "fps"]),
    ("declared column missing", "v3.0",
     lambda r: edit_parquet(r / "data/chunk-000/file-001.parquet", "observation.environment_state"),
     ["meta/info.json", "features.observation.environment_state", "data/chunk-000/file-001.parquet"]),
    ("column too narrow", "v2.1", narrow_state, ["data/chunk-000/episode_000000.parquet", "observation.state", "[6]"]),
    ("video shorter than its episode", "v2.1", short_video,
     ["videos/chunk-000/observation.images.top/episode_000001.mp4", "observation.images.top", "episode 1 step 17"]),
    ("frames of another size", "v2.1",
     lambda r: edit_info(r, lambda i: i["features"]["observation.images.top"].update(shape=[40, 48, 3])),
     ["episode_000000.mp4", "features.observation.images.top.shape"]),
    ("index with a gap", "v3.0",
     lambda r: edit_parquet(r / "data/chunk-000/file-001.parquet", "index", lambda v: v + 1),
     ["data/chunk-000/file-001.parquet", "index", "episode 2 step 0"]),
    ("episode_index not the listed episode", "v2.1",
     lambda r: edit_parquet(r / "data/chunk-000/episode_000001.parquet", "episode_index", lambda v: v * 0 + 5),
     ["data/chunk-000/episode_000001.parquet", "episode_index"]),
    ("frame_index not restarting", "v3.0",
     lambda r: edit_parquet(r / "data/chunk-000/file-000.parquet", "frame_index", lambda v: np.arange(len(v))),
     ["data/chunk-000/file-000.parquet", "frame_index", "episode 1 step 0"]),
    ("values of a wider dtype than declared", "v2.1",
     lambda r: cast_column(r / "data/chunk-000/episode_000001.parquet", "observation.contact", pa.float64()),
     ["data/chunk-000/episode_000001.parquet: column 'observation.contact' holds float64",
      "meta/info.json: features.observation.contact.dtype says int64"]),
    ("timestamp_recorded not finite", "v3.0",
     lambda r: add_recorded_times(r / "data/chunk-000/file-000.parquet", 14),
     ["data/chunk-000/file-000.parquet", "timestamp_recorded", "episode 1 step 3", "nan"]),
    ("task_index past the tasks", "v2.1",
     lambda r: edit_parquet(r / "data/chunk-000/episode_000002.parquet", "task_index", lambda v: v * 0 + 7),
     ["data/chunk-000/episode_000002.parquet", "task_index", "tasks.jsonl"]),
    ("episodes row naming a missing data file", "v3.0",
     lambda r: edit_parquet(r / "meta/episodes/chunk-000/file-000.parquet", "data/file_index",
                            lambda v: np.where(np.arange(len(v)) == 1, 9, v)),
     ["meta/episodes/chunk-000/file-000.parquet", "episode 1", "data/file_index=9", "data/chunk-000/file-009.parquet"]),
]


@pytest.fixture(scope="module")
def good_datasets(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("good")
    return {v: write_dataset(base / v, v, codec="h264").root for v in ("v2.1", "v3.0")}


@pytest.mark.parametrize("name,version,damage,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_a_dataset_that_is_not_what_it_claims_fails_in_one_line_and_leaves_nothing(
        tmp_path, good_datasets, name, version, damage, words):
    src = tmp_path / "dataset"
    shutil.copytree(good_datasets[version], src)
    damage(src)
    out = tmp_path / "store"
    r = cli("dataset", "import-lerobot", src, out)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for word in words:
        assert word in lines[0], f"{word!r} not in: {lines[0]}"
    assert not out.exists() and not out.with_name("store.importing").exists()

