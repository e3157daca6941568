"""robo-rl dataset export-lerobot: a store written as a LeRobot v3.0 dataset.

Checked without LeRobot itself (it cannot be installed beside this torch): every file and column
against the v3.0 layout, video frame times and keyframes decoded with PyAV, Rerun's independent
LeRobot reader, and the round trip through robo_rl's own importer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import robo_rl_cli

from robo_rl.data import lerobot_export
from robo_rl.data.lerobot_export import export_lerobot
from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

FPS = 10
H, W = 32, 48
N_EPISODES = 5
KEYS = {
    "obs/qpos": ((14,), "float32"),
    "obs/qvel": ((14,), "float64"),
    "action": ((14,), "float32"),
    "obs/gripper": ((2,), "float64"),
    "next/reward": ((), "float64"),
    "obs/contact": ((1,), "int32"),
    "obs/ee_pose": ((2, 3), "float32"),  # more than one dimension: flattened to [6] in LeRobot
    "obs/images/top": ((H, W, 3), "uint8"),
    "obs/images/wrist": ((H, W, 3), "uint8"),
}
FEATURES = {"obs/qpos": "observation.state", "obs/qvel": "observation.velocity", "action": "action",
            "obs/gripper": "observation.gripper", "next/reward": "next.reward", "obs/contact": "observation.contact",
            "obs/ee_pose": "observation.ee_pose"}
CAMERAS = {"top": "observation.images.top", "wrist": "observation.images.wrist"}
MIN_PSNR_DB = 28.0  # smooth 32x48 frames at crf 30 measure ~34 dB (AV1) and ~31 dB (H.264)


def smooth_frames(e: int, n: int, phase: float) -> np.ndarray:
    """Moving colour gradients: what a codec sees in real footage, unlike noise."""
    yy, xx = np.mgrid[0:H, 0:W]
    t = np.arange(n)[:, None, None]
    return np.stack([128 + 100 * np.sin(xx / 7 + 0.3 * t + e + phase), 128 + 90 * np.cos(yy / 5 - 0.2 * t + phase),
                     np.broadcast_to(40.0 + 30 * e + 10 * np.sin(0.1 * t), (n, H, W))], -1).astype(np.uint8)


def make_episode(e: int):
    rng = np.random.default_rng(e)
    n = 6 + 2 * e
    data = {}
    for key, (shape, dtype) in KEYS.items():
        if key.startswith("obs/images/"):
            data[key] = smooth_frames(e, n, 0.0 if key.endswith("top") else 1.5)
        elif np.dtype(dtype).kind == "f":
            data[key] = rng.standard_normal((n, *shape)).astype(dtype)
        else:
            data[key] = rng.integers(-5, 5, size=(n, *shape)).astype(dtype)
    ts = 100.0 * e + np.arange(n) / FPS + rng.uniform(0, 1e-3, n)  # recorded times jitter
    segments = rng.integers(0, len(Segment), size=n).astype(np.uint8)
    meta = EpisodeMeta(task=["pick the cube", "insert the peg", ""][e % 3], success=[True, False, None][e % 3],
                       source="scripted", operator="tester", start_time=1.7e9 + e / 3, notes=f"episode {e}",
                       extra={"seed": e, "nested": {"a": [1, 2]}})
    return data, ts, segments, meta


def build_store(path: Path, keys=KEYS, fps: float = FPS, episodes: int = N_EPISODES) -> Path:
    with EpisodeStore.create(path, Schema.build(keys, fps=fps, robot="test_arms")) as store:
        for e in range(episodes):
            data, ts, seg, meta = make_episode(e)
            store.add_episode({k: data[k] for k in keys}, ts, seg, meta)
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("lerobot_export") / "store")


@pytest.fixture(scope="module", params=["libsvtav1", "h264"])
def exported(request, store_path):
    out = store_path.parent / f"export_{request.param}"
    report = export_lerobot(store_path, out, codec=request.param, progress=False)
    return out, report


def read_table(path: Path) -> pa.Table:
    return pq.read_table(path)


def episodes_table(root: Path) -> pa.Table:
    return pa.concat_tables([read_table(p) for p in sorted((root / "meta/episodes").glob("*/*.parquet"))])


def data_table(root: Path) -> pa.Table:
    return pa.concat_tables([read_table(p) for p in sorted((root / "data").glob("*/*.parquet"))])


# ---------------------------------------------------------------------- layout and columns
def test_v3_files_columns_and_metadata(exported, store_path):
    root, report = exported
    store = EpisodeStore.open(store_path)
    assert report["episodes"] == N_EPISODES and report["frames"] == store.n_steps
    assert not (root.parent / (root.name + ".exporting")).exists()
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert on_disk == report["files"]
    assert {"meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
            "data/chunk-000/file-000.parquet", *(f"videos/{f}/chunk-000/file-000.mp4" for f in CAMERAS.values())} \
        == set(on_disk)

    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and isinstance(info["fps"], int)
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (N_EPISODES, store.n_steps, 3)
    assert info["robot_type"] == "test_arms" and info["chunks_size"] == 1000
    assert (info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (100, 200)
    assert info["splits"] == {"train": f"0:{N_EPISODES}"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert info["robo_rl"] == {"schema": store.schema.to_json()}
    features = info["features"]
    for key, name in FEATURES.items():
        shape, dtype = KEYS[key]
        assert features[name] == {"dtype": dtype, "shape": [int(np.prod(shape))] if shape else [1], "names": None}
    for name in CAMERAS.values():
        f = features[name]
        assert f["dtype"] == "video" and f["shape"] == [H, W, 3] and f["names"] == ["height", "width", "channels"]
        assert f["info"] == {"video.height": H, "video.width": W, "video.codec": {"libsvtav1": "av1", "h264": "h264"}[
            report["codec"]], "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": FPS,
            "video.channels": 3, "has_audio": False}
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64"), ("segment", "int64"),
                        ("timestamp_recorded", "float64")):
        assert features[name] == {"dtype": dtype, "shape": [1], "names": None}

    # data parquet: the store's dtypes; vectors as fixed_size_list, scalars as plain columns
    data = data_table(root)
    types = dict(zip(data.schema.names, data.schema.types))
    assert set(types) == {n for n, f in features.items() if f["dtype"] != "video"}
    assert types["observation.state"] == pa.list_(pa.float32(), 14)
    assert types["observation.velocity"] == pa.list_(pa.float64(), 14)
    assert types["action"] == pa.list_(pa.float32(), 14)
    assert types["observation.gripper"] == pa.list_(pa.float64(), 2)
    assert types["observation.ee_pose"] == pa.list_(pa.float32(), 6)
    assert types["next.reward"] == pa.float64() and types["observation.contact"] == pa.int32()
    assert types["timestamp"] == pa.float32() and types["timestamp_recorded"] == pa.float64()
    for name in ("frame_index", "episode_index", "index", "task_index", "segment"):
        assert types[name] == pa.int64()
    assert data.column("index").to_pylist() == list(range(store.n_steps))
    lengths = store.episode_lengths
    assert data.column("episode_index").to_pylist() == np.repeat(np.arange(N_EPISODES), lengths).tolist()
    frame_index = np.concatenate([np.arange(n) for n in lengths])
    assert data.column("frame_index").to_pylist() == frame_index.tolist()
    assert np.array_equal(data.column("timestamp").to_numpy(), (frame_index / FPS).astype(np.float32))
    assert np.array_equal(data.column("timestamp_recorded").to_numpy(), store.read("timestamp"))
    assert np.array_equal(data.column("segment").to_numpy(), store.read("segment").astype(np.int64))
    state = np.stack(data.column("observation.state").to_numpy(zero_copy_only=False))
    assert np.array_equal(state, store.read("obs/qpos"))

    # tasks.parquet: row i is task i; pandas metadata makes `task` the index
    tasks = read_table(root / "meta/tasks.parquet")
    assert tasks.column("task_index").to_pylist() == [0, 1, 2]
    assert tasks.column("task").to_pylist() == ["pick the cube", "insert the peg", ""]
    pandas_meta = json.loads(tasks.schema.metadata[b"pandas"])
    assert pandas_meta["index_columns"] == ["task"]
    assert data.column("task_index").to_pylist() == np.repeat([e % 3 for e in range(N_EPISODES)], lengths).tolist()

    # episodes metadata: one row per episode in order, row ranges and video times consistent
    eps = episodes_table(root).to_pydict()
    assert eps["episode_index"] == list(range(N_EPISODES)) and eps["length"] == lengths.tolist()
    ends = np.cumsum(lengths)
    assert eps["dataset_from_index"] == (ends - lengths).tolist() and eps["dataset_to_index"] == ends.tolist()
    assert eps["tasks"] == [[store.meta(e).task] for e in range(N_EPISODES)]
    for name in CAMERAS.values():
        assert eps[f"videos/{name}/from_timestamp"][0] == 0.0
        assert np.allclose(eps[f"videos/{name}/to_timestamp"], ends / FPS)
        assert eps[f"videos/{name}/from_timestamp"][1:] == eps[f"videos/{name}/to_timestamp"][:-1]
    assert [EpisodeMeta.from_json(json.loads(m)) for m in eps["robo_rl/episode_meta"]] == store.metas
    ep_schema = episodes_table(root).schema
    ep_types = dict(zip(ep_schema.names, ep_schema.types))
    assert ep_types["stats/observation.state/mean"] == pa.list_(pa.float64())
    assert ep_types["stats/observation.state/count"] == pa.list_(pa.int64())
    assert ep_types["stats/observation.images.top/mean"] == pa.list_(pa.list_(pa.list_(pa.float64())))

    # stats.json: every feature; cameras per channel (3, 1, 1) in [0, 1]; numeric stats match the store
    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats) == set(features)
    for name, s in stats.items():
        assert set(s) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}, name
        assert s["count"] == [store.n_steps]
    for name in CAMERAS.values():
        for stat in ("min", "max", "mean", "std", "q50"):
            v = np.asarray(stats[name][stat])
            assert v.shape == (3, 1, 1) and (0 <= v).all() and (v <= 1).all()
    for key, name in FEATURES.items():
        x = store.read(key).astype(np.float64).reshape(store.n_steps, -1)
        assert np.allclose(stats[name]["mean"], x.mean(0)) and np.allclose(stats[name]["std"], x.std(0))
        assert stats[name]["min"] == x.min(0).tolist() and stats[name]["max"] == x.max(0).tolist()
    store.close()


# ---------------------------------------------------------------------- video
def test_video_frames_at_episode_times_and_within_codec_loss(exported, store_path):
    import av

    root, report = exported
    store = EpisodeStore.open(store_path)
    eps = episodes_table(root).to_pydict()
    for cam, name in CAMERAS.items():
        squared_error, values = 0.0, 0
        path = root / f"videos/{name}/chunk-000/file-000.mp4"
        with av.open(str(path)) as c:
            frames = [(float(f.time), f.key_frame, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
        assert len(frames) == store.n_steps
        for e in range(N_EPISODES):
            start, stop = store.episode_range(e)
            original = store.read(f"obs/images/{cam}", start, stop)
            for k in range(stop - start):
                t, key, img = frames[start + k]
                assert abs(t - (eps[f"videos/{name}/from_timestamp"][e] + k / FPS)) < 1e-4, (cam, e, k)
                if k == 0:
                    assert key, f"episode {e} of {cam} does not start on a keyframe"
                diff = img.astype(np.float64) - original[k]
                squared_error += float((diff**2).sum())
                values += diff.size
        psnr = 10 * math.log10(255**2 / (squared_error / values))
        loss = report["image_loss"][cam]
        assert loss["psnr_db"] == pytest.approx(psnr, abs=1e-6)
        assert psnr > MIN_PSNR_DB and 0 < loss["max_abs_error"] < 80 and 0 < loss["mean_abs_error"] < 8
    store.close()


def test_small_size_limits_split_data_videos_and_metadata_into_files(store_path, tmp_path):
    out = tmp_path / "split"
    report = export_lerobot(store_path, out, codec="h264", progress=False, data_file_mb=0.004, video_file_mb=0.004)
    files = report["files"]
    data_files = [f for f in files if f.startswith("data/")]
    video_files = [f for f in files if f.startswith("videos/observation.images.top/")]
    episode_files = [f for f in files if f.startswith("meta/episodes/")]
    assert len(data_files) > 1 and len(video_files) > 1 and len(episode_files) > 1
    info = json.loads((out / "meta/info.json").read_text())
    assert (info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (0.004, 0.004)
    eps = episodes_table(out).to_pydict()
    assert eps["episode_index"] == list(range(N_EPISODES))
    for e in range(N_EPISODES):
        # the episode lies whole in the files its row names, at the times it names
        rows = read_table(out / info["data_path"].format(chunk_index=eps["data/chunk_index"][e],
                                                         file_index=eps["data/file_index"][e]))
        mine = np.asarray(rows.column("episode_index")) == e
        assert mine.sum() == eps["length"][e]
        assert rows.column("index").to_numpy()[mine].tolist() == list(range(eps["dataset_from_index"][e],
                                                                         eps["dataset_to_index"][e]))
        chunk, file = eps["meta/episodes/chunk_index"][e], eps["meta/episodes/file_index"][e]
        assert e in read_table(out / f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet").column(
            "episode_index").to_pylist()
    name = CAMERAS["top"]
    assert eps[f"videos/{name}/file_index"] == sorted(eps[f"videos/{name}/file_index"])
    for e in range(1, N_EPISODES):
        same_file = eps[f"videos/{name}/file_index"][e] == eps[f"videos/{name}/file_index"][e - 1]
        previous_end = eps[f"videos/{name}/to_timestamp"][e - 1]
        assert eps[f"videos/{name}/from_timestamp"][e] == (previous_end if same_file else 0)
    # file indices wrap into the next chunk directory after 1000 files, as LeRobot numbers them
    assert lerobot_export._next_file(0, 998) == (0, 999) and lerobot_export._next_file(0, 999) == (1, 0)


def test_store_without_cameras_has_no_videos(tmp_path):
    keys = {k: v for k, v in KEYS.items() if not k.startswith("obs/images/")}
    path = build_store(tmp_path / "store", keys=keys, episodes=2)
    report = export_lerobot(path, tmp_path / "out", progress=False)
    assert report["image_loss"] == {} and not any(f.startswith("videos/") for f in report["files"])
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["video_path"] is None and not any(f["dtype"] == "video" for f in info["features"].values())


def test_rerun_lerobot_reader_accepts_the_export(exported, store_path):
    pytest.importorskip("rerun")
    from rerun.experimental import LeRobotReader

    root, _ = exported
    reader = LeRobotReader(str(root))
    assert reader.episodes() == list(range(N_EPISODES))
    lengths = EpisodeStore.open(store_path).episode_lengths
    for e in (0, N_EPISODES - 1):
        chunks = list(reader.stream(e))
        entities = {c.entity_path for c in chunks}
        assert {"/observation.state", "/action", "/observation.images.top", "/observation.images.wrist"} <= entities
        samples = sum(c.num_rows for c in chunks if c.entity_path == "/observation.images.top"
                      and "VideoStream:sample" in c.to_record_batch().schema.names)
        assert samples == lengths[e]  # streamed natively: the episode starts on a keyframe


# ---------------------------------------------------------------------- round trip through the importer
def test_export_then_import_gives_the_store_back(exported, store_path, tmp_path):
    from robo_rl.data.lerobot import import_lerobot

    root, report = exported
    src = EpisodeStore.open(store_path)
    with import_lerobot(root, tmp_path / "back", progress=False) as back:
        assert back.schema.to_json() == src.schema.to_json()
        assert back.n_episodes == src.n_episodes and np.array_equal(back.episode_ends, src.episode_ends)
        assert back.metas == src.metas
        for key in [*FEATURES, "timestamp", "segment"]:
            a, b = src.read(key), back.read(key)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
        for cam in CAMERAS:
            a = src.read(f"obs/images/{cam}").astype(np.float64)
            b = back.read(f"obs/images/{cam}").astype(np.float64)
            mse = ((a - b) ** 2).mean()
            assert 10 * math.log10(255**2 / mse) == pytest.approx(report["image_loss"][cam]["psnr_db"], abs=0.5)
    src.close()


def test_a_jpeg_store_exports_with_both_losses_said_and_imports_without_a_third(tmp_path):
    """A real camera's store holds JPEG frames: video cannot carry them without decoding and
    encoding again, so the export reports the store's own loss beside the video's; the import
    keeps the video's frames losslessly, adding nothing."""
    from robo_rl.data.lerobot import import_lerobot

    with EpisodeStore.create(tmp_path / "jpeg", Schema.build(KEYS, fps=FPS, robot="test_arms"), image_codec="jpeg") as store:
        for e in range(2):
            data, ts, seg, meta = make_episode(e)
            store.add_episode(data, ts, seg, meta)
    report = export_lerobot(tmp_path / "jpeg", tmp_path / "out", codec="h264", progress=False)
    assert report["store_image_codec"] == "jpeg (quality 85)"
    assert set(report["store_image_loss"]) == set(CAMERAS) and min(report["store_image_loss"].values()) > 25
    src = EpisodeStore.open(tmp_path / "jpeg")
    with import_lerobot(tmp_path / "out", tmp_path / "back", progress=False) as back:
        assert back.image_quality is None  # stored as decoded: no further loss
        for cam in CAMERAS:
            a = src.read(f"obs/images/{cam}").astype(np.float64)
            b = back.read(f"obs/images/{cam}").astype(np.float64)
            psnr = 10 * math.log10(255**2 / ((a - b) ** 2).mean())
            assert psnr == pytest.approx(report["image_loss"][cam]["psnr_db"], abs=0.5)  # the video's loss, no more
    src.close()


