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

    python bench/data.py [--quick] [--only sampling|recording] [--seed 0]
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
from common import make_console, table  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small stores, short measurements, 20 s recording")
    ap.add_argument("--only", choices=["sampling", "recording"], default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    import torch

    torch.manual_seed(args.seed)
    console = make_console(150)
    console.print(
        f"bench/data.py: {os.cpu_count()} CPU(s), torch {torch.__version__}, numpy {np.__version__}, "
        f"{'quick' if args.quick else 'full'} run, seed {args.seed}"
    )
    t0 = time.perf_counter()
    if args.only in (None, "sampling"):
        sampling_benchmark(args, console)
    if args.only in (None, "recording"):
        recording_benchmark(args, console)
    console.print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
