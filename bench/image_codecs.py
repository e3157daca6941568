"""Lossless image codecs for camera frames in the episode store: which one should be the default?

Two kinds of frames, 240x320 RGB uint8:
  (a) MuJoCo renders of a small table-top scene (objects and camera move a little every frame);
  (b) the same frames plus Gaussian sensor noise (sigma=3, clipped), standing in for a real camera.

Each lossless candidate (robo_rl.data.store.IMAGE_CODECS, plus zarr's Zstd level 3, plus "none" as
the floor set by zarr's own per-chunk work) is measured through a real zarr v3 array laid out like
the store's image arrays (chunks (IMAGE_CHUNK,H,W,3), shards (IMAGE_SHARD,H,W,3)):
  ratio        raw bytes / bytes on disk (shard files incl. their index)
  enc MB/s     raw bytes / time of `arr[:] = frames`            best of 3, fresh array each run
  dec MB/s     raw bytes / time of `arr[:]` on a re-opened array best of 3
  frame ms     mean time of `arr[i]` for random single frames (re-opened array)
JPEG quality 90 through OpenCV is listed too, as a lossy reference only (not a store option).

Compression runs on one thread (blosc, zarr and OpenCV), which is how the Recorder's writer
process runs it (`numcodecs.blosc.set_nthreads(1)`, zarr `threading.max_workers=1`); pass
`--threads N` to see multi-threaded numbers.

    python bench/codecs.py [--frames 200] [--quick] [--threads 1]

The scene (`render_frames`) is also used by bench/data.py for realistic recording frames.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is imported anywhere

import numpy as np

HEIGHT, WIDTH = 240, 320

SCENE_XML = """
<mujoco model="bench_table_scene">
  <visual>
    <global offwidth="640" offheight="480"/>
    <quality shadowsize="1024"/>
    <headlight ambient=".25 .25 .25" diffuse=".4 .4 .4"/>
  </visual>
  <asset>
    <texture name="checker" type="2d" builtin="checker" rgb1=".25 .3 .35" rgb2=".12 .14 .16"
             width="256" height="256" mark="edge" markrgb=".6 .6 .6"/>
    <material name="floor" texture="checker" texrepeat="8 8" reflectance=".1"/>
    <texture name="sky" type="skybox" builtin="gradient" rgb1=".5 .6 .7" rgb2=".05 .05 .1" width="128" height="128"/>
    <material name="table" rgba=".55 .4 .26 1" specular=".2"/>
  </asset>
  <worldbody>
    <light name="key" pos=".5 -.8 2.5" dir="-.2 .3 -1" diffuse=".7 .7 .7" castshadow="true"/>
    <light name="fill" pos="-1 1 2" dir="1 -1 -1.5" diffuse=".25 .25 .3" castshadow="false"/>
    <geom name="floor" type="plane" size="3 3 .1" material="floor"/>
    <body name="table" pos="0 0 .375">
      <geom name="top" type="box" size=".6 .4 .375" material="table"/>
    </body>
    <body name="cube_red" mocap="true" pos=".1 .05 .79"><geom type="box" size=".035 .035 .035" rgba=".85 .15 .12 1"/></body>
    <body name="cube_green" mocap="true" pos="-.2 .1 .79"><geom type="box" size=".05 .03 .04" rgba=".2 .7 .25 1"/></body>
    <body name="cube_blue" mocap="true" pos=".25 -.15 .78"><geom type="box" size=".03 .06 .03" rgba=".15 .3 .85 1"/></body>
    <body name="capsule_yellow" mocap="true" pos="-.05 -.2 .78">
      <geom type="capsule" size=".025 .08" euler="0 90 0" rgba=".9 .8 .15 1"/>
    </body>
    <body name="capsule_gripper" mocap="true" pos="0 0 1.0">
      <geom type="capsule" size=".02 .12" rgba=".7 .7 .72 1"/>
      <geom type="box" pos=".03 0 -.13" size=".008 .02 .03" rgba=".2 .2 .2 1"/>
      <geom type="box" pos="-.03 0 -.13" size=".008 .02 .03" rgba=".2 .2 .2 1"/>
    </body>
    <camera name="top" mode="targetbody" target="table" pos="0 -.75 1.75" fovy="60"/>
    <camera name="front" mode="targetbody" target="table" pos="1.1 -.9 1.2" fovy="55"/>
  </worldbody>