# ---------------------------------------------------------------------- refusals and atomicity
@pytest.mark.parametrize("case", ["fps", "reserved", "collision", "empty", "odd", "gray", "tiny", "codec", "crf"])
def test_refuses_what_lerobot_cannot_hold(case, tmp_path):
    keys = {"obs/qpos": ((14,), "float32"), "obs/images/top": ((H, W, 3), "uint8")}
    kwargs = {}
    if case == "reserved":
        keys["timestamp_recorded"] = ((), "float64")
    elif case == "collision":
        keys["obs/state"] = ((3,), "float32")
    elif case == "odd":
        keys["obs/images/top"] = ((H, W - 1, 3), "uint8")
    elif case == "gray":
        keys["obs/images/top"] = ((H, W, 1), "uint8")
    elif case == "tiny":  # svt-av1's smallest frame is 4x4
        keys["obs/images/top"] = ((2, 2, 3), "uint8")
    elif case == "codec":
        kwargs["codec"] = "mjpeg"
    elif case == "crf":
        kwargs["crf"] = 99
    path = tmp_path / "store"
    with EpisodeStore.create(path, Schema.build(keys, fps=12.5 if case == "fps" else FPS)) as store:
        if case != "empty":
            n = 4
            zeros = {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in keys.items()}
            store.add_episode(zeros, np.arange(n) / FPS)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        export_lerobot(path, out, progress=False, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    expected = {"fps": ["12.5", "integer fps"], "reserved": ["'timestamp_recorded'", "rename"],
                "collision": ["'obs/qpos'", "'obs/state'", "observation.state"], "empty": ["no committed episodes"],
                "odd": ["'top'", "47x32", "even"], "gray": ["'top'", "RGB"],
                "tiny": ["obs/images/top", "2x2", "cannot be encoded with libsvtav1"],
                "codec": ["'mjpeg'", "libsvtav1, h264"], "crf": ["crf=99", "0..63"]}[case]
    assert all(part in message for part in expected), message
    if case not in ("codec", "crf"):
        assert str(path) in message
    assert not out.exists() and not (tmp_path / "out.exporting").exists()


def test_existing_out_is_refused_replaced_with_overwrite_and_kept_on_failure(store_path, tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        export_lerobot(store_path, mine, progress=False)
    with pytest.raises(ConfigError, match="not a LeRobot dataset"):  # a typo in OUT never deletes a folder
        export_lerobot(store_path, mine, progress=False, overwrite=True)
    assert (mine / "keep.txt").read_text() == "mine"
    for inside in (store_path, store_path / "inside"):
        with pytest.raises(ConfigError, match="overlaps"):
            export_lerobot(store_path, inside, progress=False, overwrite=True)
    with EpisodeStore.open(store_path) as store:
        assert not (store_path / "inside").exists() and store.n_episodes == N_EPISODES

    out = tmp_path / "out"
    export_lerobot(store_path, out, codec="h264", progress=False)
    first = (out / "meta/info.json").read_text()
    calls = []

    def failing_encoder(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("encoder died")
        return real_encoder(*args, **kwargs)

    real_encoder = lerobot_export._encode_episode
    monkeypatch.setattr(lerobot_export, "_encode_episode", failing_encoder)
    with pytest.raises(RuntimeError, match="encoder died"):
        export_lerobot(store_path, out, progress=False, overwrite=True)
    assert (out / "meta/info.json").read_text() == first and not (tmp_path / "out.exporting").exists()
    monkeypatch.setattr(lerobot_export, "_encode_episode", real_encoder)

    report = export_lerobot(store_path, out, codec="libsvtav1", progress=False, overwrite=True)
    assert report["codec"] == "libsvtav1" and (out / "meta/info.json").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]


# ---------------------------------------------------------------------- the CLI
def test_cli_exports_and_prints_image_loss_then_refuses_an_existing_out(store_path, tmp_path):
    out = tmp_path / "cli_out"
    r = robo_rl_cli("dataset", "export-lerobot", str(store_path), str(out), "codec=h264")
    assert r.returncode == 0, r.stderr
    assert "PSNR" in r.stdout and "top" in r.stdout and "wrist" in r.stdout and "dB" in r.stdout
    assert f"{N_EPISODES} episode(s)" in r.stdout and (out / "meta/info.json").is_file()

    r = robo_rl_cli("dataset", "export-lerobot", str(store_path), str(out), "codec=h264")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and "already exists" in errors[0], r.stderr

    bad = build_store(tmp_path / "odd_fps", keys={"obs/qpos": ((14,), "float32")}, fps=29.97, episodes=1)
    r = robo_rl_cli("dataset", "export-lerobot", str(bad), str(tmp_path / "bad_out"))
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith("error:") and "29.97" in errors[0], r.stderr
    assert not (tmp_path / "bad_out").exists() and not (tmp_path / "bad_out.exporting").exists()
