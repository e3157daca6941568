"""The store's lossy frame codec for real cameras (per-frame JPEG in zarr v3): what it loses on
camera-like frames, that quality is a setting, that a random frame reads alone, and that
`dataset info` reports the codec and the loss measured at write time. Crash safety under SIGKILL
is in test_crash.py (the `jpeg` writer)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from robo_rl.data.codecs import psnr
from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import StoreError

H, W = 120, 160


def camera_frames(n: int, seed: int = 0) -> np.ndarray:
    """A smooth scene that moves (gradients and a bright block) plus sensor noise, sigma 3."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    frames = []
    for t in range(n):
        img = np.stack([60 + 0.5 * x + t, 80 + 0.6 * y, 120 + 0.3 * (x + y)], -1)
        img[40:70, 30 + t:70 + t] = [200, 40, 40]
        frames.append(img + rng.normal(0, 3, img.shape))
    return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


def schema() -> Schema:
    return Schema.build({"obs/qpos": ((14,), "float32"), "obs/images/top": ((H, W, 3), "uint8"),
                         "obs/images/wrist": ((H, W, 3), "uint8")}, fps=30, robot="test_arms")


def write(path, frames: np.ndarray, episodes: int = 2, **codec) -> EpisodeStore:
    n = len(frames) // episodes
    with EpisodeStore.create(path, schema(), **codec) as store:
        for e in range(episodes):
            block = frames[e * n:(e + 1) * n]
            store.add_episode({"obs/qpos": np.zeros((n, 14), np.float32), "obs/images/top": block,
                               "obs/images/wrist": block[:, ::-1]}, np.arange(n) / 30, meta=EpisodeMeta(task="t"))
    return EpisodeStore.open(path)


def test_jpeg_frames_come_back_close_and_the_store_says_how_close(tmp_path):
    frames = camera_frames(24)
    lossy = write(tmp_path / "jpeg", frames, image_codec="jpeg")
    lossless = write(tmp_path / "zstd", frames)
    back = lossy.episode(1)["obs/images/top"]
    assert back.shape == (12, H, W, 3) and back.dtype == np.uint8
    measured = psnr(back, frames[12:])
    assert measured > 33.0  # near the frames written (the 35 dB target is measured on twin renders: bench/lossy_codecs.py)
    info = lossy.info()
    assert info["image_codec"] == "jpeg (quality 85)"
    assert set(info["image_psnr_db"]) == {"top", "wrist"}
    assert abs(info["image_psnr_db"]["top"] - measured) < 1.5  # the write-time sample speaks for the episode
    assert lossless.info()["image_psnr_db"] is None
    assert lossy.size_on_disk() * 3 < lossless.size_on_disk()  # noise: lossless cannot shrink it much
    # a random frame reads alone and equals the same frame of a whole-episode read
    assert np.array_equal(lossy.read("obs/images/top", 12 + 5, 12 + 6)[0], back[5])
    assert lossy.validate() == []


def test_quality_is_a_setting(tmp_path):
    frames = camera_frames(8)
    low = write(tmp_path / "q50", frames, episodes=1, image_codec="jpeg", image_quality=50)
    high = write(tmp_path / "q95", frames, episodes=1, image_codec="jpeg", image_quality=95)
    assert low.image_quality == 50 and high.image_quality == 95
    assert low.size_on_disk() < high.size_on_disk()
    assert psnr(low.episode(0)["obs/images/top"], frames) < psnr(high.episode(0)["obs/images/top"], frames)


@pytest.mark.parametrize("codec,message", [({"image_codec": "jpeg", "image_quality": 0}, "JPEG quality is 1..100"),
                                           ({"image_codec": "webp"}, "jpeg")])
def test_bad_codec_settings_are_one_line(tmp_path, codec, message):
    with pytest.raises(StoreError, match=message):
        EpisodeStore.create(tmp_path / "s", schema(), **codec)