</mujoco>
"""


def render_frames(n: int, height: int = HEIGHT, width: int = WIDTH, camera: str = "top", seed: int = 0) -> np.ndarray:
    """(n, height, width, 3) uint8 renders: objects drift and turn, the camera sways a little."""
    import mujoco

    model = mujoco.MjModel.from_xml_string(SCENE_XML)
    data = mujoco.MjData(model)
    rng = np.random.default_rng(seed)
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if cam < 0:
        raise ValueError(f"no camera {camera!r} in the bench scene")
    cam_pos0 = model.cam_pos[cam].copy()
    base = data.mocap_pos.copy() if model.nmocap else np.zeros((0, 3))
    for i in range(model.nmocap):
        base[i] = model.body_pos[np.flatnonzero(model.body_mocapid == i)[0]]
    phase = rng.uniform(0, 2 * np.pi, size=(model.nmocap, 3))
    speed = rng.uniform(0.5, 1.5, size=(model.nmocap, 1))
    out = np.empty((n, height, width, 3), dtype=np.uint8)
    renderer = mujoco.Renderer(model, height, width)
    try:
        for k in range(n):
            t = k / 50.0  # 50 Hz
            wobble = np.sin(speed * t * 2.0 + phase)
            data.mocap_pos[:] = base + wobble * np.array([0.04, 0.04, 0.0])
            data.mocap_pos[-1] = base[-1] + np.array([0.15 * np.sin(t), 0.1 * np.cos(0.7 * t), 0.05 * np.sin(1.3 * t)])
            for i in range(model.nmocap):
                yaw = 0.6 * speed[i, 0] * t + phase[i, 0]
                data.mocap_quat[i] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
            model.cam_pos[cam] = cam_pos0 + 0.02 * np.array([np.sin(0.9 * t), np.cos(0.6 * t), np.sin(1.1 * t)])
            mujoco.mj_forward(model, data)
            renderer.update_scene(data, camera=cam)
            out[k] = renderer.render()
    finally:
        renderer.close()
    return out


def add_sensor_noise(frames: np.ndarray, sigma: float = 3.0, seed: int = 0) -> np.ndarray:
    """Frames plus i.i.d. Gaussian noise, rounded and clipped to uint8 (a stand-in for a real sensor)."""
    rng = np.random.default_rng(seed)
    out = np.empty_like(frames)
    for i in range(len(frames)):  # per frame: keeps the float temporary small
        noisy = frames[i].astype(np.float32) + rng.normal(0.0, sigma, size=frames.shape[1:]).astype(np.float32)
        out[i] = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
    return out


# ---------------------------------------------------------------------- measuring
def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name != "zarr.json")


def _candidates() -> dict[str, tuple[str, object]]:
    """name -> (kind, factory). kind: 'store' (an IMAGE_CODECS choice), 'extra' or 'reference'."""
    from zarr.codecs import BloscCodec, ZstdCodec

    from robo_rl.data.store import IMAGE_CODECS

    cands: dict[str, tuple[str, object]] = {name: ("store", f) for name, f in IMAGE_CODECS.items()}
    cands["zstd-3 (zarr ZstdCodec)"] = ("extra", lambda: ZstdCodec(level=3))
    cands["zstd, 1-frame chunks"] = ("extra-chunk1", IMAGE_CODECS["zstd"])
    cands["blosc-lz4 bitshuffle, 1-frame chunks"] = (
        "extra-chunk1", lambda: BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=1))
    cands["none (zarr overhead only)"] = ("reference", lambda: None)
    return cands


def measure_zarr(frames: np.ndarray, factory, workdir: Path, repeats: int, n_random: int, seed: int,
                 chunk_frames: int | None = None) -> dict:
    import zarr

    from robo_rl.data.store import IMAGE_CHUNK, IMAGE_SHARD

    if chunk_frames is None:
        chunk_frames = IMAGE_CHUNK
    n, h, w, c = frames.shape
    raw = frames.nbytes
    enc = []
    path = workdir / "arr"
    for _ in range(repeats):
        shutil.rmtree(path, ignore_errors=True)
        comp = factory()
        arr = zarr.create_array(
            store=str(path),
            shape=frames.shape,
            chunks=(chunk_frames, h, w, c),
            shards=(IMAGE_SHARD, h, w, c),
            dtype="uint8",
            compressors=comp if comp is not None else None,
            fill_value=0,
            zarr_format=3,
        )
        t0 = time.perf_counter()
        arr[:] = frames
        enc.append(time.perf_counter() - t0)
    on_disk = _dir_bytes(path)
    dec = []
    for _ in range(repeats):
        arr = zarr.open_array(str(path), mode="r")
        t0 = time.perf_counter()
        back = arr[:]
        dec.append(time.perf_counter() - t0)
        if not np.array_equal(back, frames):
            raise AssertionError("codec round trip is not lossless")
    arr = zarr.open_array(str(path), mode="r")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=n_random)
    arr[int(idx[0])]  # first access opens the array's metadata path; not a frame read
    t0 = time.perf_counter()
    for i in idx:
        arr[int(i)]
    per_frame = (time.perf_counter() - t0) / n_random
    shutil.rmtree(path, ignore_errors=True)
    return {
        "ratio": raw / on_disk,
        "enc": raw / min(enc) / 1e6,
        "dec": raw / min(dec) / 1e6,
        "frame_ms": per_frame * 1e3,
        "bytes_per_frame": on_disk / n,
    }


def measure_jpeg(frames: np.ndarray, quality: int, repeats: int, n_random: int, seed: int) -> dict:
    import cv2

    raw = frames.nbytes
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    enc, encoded = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        encoded = [cv2.imencode(".jpg", f, params)[1] for f in frames]
        enc.append(time.perf_counter() - t0)
    dec, back = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        back = np.stack([cv2.imdecode(b, cv2.IMREAD_UNCHANGED) for b in encoded])
        dec.append(time.perf_counter() - t0)
    mse = np.mean((back.astype(np.float64) - frames.astype(np.float64)) ** 2)
    psnr = 10 * np.log10(255.0**2 / mse) if mse > 0 else float("inf")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(frames), size=n_random)
    t0 = time.perf_counter()
    for i in idx:
        cv2.imdecode(encoded[int(i)], cv2.IMREAD_UNCHANGED)
    per_frame = (time.perf_counter() - t0) / n_random
    size = sum(len(b) for b in encoded)
    return {
        "ratio": raw / size,
        "enc": raw / min(enc) / 1e6,
        "dec": raw / min(dec) / 1e6,
        "frame_ms": per_frame * 1e3,
        "bytes_per_frame": size / len(frames),
        "psnr": psnr,
    }


def run(frame_sets: dict[str, np.ndarray], repeats: int, n_random: int, seed: int) -> dict[str, dict[str, dict]]:
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_codecs_") as tmp:
        for label, frames in frame_sets.items():
            rows: dict[str, dict] = {}
            for name, (kind, factory) in _candidates().items():
                chunk = 1 if kind == "extra-chunk1" else None
                rows[name] = {"kind": kind, **measure_zarr(frames, factory, Path(tmp), repeats, n_random, seed, chunk)}
            rows["jpeg-q90 (cv2)"] = {"kind": "lossy", **measure_jpeg(frames, 90, repeats, n_random, seed)}
            results[label] = rows
    return results


def recommend(results: dict[str, dict[str, dict]], need_mb_s: float) -> tuple[str | None, str]:
    """Among store-usable lossless codecs that encode at least `need_mb_s` on one thread on every
    frame type, the best geometric mean of ratios over the frame types (sim renders and noisy
    camera-like frames count alike); ratios within 3% go to the faster decoder."""
    labels = list(results)
    usable = [
        name
        for name, row in results[labels[0]].items()
        if row["kind"] == "store" and all(results[lb][name]["enc"] >= need_mb_s for lb in labels)
    ]
    if not usable:
        return None, f"no lossless codec encodes >= {need_mb_s:.0f} MB/s on one thread"
    gmean = {n: float(np.exp(np.mean([np.log(results[lb][n]["ratio"]) for lb in labels]))) for n in usable}
    best = max(gmean.values())
    close = [n for n in usable if gmean[n] >= 0.97 * best]
    pick = max(close, key=lambda n: results[labels[-1]][n]["dec"])
    real = labels[-1]
    best_real = max(usable, key=lambda n: results[real][n]["ratio"])
    why = (
        f"{pick}: ratio " + " / ".join(f"{results[lb][pick]['ratio']:.2f}x on {lb}" for lb in labels)
        + f", encode >= {min(results[lb][pick]['enc'] for lb in labels):.0f} MB/s on one thread (needed {need_mb_s:.0f})"
        + f", decode {results[real][pick]['dec']:.0f} MB/s"
    )
    if best_real != pick:
        why += f"; on noisy frames alone {best_real} is best ({results[real][best_real]['ratio']:.2f}x): image_codec={best_real}"
    return pick, why


def print_tables(results: dict[str, dict[str, dict]], n_frames: int, threads: int, console=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 150))
    for label, rows in results.items():
        t = Table(
            title=f"{label}: {n_frames} frames {HEIGHT}x{WIDTH}x3 uint8, {threads} thread(s), best of runs",
            box=box.MARKDOWN,
            title_justify="left",
        )
        for col in ("codec", "ratio", "enc MB/s", "dec MB/s", "random frame ms", "KB/frame", "note"):
            t.add_column(col, justify="left" if col in ("codec", "note") else "right")
        for name, r in rows.items():
            note = {
                "store": "robo_rl IMAGE_CODECS",
                "extra": "candidate, not in IMAGE_CODECS",
                "extra-chunk1": "1 frame per chunk (store uses IMAGE_CHUNK)",
                "reference": "reference: zarr floor",
                "lossy": f"lossy, reference only (PSNR {r.get('psnr', 0):.1f} dB)",
            }[r["kind"]]
            t.add_row(
                name,
                f"{r['ratio']:.2f}",
                f"{r['enc']:.0f}",
                f"{r['dec']:.0f}",
                f"{r['frame_ms']:.3f}",
                f"{r['bytes_per_frame'] / 1e3:.1f}",
                note,
            )
        console.print(t)
        console.print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=None, help="frames per set (default 200; 64 with --quick)")
    ap.add_argument("--quick", action="store_true", help="fewer frames and runs: a smoke test")
    ap.add_argument("--threads", type=int, default=1, help="compression threads (default 1, like the Recorder's writer)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = args.frames or (64 if args.quick else 200)
    repeats = 1 if args.quick else 3
    n_random = 50 if args.quick else 200

    import cv2
    import numcodecs.blosc
    import zarr

    from robo_rl.data.store import DEFAULT_IMAGE_CODEC

    numcodecs.blosc.set_nthreads(args.threads)
    zarr.config.set({"threading.max_workers": args.threads})
    cv2.setNumThreads(args.threads)

    t_start = time.perf_counter()
    t0 = time.perf_counter()
    clean = render_frames(n, seed=args.seed)
    noisy = add_sensor_noise(clean, sigma=3.0, seed=args.seed + 1)
    print(f"rendered {n} frames {HEIGHT}x{WIDTH} in {time.perf_counter() - t0:.1f} s (MUJOCO_GL={os.environ['MUJOCO_GL']})")
    sets = {"(a) MuJoCo renders": clean, "(b) renders + Gaussian noise sigma=3": noisy}
    results = run(sets, repeats, n_random, args.seed)
    print_tables(results, n, args.threads)

    # The Recorder's writer compresses 2 cameras x 50 Hz x 230 KB = 23 MB/s on one niced thread
    # next to the control loop; ask for 4x that so it keeps up with room to spare.
    need = 4 * 2 * 50 * HEIGHT * WIDTH * 3 / 1e6
    pick, why = recommend(results, need)
    agree = "" if pick is None else ("  (= current default)" if pick == DEFAULT_IMAGE_CODEC else f"  (current default: {DEFAULT_IMAGE_CODEC})")
    print(f"recommendation: {why}{agree}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
