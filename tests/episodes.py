"""Deterministic episodes for tests: episode e is a pure function of e, so a checker in another
process can regenerate what a writer wrote and compare bit for bit."""

from __future__ import annotations

import numpy as np

from robo_rl.data.codecs import decode_frame_jpeg, encode_jpeg, resize_rgb
from robo_rl.data.schema import EpisodeMeta, Schema, Segment

CAM = (24, 32, 3)
SMALL = (12, 16)  # training-size copies in the stores that keep them


def small_schema(cameras: bool = True) -> Schema:
    keys = {"obs/qpos": ((14,), "float32"), "action": ((14,), "float32"), "obs/gripper": ((2,), "float64")}
    if cameras:
        keys["obs/images/top"] = (CAM, "uint8")
        keys["obs/images/wrist"] = (CAM, "uint8")
    return Schema.build(keys, fps=50, robot="test_arms")


def make_episode(e: int, schema: Schema, min_len: int = 20, max_len: int = 90):
    """(data, timestamps, segments, meta) of episode e."""
    rng = np.random.default_rng(1000 + e)
    n = int(rng.integers(min_len, max_len + 1))
    data = {}
    for key, spec in schema.keys.items():
        if spec.is_image:
            data[key] = rng.integers(0, 256, size=(n, *spec.shape), dtype=np.uint8)
            if key.endswith("wrist"):  # a 30 fps camera read at 50 Hz: 2 frames in 5 repeat the previous one
                data[key] = data[key][np.arange(n) * 3 // 5]
        else:
            data[key] = rng.standard_normal((n, *spec.shape)).astype(spec.dtype)
    ts = 100.0 * e + np.arange(n) / schema.fps
    segments = rng.integers(0, len(Segment), size=n).astype(np.uint8)
    meta = EpisodeMeta(task=f"task{e % 3}", success=bool(e % 2), source="scripted" if e % 4 else "teleop",
                       operator="tester", start_time=1e9 + e, notes=f"episode {e}")
    return data, ts, segments, meta


def assert_episode_equal(store, i: int, e: int) -> None:
    """Episode i of `store` is exactly generated episode e. In a lossy (JPEG) store, a frame is
    exactly what that JPEG quality makes of the generated frame (libjpeg is deterministic), and
    the info carries the loss measured at write time besides."""
    data, ts, seg, meta = make_episode(e, store.schema)
    got = store.episode(i)
    lossy = (lambda f: decode_frame_jpeg(encode_jpeg(f, store.image_quality))) if store.image_quality else (lambda f: f)
    for k, v in data.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, (i, k)
        if store.schema.keys[k].is_image:
            if store.train_image_size:  # the training-size copy: the frame downscaled, then stored
                small = store.read(k, *store.episode_range(i), small=True)
                assert np.array_equal(small, np.stack([lossy(resize_rgb(f, store.train_image_size)) for f in v])), \
                    f"episode {i} key {k}: training-size copies differ"
            v = np.stack([lossy(f) for f in v])
        assert np.array_equal(got[k], v), f"episode {i} key {k} differs"
    assert np.array_equal(got["timestamp"], ts), f"episode {i} timestamps differ"
    assert np.array_equal(got["segment"], seg), f"episode {i} segments differ"
    stored = store.meta(i)
    if store.image_quality is not None:
        assert set(stored.extra.pop("image_psnr_db")) == set(store.schema.cameras), f"episode {i}: no image loss recorded"
    assert stored == meta, f"episode {i} meta differs"
