"""Data benchmark: window sampling throughput and recording latency, each against a baseline
measured in the same run.

(a) sampling: windows of To=2 observations and H=16 actions, batch 64, from three stores
    (low-dim only; + 2 cameras 96x96; + 2 cameras 240x320). Rows:
      robo_rl WindowSampler.sample in-process; robo_rl window_loader with 0/1/2 workers;
      a naive per-sample loader (list of per-episode arrays, random episode and step, slices
      padded with np.pad/concatenate, np.stack per batch) in-process and as a torch Dataset with
      default collate and 0/1/2 workers; LeRobot's loader as quoted numbers (not run here).
    Loader rows are steady state: the first batches (worker start-up, prefetch queue) are skipped.
(b) recording: 14-D state + 14-D action + 2 cameras 240x320 at 50 Hz, paced in real time, into
    the Recorder (non-blocking, writer process) and, as the baseline, EpisodeStore's writer called
    synchronously in the loop. Camera frames are MuJoCo renders (bench/image_codecs.py's scene).
(c) real cameras: three cameras 480x640 at 30 fps read by a 50 Hz loop with 14-D state and
    action, 10 minutes paced in real time, into the Recorder with JPEG frames (quality 85) and
    96x96 training-size copies; the baseline, in the same run, is the same Recorder with the best
    lossless codec for 1 minute. Frames: renders plus Gaussian noise, sigma 3 (bench/lossy_codecs.py).
    Then training windows/s with two of those cameras at 96x96 read from that store, against
    windows cut from the full frames (decode two 480x640 JPEGs per camera, downscale) as the
    baseline in the same run.

    python bench/data.py [--quick] [--only sampling|recording|cameras] [--minutes 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table, steal_seconds  # noqa: E402

from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.store import DEFAULT_IMAGE_CODEC, EpisodeStore

FPS = 50
BATCH = 64
N_OBS = 2
HORIZON = 16
# windows/s on this kind of 2-core machine, quoted (not run here); its camera row used 96x128 frames
QUOTED_LEROBOT = {"low-dim": (694, "state only"), "2 cams 96x96": (179, "2 cams 96x128")}
TARGETS = {"low-dim": 20_000, "2 cams 96x96": 2_000}
CAMS = ("top", "wrist")




def _load_codecs_module():
    """bench/image_codecs.py, for its MuJoCo scene."""
    import image_codecs

    return image_codecs


def _rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


# ====================================================================== (a) sampling
def make_schema(image_hw: tuple[int, int] | None) -> Schema:
    keys: dict = {"obs/qpos": "(14,) float32", "action": "(14,) float32"}
    if image_hw:
        for cam in CAMS:
            keys[f"obs/images/{cam}"] = ((*image_hw, 3), "uint8")
    return Schema.build(keys, fps=FPS, robot="aloha")


def build_store(path: Path, image_hw: tuple[int, int] | None, n_eps: int, ep_len: int, seed: int) -> None:
    """Random-walk state/action; smooth moving gradients as camera frames (content is irrelevant here)."""
    rng = np.random.default_rng(seed)
    schema = make_schema(image_hw)
    store = EpisodeStore.create(path, schema, overwrite=True)
    if image_hw:
        h, w = image_hw
        yy, xx = np.mgrid[0:h, 0:w]
        base = ((xx * 256 // w + yy * 128 // h)[..., None] + np.array([0, 85, 170])).astype(np.uint8)
    for ep in range(n_eps):
        data = {
            "obs/qpos": np.cumsum(rng.normal(0, 0.01, (ep_len, 14)), axis=0).astype(np.float32),
            "action": np.cumsum(rng.normal(0, 0.01, (ep_len, 14)), axis=0).astype(np.float32),
        }
        if image_hw:
            for c, cam in enumerate(CAMS):
                shift = ((np.arange(ep_len) * 3 + ep * 13 + c * 50) % 256).astype(np.uint8)
                data[f"obs/images/{cam}"] = base[None] + shift[:, None, None, None]
        store.add_episode(data, np.arange(ep_len) / FPS, "TELEOP", EpisodeMeta(task="bench"))
    store.close()


class NaiveWindows:
    """How simple loaders do it: per-episode arrays, per-sample slicing and padding, np.stack."""

    def __init__(self, store: EpisodeStore, obs_keys: list[str], action_key: str, n_obs: int, horizon: int):
        self.obs_keys, self.action_key, self.n_obs, self.horizon = obs_keys, action_key, n_obs, horizon
        self.episodes = [store.episode(i, keys=[*obs_keys, action_key]) for i in range(store.n_episodes)]
        self.lengths = [len(ep[action_key]) for ep in self.episodes]
        # global index -> (episode, step), as a map-style dataset needs
        self.index = [(e, t) for e, n in enumerate(self.lengths) for t in range(n)]

    def window(self, e: int, t: int) -> dict[str, np.ndarray]:
        ep = self.episodes[e]
        n = self.lengths[e]
        out = {}
        lo = t - self.n_obs + 1
        pad_front = max(0, -lo)
        for k in self.obs_keys:
            x = ep[k][max(lo, 0) : t + 1]
            if pad_front:
                x = np.concatenate([np.repeat(x[:1], pad_front, axis=0), x], axis=0)
            out[k] = x
        a = ep[self.action_key][t : t + self.horizon]
        pad_back = self.horizon - len(a)
        if pad_back:
            a = np.pad(a, [(0, pad_back)] + [(0, 0)] * (a.ndim - 1), mode="edge")
        out[self.action_key] = a
        out["obs_is_pad"] = np.arange(lo, t + 1) < 0
        out["action_is_pad"] = np.arange(t, t + self.horizon) >= n
        return out

    def sample(self, batch_size: int, rng: random.Random) -> dict[str, np.ndarray]:
        items = []
        for _ in range(batch_size):
            e = rng.randrange(len(self.episodes))
            items.append(self.window(e, rng.randrange(self.lengths[e])))
        return {k: np.stack([it[k] for it in items]) for k in items[0]}


def naive_dataset(naive: NaiveWindows):
    import torch
    from torch.utils.data import Dataset

    class NaiveDataset(Dataset):
        def __len__(self) -> int:
            return len(naive.index)

        def __getitem__(self, i: int):
            e, t = naive.index[i]
            return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in naive.window(e, t).items()}

    return NaiveDataset()


def _rate_calls(fn, min_time: float, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return n * BATCH / dt


def _rate_loader(loader, min_time: float, skip_batches: int, skip_time: float) -> float:
    """Windows/s in steady state: skip start-up batches (and at least skip_time s) before timing."""
    it = iter(loader)
    t0 = time.perf_counter()
    k = 0
    while k < skip_batches or time.perf_counter() - t0 < skip_time:
        next(it)
        k += 1
    n, t0 = 0, time.perf_counter()
    while True:
        b = next(it)
        n += len(b["action"])
        dt = time.perf_counter() - t0
        if dt >= min_time:
            break
    del it
    return n / dt


def sampling_benchmark(args, console) -> None:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from robo_rl.data.sampler import WindowSampler, window_loader

    if args.quick:
        settings = [("low-dim", None, 10, 200), ("2 cams 96x96", (96, 96), 10, 200), ("2 cams 240x320", (240, 320), 4, 200)]
        min_time, skip_time = 0.4, 0.2
    else:
        settings = [("low-dim", None, 50, 400), ("2 cams 96x96", (96, 96), 50, 400), ("2 cams 240x320", (240, 320), 20, 400)]
        min_time, skip_time = 1.5, 0.5
    workers = [0, 1, 2]
    summary = []
    for si, (name, hw, n_eps, ep_len) in enumerate(settings):
        obs_keys = ["obs/qpos"] + ([f"obs/images/{c}" for c in CAMS] if hw else [])
        with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
            path = Path(tmp) / "store"
            t0 = time.perf_counter()
            build_store(path, hw, n_eps, ep_len, args.seed + si)
            t_build = time.perf_counter() - t0
            store = EpisodeStore.open(path)
            t0 = time.perf_counter()
            sampler = WindowSampler(store, obs_keys, "action", n_obs=N_OBS, horizon=HORIZON)
            t_sampler = time.perf_counter() - t0
            t0 = time.perf_counter()
            naive = NaiveWindows(store, obs_keys, "action", N_OBS, HORIZON)
            t_naive = time.perf_counter() - t0
            size = store.size_on_disk()

            # Same windows from both? (step t of episode e == global index start(e) + t here)
            check_rng = np.random.default_rng(args.seed)
            gidx = np.concatenate([[0, 1, ep_len - 1, ep_len, 2 * ep_len - 2], check_rng.integers(0, len(sampler), 20)])
            got = sampler.get(gidx)
            match = all(
                np.array_equal(got[k][j], naive.window(int(g) // ep_len, int(g) % ep_len)[k])
                for j, g in enumerate(gidx)
                for k in [*obs_keys, "action", "obs_is_pad", "action_is_pad"]
            )

            rows: list[tuple[str, str, float | None, str]] = []
            torch.manual_seed(args.seed)
            np_rng = np.random.default_rng(args.seed)
            rows.append(("robo_rl WindowSampler.sample (in-process)", "-", _rate_calls(lambda: sampler.sample(BATCH, np_rng), min_time), "ours"))
            for w in workers:
                loader = window_loader(sampler, BATCH, num_workers=w, seed=args.seed, num_batches=10**6)
                rows.append(("robo_rl window_loader", str(w), _rate_loader(loader, min_time, 3 + 2 * w, skip_time if w else 0.0), "ours"))
                del loader
                gc.collect()
            py_rng = random.Random(args.seed)
            rows.append(("naive per-sample (in-process)", "-", _rate_calls(lambda: naive.sample(BATCH, py_rng), min_time), "naive"))
            ds = naive_dataset(naive)
            for w in workers:
                g = torch.Generator().manual_seed(args.seed)
                loader = DataLoader(
                    ds,
                    batch_size=BATCH,
                    sampler=RandomSampler(ds, replacement=True, num_samples=BATCH * 10**6, generator=g),
                    num_workers=w,
                    persistent_workers=w > 0,
                )
                rows.append(("naive torch Dataset + default collate", str(w), _rate_loader(loader, min_time, 3 + 2 * w, skip_time if w else 0.0), "naive"))
                del loader
                gc.collect()
            if name in QUOTED_LEROBOT:
                q, what = QUOTED_LEROBOT[name]
                rows.append((f"LeRobot loader (QUOTED, not run; {what})", "?", float(q), "quoted"))
            rss = _rss_gb()
            del sampler, naive, ds, store
            gc.collect()

        naive_rate = {r[1]: r[2] for r in rows if r[3] == "naive"}
        target = TARGETS.get(name)
        t = table(
            f"(a) sampling, {name}: {n_eps} episodes x {ep_len} steps, To={N_OBS} H={HORIZON} batch {BATCH}"
            + (f", target >= {target:,} windows/s" if target else ", no target"),
            ["loader", "workers", "windows/s", "x naive (same workers)", "target", "pass"],
        )
        for label, wk, rate, kind in rows:
            base = naive_rate.get(wk) if kind == "ours" else None
            t.add_row(
                label,
                wk,
                f"{rate:,.0f}",
                f"{rate / base:.1f}x" if base else "-",
                f"{target:,}" if (target and kind == "ours") else "-",
                ("PASS" if rate >= target else "FAIL") if (target and kind == "ours") else "-",
            )
        console.print(t)
        console.print(
            f"store build {t_build:.1f} s, {size / 1e6:.1f} MB on disk; WindowSampler init (store -> RAM) {t_sampler:.2f} s; "
            f"naive load {t_naive:.2f} s; windows identical to naive baseline: {'yes' if match else 'NO'}; peak RSS {rss:.1f} GB"
        )
        console.print()
        ours = [r[2] for r in rows if r[3] == "ours"]
        summary.append((name, max(ours), target))
    line = "; ".join(
        f"{n}: best {r:,.0f} windows/s" + (f" ({'PASS' if r >= tg else 'FAIL'} >= {tg:,})" if tg else "") for n, r, tg in summary
    )
    console.print(f"sampling summary: {line}")
    console.print()


# ====================================================================== (b) recording
def _pctl(x, q) -> float:
    return float(np.percentile(np.asarray(x), q)) if len(x) else 0.0


class FrameSource:
    """Pre-rendered frames cycled; each pass rolls them sideways so no two steps repeat."""

    def __init__(self, n: int, seed: int):
        codecs_mod = _load_codecs_module()
        self.frames = {
            "top": codecs_mod.render_frames(n, camera="top", seed=seed),
            "wrist": codecs_mod.render_frames(n, camera="front", seed=seed + 1),
        }
        self.n = n

    def get(self, cam: str, i: int) -> np.ndarray:
        lap, k = divmod(i, self.n)
        f = self.frames[cam][k]
        return np.roll(f, 8 * lap, axis=1) if lap else f


def _record(kind: str, path: Path, schema: Schema, frames: FrameSource, n_steps: int, ep_steps: int, seed: int) -> dict:
    """Run a real-time 50 Hz loop; kind 'recorder' (robo_rl Recorder) or 'sync' (EpisodeWriter in the loop)."""
    from robo_rl.data.recorder import Recorder

    rng = np.random.default_rng(seed)
    qpos = np.cumsum(rng.normal(0, 0.01, (n_steps, 14)), axis=0).astype(np.float32)
    action = np.cumsum(rng.normal(0, 0.01, (n_steps, 14)), axis=0).astype(np.float32)
    period = 1.0 / FPS
    blocked, end_times, ticks, lateness = [], [], [], []
    rec = store = writer = None
    if kind == "recorder":
        rec = Recorder(path, schema, overwrite=True)
    else:
        store = EpisodeStore.create(path, schema, overwrite=True)
    gc.collect()
    t_start = time.perf_counter() + 0.05
    for i in range(n_steps):
        target = t_start + i * period
        now = time.perf_counter()
        if target > now:
            time.sleep(target - now)
        tick = time.perf_counter()
        ticks.append(tick)
        lateness.append(tick - target)
        meta = None
        if i % ep_steps == 0:
            meta = EpisodeMeta(task="bench_record", source="bench")
            if rec is not None:
                rec.start_episode(meta)
            else:
                writer = store.begin_episode(meta)
        step = {"obs/qpos": qpos[i], "action": action[i]}
        for cam in CAMS:
            step[f"obs/images/{cam}"] = frames.get(cam, i)
        ts = tick - t_start
        t0 = time.perf_counter()
        if rec is not None:
            rec.add_step(step, ts, "TELEOP")
        else:
            writer.add(step, ts, "TELEOP")
        blocked.append(time.perf_counter() - t0)
        if (i + 1) % ep_steps == 0 or i == n_steps - 1:
            t0 = time.perf_counter()
            if rec is not None:
                rec.end_episode(success=True)
            else:
                writer.commit(success=True)
            end_times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    if rec is not None:
        rstats = rec.stats()
        rec.close()
    else:
        rstats = None
        store.close()
    t_close = time.perf_counter() - t0
    with EpisodeStore.open(path) as check:
        in_store, episodes = check.n_steps, check.n_episodes
        size = check.size_on_disk()
        problems = check.validate(check_values=False)
        lengths = check.episode_lengths.tolist()
    periods = np.diff(ticks) * 1e3
    minutes = n_steps / FPS / 60
    return {
        "blocked": np.array(blocked) * 1e3,
        "end": np.array(end_times) * 1e3,
        "close_s": t_close,
        "stalls": rstats.stalls if rstats else None,
        "rstats": rstats,
        "handed": n_steps,
        "in_store": in_store,
        "episodes": episodes,
        "episodes_ended": len(end_times),
        "mb_per_min": size / 1e6 / minutes,
        "periods": periods,
        "late": int(np.sum(np.array(lateness) > period)),
        "problems": problems,
        "lengths": lengths,
    }


def recording_benchmark(args, console) -> None:
    seconds = 20 if args.quick else 120
    ep_seconds = 5 if args.quick else 15
    n_steps, ep_steps = seconds * FPS, ep_seconds * FPS
    schema = make_schema((240, 320))
    t0 = time.perf_counter()
    frames = FrameSource(50 if args.quick else 100, args.seed)
    console.print(f"rendered {frames.n} frames x 2 cameras 240x320 in {time.perf_counter() - t0:.1f} s")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_rec_") as tmp:
        for kind in ("recorder", "sync"):
            results[kind] = _record(kind, Path(tmp) / kind, schema, frames, n_steps, ep_steps, args.seed)
            gc.collect()
    r, s = results["recorder"], results["sync"]

    def fmt(x, spec=".3f"):
        return "-" if x is None else format(x, spec)

    t = table(
        f"(b) recording: 14-D state + 14-D action + 2 cameras 240x320 uint8 at {FPS} Hz, {seconds} s "
        f"({n_steps} steps) paced in real time, episodes of {ep_seconds} s, image codec {DEFAULT_IMAGE_CODEC} (default)",
        ["metric", "robo_rl Recorder", "sync EpisodeWriter (baseline)", "LeRobot (QUOTED)", "target", "pass"],
    )

    def row(metric, rv, sv, quoted="-", target="-", ok=None):
        t.add_row(metric, rv, sv, quoted, target, "-" if ok is None else ("PASS" if ok else "FAIL"))

    row("add_step blocked p50 (ms)", fmt(_pctl(r["blocked"], 50)), fmt(_pctl(s["blocked"], 50)))
    row("add_step blocked p99 (ms)", fmt(_pctl(r["blocked"], 99)), fmt(_pctl(s["blocked"], 99)), "1.5", "< 1", _pctl(r["blocked"], 99) < 1.0)
    row("add_step blocked max (ms)", fmt(r["blocked"].max()), fmt(s["blocked"].max()))
    row(
        "end_episode/commit() p99 (ms)",
        fmt(_pctl(r["end"], 99)),
        fmt(_pctl(s["end"], 99), ".1f"),
        "500-1800 (8 s ep.)",
    )
    row("end_episode/commit() max (ms)", fmt(r["end"].max()), fmt(s["end"].max(), ".1f"))
    row("close() waited (s)", fmt(r["close_s"], ".2f"), fmt(s["close_s"], ".2f"))
    row("stalls (ring full)", str(r["stalls"]), "n/a")
    row(
        "frames dropped (handed - stored)",
        f"{r['handed'] - r['in_store']} ({r['handed']} - {r['in_store']})",
        f"{s['handed'] - s['in_store']} ({s['handed']} - {s['in_store']})",
        "-",
        "0",
        r["handed"] == r["in_store"],
    )
    row("episodes committed / ended", f"{r['episodes']} / {r['episodes_ended']}", f"{s['episodes']} / {s['episodes_ended']}")
    row("MB on disk per minute", fmt(r["mb_per_min"], ".0f"), fmt(s["mb_per_min"], ".0f"))
    row("tick period p50 (ms)", fmt(_pctl(r["periods"], 50), ".2f"), fmt(_pctl(s["periods"], 50), ".2f"))
    row("tick period p99 (ms)", fmt(_pctl(r["periods"], 99), ".2f"), fmt(_pctl(s["periods"], 99), ".2f"))
    row("tick period max (ms)", fmt(r["periods"].max(), ".1f"), fmt(s["periods"].max(), ".1f"))
    row("ticks > 20 ms behind schedule", str(r["late"]), str(s["late"]))
    console.print(t)
    rs = r["rstats"]
    console.print(
        f"Recorder.stats(): blocked p50/p99/max {rs.blocked_p50_ms:.3f}/{rs.blocked_p99_ms:.3f}/{rs.blocked_max_ms:.3f} ms, "
        f"end_p99 {rs.end_p99_ms:.3f} ms, stalls {rs.stalls}, committed {rs.episodes_committed}/{rs.episodes_ended} at stats() time; "
        f"store validate(): recorder {r['problems'] or 'ok'}, sync {s['problems'] or 'ok'}"
    )
    console.print(f"episode lengths in store (each episode handed {ep_steps} steps, last may be shorter): "
                  f"Recorder {r['lengths']}, sync {s['lengths']}")
    console.print()


# ====================================================================== (c) real cameras
CAM_FPS = 30
REAL_CAMS = ("top", "left_wrist", "right_wrist")
REAL_HW = (480, 640)
TRAIN_HW = (96, 96)


def camera_frames(n: int, seed: int) -> dict[str, list[np.ndarray]]:
    """n distinct noisy 480x640 frames per camera (renders + sigma-3 noise), cycled by the loop:
    per-frame JPEG gains nothing from a frame seen a lap earlier, so cycling flatters no size."""
    from image_codecs import add_sensor_noise, render_frames

    views = {"top": ("top", seed), "left_wrist": ("front", seed + 1), "right_wrist": ("top", seed + 2)}
    # a list of arrays: the loop hands the same array object until the next frame, as a ROS 2
    # camera's snapshot does
    return {cam: list(add_sensor_noise(render_frames(n, *REAL_HW, camera=view, seed=s), 3.0, seed=s + 10))
            for cam, (view, s) in views.items()}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Cameras:
    """Three cameras at 30 fps on their own thread, as a ROS 2 camera's transport thread: each
    frame arrives as a fresh array (a copy of a pre-rendered one, standing in for the decoding)
    and the loop reads the newest, the same array until the next one replaces it."""

    def __init__(self, frames: dict[str, list[np.ndarray]]):
        import threading

        self.frames, self.pool = frames, len(next(iter(frames.values())))
        self.latest = {c: (np.array(f[0]), 0) for c, f in frames.items()}  # camera -> (frame, capture index)
        self.produced = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Cameras":
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        k = 1
        while not self._stop.is_set():
            wait = self.t0 + k / CAM_FPS - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            for cam, f in self.frames.items():
                self.latest[cam] = (np.array(f[k % self.pool]), k)
            self.produced = k + 1
            k += 1


def _record_cameras(path: Path, frames: dict[str, np.ndarray], seconds: float, ep_seconds: float, codec: str,
                    seed: int, progress) -> dict:
    """A 50 Hz loop in real time reading the newest frame of each camera (`Cameras`)."""
    from robo_rl.data.recorder import Recorder

    schema = Schema.build({"obs/qpos": ((14,), "float32"), "action": ((14,), "float32"),
                           **{f"obs/images/{c}": ((*REAL_HW, 3), "uint8") for c in REAL_CAMS}}, fps=FPS, robot="aloha")
    n_steps, ep_steps = int(seconds * FPS), int(ep_seconds * FPS)
    rng = np.random.default_rng(seed)
    qpos = np.cumsum(rng.normal(0, 0.01, (n_steps, 14)), axis=0).astype(np.float32)
    cameras = Cameras(frames)
    pool = cameras.pool
    rec = Recorder(path, schema, overwrite=True, image_codec=codec, train_image_size=TRAIN_HW)
    writer_pid = rec._proc.pid
    blocked, end_times, after_end = [], [], []
    shown: list[list[int]] = []  # per step, the capture index of each camera's frame
    gc.collect()
    gc.freeze()  # as the episode loop does before its first tick (robo_rl/runtime/episodes.py),
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0 / FPS / 20)  # and with its GIL hand-over interval
    steal0 = steal_seconds()
    cpu0, wall0 = _cpu_seconds(writer_pid), time.perf_counter()
    t_start = time.perf_counter() + 0.05
    ended_at = None
    cameras.__enter__()
    for i in range(n_steps):
        target = t_start + i / FPS
        now = time.perf_counter()
        if target > now:
            time.sleep(target - now)
        tick = time.perf_counter() - t_start
        if i % ep_steps == 0:
            rec.start_episode(EpisodeMeta(task="bench_cameras", source="bench"))
        latest = dict(cameras.latest)
        shown.append([latest[cam][1] for cam in REAL_CAMS])
        step = {"obs/qpos": qpos[i], "action": qpos[i]}
        for cam in REAL_CAMS:
            step[f"obs/images/{cam}"] = latest[cam][0]
        t0 = time.perf_counter()
        rec.add_step(step, tick, "TELEOP")
        dt = time.perf_counter() - t0
        blocked.append(dt)
        if ended_at == i - 1:
            after_end.append(dt)
        if (i + 1) % ep_steps == 0 or i == n_steps - 1:
            t0 = time.perf_counter()
            rec.end_episode(success=True)
            end_times.append(time.perf_counter() - t0)
            ended_at = i
        if progress and i % (FPS * 10) == 0:
            progress(i, n_steps)
    cameras.__exit__()
    sys.setswitchinterval(switch)
    wall = time.perf_counter() - wall0
    writer_cpu = _cpu_seconds(writer_pid) - cpu0  # while the loop ran; the rest is close()'s drain
    steal = None if steal0 is None else steal_seconds() - steal0
    stats = rec.stats()
    t0 = time.perf_counter()
    rec.close()
    close_s = time.perf_counter() - t0
    shown = np.array(shown)  # (steps, cameras)
    captured = int(shown[-1, 0] - shown[0, 0] + 1)  # frames a camera produced between the first and last step
    seen = min(len(np.unique(shown[:, c])) for c in range(len(REAL_CAMS)))
    with EpisodeStore.open(path) as store:
        # a captured frame is kept when some step stores it (repeat 0); per camera, the fewest kept
        stored = min(len(np.unique(shown[store._read_rows(f"repeat/obs/images/{c}", slice(0, store.n_steps)) == 0, k]))
                     for k, c in enumerate(REAL_CAMS))
        psnr_db = store.image_psnr()
        # loss on frames spread over the run, against the exact frame handed in
        from robo_rl.data.codecs import psnr

        probe = np.linspace(0, store.n_steps - 1, 24).astype(int)
        measured = [psnr(store.read("obs/images/top", t, t + 1)[0], frames["top"][shown[t, 0] % pool]) for t in probe]
        problems = store.validate(check_values=False)
        size = store.size_on_disk()
        n_store = store.n_steps
    return {"codec": codec, "seconds": seconds, "steps": n_steps, "in_store": n_store, "blocked": np.array(blocked) * 1e3,
            "after_end": np.array(after_end) * 1e3, "end": np.array(end_times) * 1e3, "close_s": close_s,
            "stalls": stats.stalls, "captured": captured, "seen": seen, "stored": stored,
            "mb_per_min": size / 1e6 / (seconds / 60), "psnr_write": psnr_db, "psnr_probe": float(np.min(measured)),
            "psnr_probe_mean": float(np.mean(measured)), "writer_cpu": writer_cpu / wall, "problems": problems,
            "steal": None if steal is None else steal / (wall * (os.cpu_count() or 1))}


def _windows_from_small_copies(path: Path, cams: list[str], batches: int, seed: int) -> dict:
    from robo_rl.data.sampler import WindowSampler

    with EpisodeStore.open(path) as store:
        t0 = time.perf_counter()
        sampler = WindowSampler(store, ["obs/qpos", *cams], n_obs=N_OBS, horizon=HORIZON)
        load = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        batch = sampler.sample(BATCH, rng)
        shape = batch[cams[0]].shape
        rate = _rate_calls(lambda: sampler.sample(BATCH, rng), 3.0)
        n = len(sampler)
    # an epoch's worth of windows, counting the load: what a short fine-tuning run sees
    epoch = n / (load + n / rate)
    return {"load_s": load, "rate": rate, "epoch_rate": epoch, "windows": n, "shape": shape}


def _windows_from_full_frames(path: Path, cams: list[str], seconds: float, seed: int) -> dict:
    """The baseline: a window's frames read at full size (one JPEG decode per frame) and
    downscaled to 96x96 per window, as a loader over a store without training-size copies does."""
    from robo_rl.data.codecs import resize_rgb

    with EpisodeStore.open(path) as store:
        rng = np.random.default_rng(seed)
        n = store.n_steps
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(BATCH):
                t = int(rng.integers(N_OBS - 1, n))
                for cam in cams:
                    full = store.read(cam, t - N_OBS + 1, t + 1)
                    np.stack([resize_rgb(f, TRAIN_HW) for f in full])
                store.read("action", t, t + HORIZON)
            done += BATCH
        return {"rate": done / (time.perf_counter() - t0)}


def cameras_benchmark(args, console) -> None:
    minutes = 1.0 if args.quick else float(args.minutes)
    baseline_minutes = min(1.0, minutes)
    t0 = time.perf_counter()
    frames = camera_frames(30 if args.quick else 90, args.seed)
    console.print(f"rendered {len(frames['top'])} noisy frames x {len(REAL_CAMS)} cameras 480x640 in "
                  f"{time.perf_counter() - t0:.1f} s")

    def progress(i, n):
        console.print(f"  step {i}/{n} ({i / FPS / 60:.1f} of {n / FPS / 60:.1f} min)")

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_cams_") as tmp:
        for codec, mins in (("jpeg", minutes), ("blosc-zstd", baseline_minutes)):
            console.print(f"recording {mins:g} min with {codec} ...")
            results[codec] = _record_cameras(Path(tmp) / codec, frames, mins * 60, 60.0, codec, args.seed, progress)
            gc.collect()
        r, b = results["jpeg"], results["blosc-zstd"]

        def fmt(x, spec=".3f"):
            return "-" if x is None else format(x, spec)

        t = table(f"(c) real cameras: {len(REAL_CAMS)} cameras {REAL_HW[0]}x{REAL_HW[1]} at {CAM_FPS} fps + 14-D state at "
                  f"{FPS} Hz, paced in real time, episodes of 60 s, training-size copies {TRAIN_HW[0]}x{TRAIN_HW[1]}",
                  ["metric", f"jpeg q85, {minutes:g} min", f"blosc-zstd (lossless baseline), {baseline_minutes:g} min",
                   "target", "pass"])

        def fmt_share(x):
            return "-" if x is None else f"{100 * x:.2f}%"

        def row(metric, rv, bv, target="-", ok=None):
            t.add_row(metric, rv, bv, target, "-" if ok is None else ("PASS" if ok else "FAIL"))

        row("add_step blocked p50 (ms)", fmt(_pctl(r["blocked"], 50)), fmt(_pctl(b["blocked"], 50)))
        row("add_step blocked p99 (ms)", fmt(_pctl(r["blocked"], 99)), fmt(_pctl(b["blocked"], 99)), "< 1",
            _pctl(r["blocked"], 99) < 1.0)
        row("add_step blocked max (ms)", fmt(r["blocked"].max()), fmt(b["blocked"].max()))
        row("stalls (ring full: the writer fell behind)", str(r["stalls"]), str(b["stalls"]), "0", r["stalls"] == 0)
        row("frames dropped by the recorder (handed - stored), per camera", f"{r['seen'] - r['stored']} ({r['seen']} - {r['stored']})",
            f"{b['seen'] - b['stored']} ({b['seen']} - {b['stored']})", "0", r["seen"] == r["stored"])
        row("frames the loop never read (a tick > 13 ms late)", f"{r['captured'] - r['seen']} of {r['captured']}",
            f"{b['captured'] - b['seen']} of {b['captured']}", "reported")
        row("steps handed / in store", f"{r['steps']} / {r['in_store']}", f"{b['steps']} / {b['in_store']}", "equal",
            r["steps"] == r["in_store"])
        row("end_episode max (ms)", fmt(r["end"].max()), fmt(b["end"].max()))
        row("add_step right after an episode end, max (ms)", fmt(r["after_end"].max() if len(r["after_end"]) else 0.0),
            fmt(b["after_end"].max() if len(b["after_end"]) else 0.0), "no wait", bool(len(r["after_end"]) == 0 or r["after_end"].max() < 1.0))
        row("close() waited (s)", fmt(r["close_s"], ".2f"), fmt(b["close_s"], ".2f"))
        row("MB on disk per minute", fmt(r["mb_per_min"], ".0f"), fmt(b["mb_per_min"], ".0f"), "<= 300", r["mb_per_min"] <= 300)
        worst = min(r["psnr_write"].values()) if r["psnr_write"] else None
        row("PSNR at write time, worst episode and camera (dB)", fmt(worst, ".1f"), "lossless", ">= 35",
            worst is not None and worst >= 35)
        row("PSNR of 24 stored frames vs handed, min / mean (dB)", f"{r['psnr_probe']:.1f} / {r['psnr_probe_mean']:.1f}",
            "inf" if not np.isfinite(b["psnr_probe"]) else f"{b['psnr_probe']:.1f}", ">= 35", r["psnr_probe"] >= 35)
        row("writer process CPU (share of one core)", f"{100 * r['writer_cpu']:.0f}%", f"{100 * b['writer_cpu']:.0f}%",
            "reported")
        row("CPU time the VM's host took (steal), share of all cores", fmt_share(r["steal"]), fmt_share(b["steal"]),
            "reported")
        console.print(t)
        console.print(f"store validate(): jpeg {r['problems'] or 'ok'}, lossless {b['problems'] or 'ok'}; "
                      f"distinct frames seen by the loop per camera: {r['seen']} of {r['captured']} captured")

        cams = [f"obs/images/{c}" for c in REAL_CAMS[:2]]
        small = _windows_from_small_copies(Path(tmp) / "jpeg", cams, 0, args.seed)
        full = _windows_from_full_frames(Path(tmp) / "jpeg", cams, 5.0 if args.quick else 15.0, args.seed)
        t = table(f"(d) training windows (To={N_OBS}, H={HORIZON}, batch {BATCH}) with 2 cameras at 96x96 from the "
                  f"{minutes:g}-min jpeg store ({small['windows']:,} windows)",
                  ["loader", "windows/s", "load (s)", "windows/s over one epoch incl. load", "target", "pass"])
        t.add_row("robo_rl WindowSampler on the 96x96 copies", f"{small['rate']:,.0f}", f"{small['load_s']:.1f}",
                  f"{small['epoch_rate']:,.0f}", ">= 2,000", "PASS" if small["epoch_rate"] >= 2000 else "FAIL")
        t.add_row("windows cut from full frames (decode 480x640, downscale; baseline)", f"{full['rate']:,.0f}", "0", "-",
                  "-", "-")
        t.add_row("LeRobotDataset, 2 AV1 cameras (QUOTED, not run here)", "117", "-", "-", "-", "-")
        console.print(t)
        console.print(f"window batch {cams[0]}: {tuple(small['shape'])}")
    console.print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small stores, short measurements, 20 s recording")
    ap.add_argument("--only", choices=["sampling", "recording", "cameras"], default=None)
    ap.add_argument("--minutes", type=float, default=10.0, help="(c): minutes of three-camera recording")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    import torch

    torch.manual_seed(args.seed)
    console = make_console(150)
    console.print(
        f"bench/data.py: {os.cpu_count()} CPU(s) ({cpu_kind()}), torch {torch.__version__}, numpy {np.__version__}, "
        f"{'quick' if args.quick else 'full'} run, seed {args.seed}"
    )
    t0 = time.perf_counter()
    if args.only in (None, "sampling"):
        sampling_benchmark(args, console)
    if args.only in (None, "recording"):
        recording_benchmark(args, console)
    if args.only in (None, "cameras"):
        cameras_benchmark(args, console)
    console.print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
