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
    write(tmp_path / "jpeg", camera_frames(8), image_codec="jpeg", image_quality=80).close()
    r = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "dataset", "info", str(tmp_path / "jpeg")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "jpeg (quality 80)" in r.stdout and "PSNR at write time" in r.stdout and " dB" in r.stdout
