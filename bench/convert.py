"""Converters and viewer benchmark: what each costs on top of the library doing the real
work, with that baseline measured in the same run on the same data.

Data: a store built in a temp dir by the twin's scripted expert (transfer_cube, camera `top` at
240x320, as `robo-rl collect` records it): real MuJoCo renders, not noise. Rows:

  export LeRobot v3.0   export_lerobot(codec=libsvtav1 | h264, crf 30): frames/s, MB written,
                        PSNR and mean abs error from its decode-back check. Baseline: bare PyAV
                        encode of the same in-memory frames with the same encoder settings (crf,
                        g=2, preset 12 / bf=0, yuv420p), one encoder, to a temp mp4. Ours adds a
                        fresh encoder per episode, the remux into LeRobot's files, parquet + stats,
                        and the decode-back check of every frame.
  import LeRobot        import_lerobot of that export: frames/s. Baseline: bare PyAV decode
                        (threaded, to RGB arrays) of the same mp4 files.
  import ACT HDF5       import_hdf5 of the same episodes written with h5py in ACT's layout (raw
                        uint8 frames, chunks of one frame): steps/s. Baseline: h5py reading the
                        same datasets into memory.
  Rerun .rrd           RerunLogger.log_episode of one episode to a file, without cameras, with raw
                        frames, with JPEG q90 frames (the default): steps/s. Baseline: the per-step
                        loop a user writes by hand (set_time + rr.Scalars / rr.Image per step, the
                        same JPEG encode for the JPEG row), reading the episode from the store too.
  dataset plots         dataset_plots (4 PNGs): seconds. Baseline: one hand-written matplotlib
                        figure (a histogram per action dimension) from the same store.

Both import rows write a store, whose lossless image compression is a large share of their time;
the notes give the store write of the same frames alone (add_episode from memory, best of
--repeats) for scale.

    python bench/convert.py [--quick] [--episodes 4] [--repeats 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is imported anywhere
os.environ.setdefault("SVT_LOG", "1")  # svt-av1's banner per encoder, in the baseline too

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import make_console, table  # noqa: E402

from robo_rl.data.schema import IMAGE_PREFIX, SEGMENT_KEY, TIMESTAMP_KEY, EpisodeMeta, Schema  # noqa: E402
from robo_rl.data.store import EpisodeStore  # noqa: E402

TASK = "transfer_cube"
CAMERA = "top"
IMAGE_SIZE = (240, 320)
CODECS = ("libsvtav1", "h264")
CRF = 30  # export_lerobot's default, given to both
MB = 1 << 20


def timed(fn, repeats: int = 1):
    """Best wall time of `repeats` calls, and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# ====================================================================== the store
def build_store(path: Path, episodes: int, seed: int) -> tuple[float, int]:
    """`episodes` scripted-expert episodes with camera frames, written as `robo-rl collect` writes them.
    Returns (seconds, tries)."""
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.recording import demo_schema, expert_episode

    t0 = time.perf_counter()
    env = BimanualEnv(TASK, obs_mode="state+pixels", cameras=[CAMERA], image_size=IMAGE_SIZE)
    store = EpisodeStore.create(path, demo_schema(env, [CAMERA], IMAGE_SIZE))
    kept = tries = 0
    while kept < episodes and tries < 2 * episodes:
        data, ok, facts = expert_episode(env, seed + tries, ExpertNoise(), [CAMERA])
        tries += 1
        if ok:  # collect's default: successful demos only
            n = len(data["action"])
            store.add_episode(data, np.arange(n) / env.robot.spec.control_hz, "SCRIPTED",
                              EpisodeMeta(task=TASK, success=ok, source="scripted", operator="expert", extra=facts))
            kept += 1
    store.close()
    env.close()
    if kept < episodes:
        raise SystemExit(f"only {kept} of {episodes} expert episodes succeeded in {tries} tries")
    return time.perf_counter() - t0, tries