def test_dataset_info_reports_the_codec_and_its_loss(tmp_path):
    write(tmp_path / "jpeg", camera_frames(8), image_codec="jpeg", image_quality=80, train_image_size=(48, 64)).close()
    r = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "dataset", "info", str(tmp_path / "jpeg")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "jpeg (quality 80)" in r.stdout and "PSNR at write time" in r.stdout and " dB" in r.stdout
    assert "training-size copies" in r.stdout and "48x64" in r.stdout


def camera_at_30fps(frames: np.ndarray, steps: int) -> list[np.ndarray]:
    """What a 50 Hz loop reads from a 30 fps camera: the newest frame, the same array object
    until the next one arrives (2 steps in 5 repeat the previous frame)."""
    arrays = list(frames)
    return [arrays[(t * 3 // 5) % len(arrays)] for t in range(steps)]


def test_repeated_frames_are_stored_once_and_read_back_in_place(tmp_path):
    frames = camera_frames(30)
    seen = camera_at_30fps(frames, 50)
    with EpisodeStore.create(tmp_path / "s", schema(), image_codec="jpeg") as store:
        for e in range(2):
            w = store.begin_episode(EpisodeMeta(task="t"))
            for t, f in enumerate(seen[e * 25:(e + 1) * 25]):
                w.add({"obs/qpos": np.zeros(14, np.float32), "obs/images/top": f, "obs/images/wrist": f}, t / 50)
            w.commit()
    store = EpisodeStore.open(tmp_path / "s")
    back = store.read("obs/images/top")
    repeat = store._read_rows("repeat/obs/images/top", slice(0, 50))
    # each episode's first step holds its own frame; every other repeat points back to the step holding it
    assert repeat[0] == 0 and repeat[25] == 0 and (repeat > 0).sum() == 50 - 30 - 1 + 1
    src = np.arange(50) - repeat
    assert np.array_equal(back, back[src]) and all(repeat[s] == 0 for s in src)
    assert np.array_equal(back[:25], store.episode(0)["obs/images/top"])
    # a read that starts on a repeated step fetches the frame from before it
    first_repeat = int(np.argmax(repeat > 0))
    assert np.array_equal(store.read("obs/images/top", first_repeat, first_repeat + 1)[0], back[first_repeat])
    assert psnr(back, np.stack(seen)) > 33.0
    assert store.validate() == []
    # a repeated frame costs next to nothing on disk: the store is ~30 frames' worth, not 50
    once = write(tmp_path / "once", frames, episodes=1, image_codec="jpeg")
    assert store.size_on_disk() < 1.2 * once.size_on_disk()


def test_training_size_copies_are_what_the_sampler_reads(tmp_path):
    from robo_rl.data.codecs import resize_rgb
    from robo_rl.data.sampler import WindowSampler
    from robo_rl.policies import ObsShapes

    frames = camera_frames(24)
    store = write(tmp_path / "s", frames, image_codec="jpeg", train_image_size=(48, 64))
    assert store.train_image_size == (48, 64) and store.info()["train_image_size"] == [48, 64]
    small = store.read("obs/images/top", 0, 12, small=True)
    assert small.shape == (12, 48, 64, 3)
    assert psnr(small, np.stack([resize_rgb(f, (48, 64)) for f in frames[:12]])) > 33.0
    sampler = WindowSampler(store, ["obs/images/top"], action_key="obs/qpos", n_obs=2, horizon=4)
    assert sampler.image_sizes == {"obs/images/top": (48, 64)}
    batch = sampler.get(np.arange(len(sampler)))
    assert batch["obs/images/top"].shape == (24, 2, 48, 64, 3)
    assert np.array_equal(batch["obs/images/top"][:, -1], store.read("obs/images/top", small=True))
    shapes = ObsShapes.from_schema(store.schema, ["obs/images/top"], "obs/qpos", image_size=store.train_image_size)
    assert shapes.images == {"obs/images/top": (48, 64)}
    # the copies go where the store goes
    copy = store.copy_episodes(tmp_path / "copy", [1])
    assert copy.train_image_size == (48, 64) and copy.read("obs/images/top", small=True).shape == (12, 48, 64, 3)
    with pytest.raises(StoreError, match="no training-size copies"):
        write(tmp_path / "plain", frames).read("obs/images/top", small=True)
    with pytest.raises(StoreError, match="no larger than the frames"):
        EpisodeStore.create(tmp_path / "big", schema(), train_image_size=(240, 320))


def test_jpeg_shards_read_directly_equal_zarrs_own_reading(tmp_path):
    frames = camera_frames(40)
    seen = camera_at_30fps(frames, 300)  # 300 steps: three shards of full frames, empty rows among them
    with EpisodeStore.create(tmp_path / "s", schema(), image_codec="jpeg", train_image_size=(30, 40)) as store:
        store.add_episode({"obs/qpos": np.zeros((300, 14), np.float32), "obs/images/top": np.stack(seen),
                           "obs/images/wrist": np.stack(seen)}, np.arange(300) / 50)
    store = EpisodeStore.open(tmp_path / "s")
    for path in ("data/obs/images/top", "small/obs/images/wrist"):
        node = store._node(path)
        assert store._jpeg_shards(path, node)
        assert np.array_equal(store._read_rows(path, slice(0, 300)), np.asarray(node[0:300]))
        rows = np.array([0, 1, 127, 128, 255, 299])
        assert np.array_equal(store._read_rows(path, rows), np.asarray(node.oindex[rows]))


@pytest.mark.parametrize("snapshots", [True, False])
def test_recorder_hands_frames_over_once(tmp_path, snapshots):
    """Snapshots (a camera's newest frame, never written into): copied off the caller's thread,
    a repeated array not copied at all. Not snapshots: a caller reusing one array still records
    every frame as it was at add_step."""
    from robo_rl.data.recorder import Recorder

    frames = camera_frames(30)
    seen = camera_at_30fps(frames, 50)
    with Recorder(tmp_path / "r", schema(), image_codec="jpeg", snapshots=snapshots) as rec:
        rec.start_episode(EpisodeMeta(task="t"))
        buffer = np.empty_like(frames[0])
        for t, f in enumerate(seen):
            if not snapshots:  # one array, written into every step
                buffer[:] = f
                f = buffer
            rec.add_step({"obs/qpos": np.zeros(14, np.float32), "obs/images/top": f, "obs/images/wrist": f}, t / 50)
        rec.end_episode()
    store = EpisodeStore.open(tmp_path / "r")
    back = store.read("obs/images/top")
    assert store.n_steps == 50 and psnr(back, np.stack(seen)) > 33.0
    repeat = store._read_rows("repeat/obs/images/top", slice(0, 50))
    assert (repeat == 0).sum() == 30  # every captured frame once


def test_a_policy_sees_full_frames_as_its_training_copies_were_made():
    """A policy trained on a store's small copies, given a robot's full frames (RaC recording on
    real arms), downscales them with the resize the copies were made with."""
    import torch

    from robo_rl.data.codecs import resize_rgb
    from robo_rl.policies import ObsShapes, make_policy
    from robo_rl.policies.inference import predictor

    torch.manual_seed(0)
    policy = make_policy("flow", {"dit_dim": 32, "dit_depth": 2, "image_encoder": "conv", "n_obs": 1},
                         ObsShapes({"obs/qpos": 14}, {"obs/images/top": (48, 64)}, 14))
    predict = predictor(policy)
    full = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    qpos = np.zeros((1, 1, 14), np.float32)
    torch.manual_seed(1)
    from_full = predict({"obs/qpos": qpos, "obs/images/top": full[None, None]})
    torch.manual_seed(1)
    from_small = predict({"obs/qpos": qpos, "obs/images/top": resize_rgb(full, (48, 64))[None, None]})
    assert from_full.shape == (1, policy.config.horizon, 14)
    assert np.array_equal(from_full, from_small)