def store_write_rate(tmp: Path, episodes: list[dict[str, np.ndarray]], schema: Schema, repeats: int) -> float:
    """Steps/s of EpisodeStore.add_episode for the same episodes from memory (the imports' write side)."""
    def write():
        store = EpisodeStore.create(tmp / "write_only", schema, overwrite=True)
        for ep in episodes:
            n = len(ep["action"])
            store.add_episode(ep, np.arange(n) / schema.fps, "SCRIPTED", EpisodeMeta(task=TASK))
        store.close()

    dt, _ = timed(write, repeats)
    return sum(len(ep["action"]) for ep in episodes) / dt


# ====================================================================== 1. export
def bare_encode(frames: list[np.ndarray], path: Path, codec: str, fps: int) -> int:
    """Every frame through one PyAV encoder with the export's settings; returns the mp4's bytes."""
    from robo_rl.data.codecs import encode_mp4  # the export's own encoder settings, all frames at once

    h, w = frames[0].shape[1:3]
    path.write_bytes(encode_mp4(iter(frames), fps, codec, CRF, h, w))
    return path.stat().st_size


# ====================================================================== 2. import
def bare_decode(files: list[Path]) -> int:
    """Every frame of the mp4 files decoded to RGB arrays (threaded, as the importer's reader); returns frames."""
    import av

    n = 0
    for f in files:
        with av.open(str(f)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                frame.to_ndarray(format="rgb24")
                n += 1
    return n


# ====================================================================== 3. ACT HDF5
def write_act_hdf5(folder: Path, episodes: list[dict[str, np.ndarray]]) -> None:
    """episode_<i>.hdf5 as ACT's record_sim_episodes writes them: raw uint8 frames, one frame per chunk."""
    import h5py

    folder.mkdir(parents=True)
    for i, ep in enumerate(episodes):
        with h5py.File(folder / f"episode_{i}.hdf5", "w", rdcc_nbytes=1024**2 * 2) as f:
            f.attrs["sim"] = True
            obs = f.create_group("observations")
            images = obs.create_group("images")
            frames = ep[IMAGE_PREFIX + CAMERA]
            images.create_dataset(CAMERA, data=frames, dtype="uint8", chunks=(1, *frames.shape[1:]))
            obs.create_dataset("qpos", data=ep["obs/qpos"])
            obs.create_dataset("qvel", data=ep["obs/qvel"])
            f.create_dataset("action", data=ep["action"])


def h5_read(folder: Path) -> int:
    """Every dataset of every file into memory; returns steps."""
    import h5py

    steps = 0
    for path in sorted(folder.glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            f["/observations/qpos"][()]
            f["/observations/qvel"][()]
            f["/action"][()]
            steps += len(f[f"/observations/images/{CAMERA}"][()])
    return steps


# ====================================================================== 4. Rerun
def rerun_ours(store_path: Path, rrd: Path, jpeg_quality: int | None) -> int:
    from robo_rl.data.viewer import RerunLogger

    with EpisodeStore.open(store_path) as store:
        logger = RerunLogger("bench", save=rrd, jpeg_quality=jpeg_quality)
        logger.log_episode(store, 0)
        logger.close()
    return rrd.stat().st_size


def rerun_by_hand(store_path: Path, rrd: Path, images: str | None) -> int:
    """A user's loop: one set_time + log per key per step. images: None, "raw" or "jpeg" (q90, cv2)."""
    import rerun as rr

    from robo_rl.data.codecs import encode_jpeg

    with EpisodeStore.open(store_path) as store:
        schema = store.schema
        keys = [*schema.lowdim_keys, TIMESTAMP_KEY, SEGMENT_KEY, *(schema.image_keys if images else ())]
        ep = store.episode(0, keys)
    rec = rr.RecordingStream("robo_rl", recording_id="bench")
    rec.save(str(rrd))
    ts = ep[TIMESTAMP_KEY] - ep[TIMESTAMP_KEY][0]
    for t in range(len(ts)):
        rec.set_time("step", sequence=t)
        rec.set_time("time", duration=float(ts[t]))
        for key in schema.lowdim_keys:
            rec.log(key, rr.Scalars(ep[key][t].astype(np.float64)))
        rec.log("segment/id", rr.Scalars(float(ep[SEGMENT_KEY][t])))
        if images:
            for key in schema.image_keys:
                frame = ep[key][t]
                if images == "raw":
                    rec.log(key, rr.Image(frame))
                else:
                    rec.log(key, rr.EncodedImage(contents=encode_jpeg(frame, 90), media_type="image/jpeg"))
    rec.flush()
    rec.disconnect()
    return rrd.stat().st_size


# ====================================================================== 5. plots
def plots_by_hand(store_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with EpisodeStore.open(store_path) as store:
        actions = store.read("action")
    d = actions.shape[1]
    cols = 4
    fig, axes = plt.subplots((d + cols - 1) // cols, cols, figsize=(12, 2 * ((d + cols - 1) // cols)))
    for j, ax in enumerate(axes.flat):
        if j < d:
            ax.hist(actions[:, j], bins=50)
        else:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ====================================================================== main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 episodes instead of 4")
    ap.add_argument("--episodes", type=int, default=None, help="expert episodes in the store (default 4, --quick 2)")
    ap.add_argument("--repeats", type=int, default=3, help="best of N for the short measurements (Rerun, plots, h5py read, store write)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_eps = args.episodes or (2 if args.quick else 4)
    repeats = max(1, args.repeats)
    console = make_console(170)

    from robo_rl.data.aloha_hdf5 import import_hdf5
    from robo_rl.data.lerobot import import_lerobot
    from robo_rl.data.lerobot_export import export_lerobot
    from robo_rl.data.plots import dataset_plots

    rows: list[tuple[str, str, str, str, str]] = []

    def row(op: str, ours: float, base: float | None, unit: str, notes: str, higher_is_better: bool = True) -> None:
        fmt = (lambda v: f"{v:,.0f} {unit}") if unit != "s" else (lambda v: f"{v:.2f} s")
        if base is None:
            rows.append((op, fmt(ours), "-", "-", notes))
            return
        ratio = ours / base if higher_is_better else base / ours  # < 1: ours is slower
        rows.append((op, fmt(ours), fmt(base), f"{ratio:.2f}", notes))

    with tempfile.TemporaryDirectory(prefix="bench_convert_") as tmp_name:
        tmp = Path(tmp_name)
        src = tmp / "store"
        build_s, tries = build_store(src, n_eps, args.seed)
        with EpisodeStore.open(src) as store:
            schema = store.schema
            episodes = [store.episode(i, list(schema.keys)) for i in range(store.n_episodes)]
            fps = int(round(schema.fps))
        frames = [ep[IMAGE_PREFIX + CAMERA] for ep in episodes]
        n_frames = sum(len(f) for f in frames)
        raw_mb = sum(f.nbytes for f in frames) / MB
        console.print(f"store: {n_eps} {TASK} expert episodes ({tries} tries), {n_frames} steps, camera {CAMERA} "
                      f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} ({raw_mb:.0f} MB raw), rendered and written in {build_s:.1f} s")
        write_sps = store_write_rate(tmp, episodes, schema, repeats)

        # ------------------------------------------------------------ 1 + 2: LeRobot export and import
        for codec in CODECS:
            bare_encode([frames[0][:4]], tmp / "warm.mp4", codec, fps)  # encoder library loaded, caches warm
            base_s, base_bytes = timed(lambda: bare_encode(frames, tmp / f"bare_{codec}.mp4", codec, fps))
            out = tmp / f"lerobot_{codec}"
            ours_s, report = timed(lambda: export_lerobot(src, out, codec=codec, crf=CRF, progress=False))
            loss = report["image_loss"][CAMERA]
            video_mb = dir_bytes(out / "videos") / MB
            row(f"export LeRobot {codec}", n_frames / ours_s, n_frames / base_s, "frames/s",
                f"{dir_bytes(out) / MB:.2f} MB written (video {video_mb:.2f}, bare mp4 {base_bytes / MB:.2f}); "
                f"PSNR {loss['psnr_db']:.1f} dB, mean abs err {loss['mean_abs_error']:.2f}, max {loss['max_abs_error']}")

            mp4s = sorted((out / "videos").rglob("*.mp4"))
            base_s, decoded = timed(lambda: bare_decode(mp4s))
            assert decoded == n_frames, (decoded, n_frames)
            ours_s, imported = timed(lambda: import_lerobot(out, tmp / f"import_{codec}", progress=False))
            assert imported.n_steps == n_frames
            imported.close()
            row(f"import LeRobot {codec}", n_frames / ours_s, n_frames / base_s, "frames/s",
                f"{len(mp4s)} mp4; store write alone {write_sps:,.0f} steps/s")

        # ------------------------------------------------------------ 3: ACT HDF5
        act = tmp / "act"
        write_act_hdf5(act, episodes)
        h5_read(act)  # page cache warm for both
        base_s, steps = timed(lambda: h5_read(act), repeats)
        ours_s, imported = timed(lambda: import_hdf5([act], tmp / "import_act", overwrite=True, progress=False))
        assert imported.n_steps == steps == n_frames
        imported.close()
        row("import ACT HDF5 (raw frames)", n_frames / ours_s, n_frames / base_s, "steps/s",
            f"{dir_bytes(act) / MB:.0f} MB of .hdf5; store write alone {write_sps:,.0f} steps/s")

        # ------------------------------------------------------------ 4: Rerun
        importlib.import_module("rerun")  # its import is part of neither row

        lowdim = tmp / "lowdim"
        low_schema = Schema.build({k: (s.shape, s.dtype) for k, s in schema.keys.items() if not s.is_image},
                                  fps=schema.fps, robot=schema.robot)
        with EpisodeStore.create(lowdim, low_schema) as store:
            ep = episodes[0]
            store.add_episode({k: ep[k] for k in low_schema.keys}, np.arange(len(ep["action"])) / schema.fps,
                              "SCRIPTED", EpisodeMeta(task=TASK, success=True))
        ep_steps = len(episodes[0]["action"])
        for label, store_path, quality, by_hand in (("no cameras", lowdim, 90, None),
                                                    ("raw frames", src, None, "raw"),
                                                    ("JPEG q90 frames", src, 90, "jpeg")):
            rrd_ours, rrd_base = tmp / f"ours_{by_hand}.rrd", tmp / f"hand_{by_hand}.rrd"
            ours_s, ours_bytes = timed(lambda: rerun_ours(store_path, rrd_ours, quality), repeats)
            base_s, base_bytes = timed(lambda: rerun_by_hand(store_path, rrd_base, by_hand), repeats)
            row(f"Rerun .rrd, {label}", ep_steps / ours_s, ep_steps / base_s, "steps/s",
                f"1 episode, {ep_steps} steps; .rrd {ours_bytes / MB:.2f} MB (by hand {base_bytes / MB:.2f} MB)")

        # ------------------------------------------------------------ 5: plots
        import matplotlib

        matplotlib.use("Agg")
        importlib.import_module("matplotlib.pyplot")  # imported before both rows

        def plots():
            with EpisodeStore.open(src) as store:
                return dataset_plots(store, tmp / "plots")

        ours_s, written = timed(plots, repeats)
        base_s, _ = timed(lambda: plots_by_hand(src, tmp / "hand.png"), repeats)
        row("dataset plots", ours_s, base_s, "s", f"{len(written)} PNGs vs 1 hand-written action-histogram figure",
            higher_is_better=False)

    console.print(f"ratio = ours / baseline speed (< 1: ours is slower); export and import: one run each, "
                  f"Rerun, plots, h5py read and store write: best of {repeats}")
    t = table(f"converters and viewer: {n_eps} expert episodes, {n_frames} steps, camera {CAMERA} "
              f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}", ["operation", "ours", "baseline", "ratio", "notes"])
    t.columns[-1].justify = "left"
    for r in rows:
        t.add_row(*r)
    console.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
