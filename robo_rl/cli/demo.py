"""robo-rl demo: record -> inspect -> sample, on a simulated bimanual teleop stream.

Grows with the project; for now it exercises the episode store end to end the way a robot
would: a fixed-rate loop hands steps to the background Recorder, the store is validated, and
training windows are drawn from it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import human_bytes, print_table
from robo_rl.data.recorder import Recorder
from robo_rl.data.sampler import WindowSampler, split_episodes
from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.stats import get_stats
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("demo", "demo", run, argv)


class TeleopStream:
    """Two arms moving smoothly (6 joints + gripper each) and two cameras that see them move."""

    def __init__(self, cfg: DictConfig, rng: np.random.Generator):
        self.rng = rng
        self.freq = rng.uniform(0.2, 0.6, 14)
        self.phase = rng.uniform(0, 2 * np.pi, 14)
        h, w = cfg.height, cfg.width
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), np.full_like(xx, 90)], -1)
        self.background = base.astype(np.uint8)
        self.cameras = list(cfg.cameras)

    def step(self, t: float) -> tuple[dict, np.ndarray]:
        q = (0.6 * np.sin(2 * np.pi * self.freq * t + self.phase)).astype(np.float32)
        action = (q + 0.02 * self.rng.standard_normal(14)).astype(np.float32)
        obs = {"obs/qpos": q}
        shift = int(40 * np.sin(t))
        for i, cam in enumerate(self.cameras):
            obs[f"obs/images/{cam}"] = np.roll(self.background, shift * (i + 1), axis=1)
        obs["action"] = action
        return obs, q


def run(cfg: DictConfig) -> int:
    if cfg.episodes < 1 or cfg.seconds <= 0:
        raise ConfigError(f"demo: episodes must be >= 1 and seconds > 0, got {cfg.episodes} and {cfg.seconds}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    store_path = out / "store"
    keys = {"obs/qpos": ((14,), "float32"), "action": ((14,), "float32")}
    keys.update({f"obs/images/{c}": ((cfg.height, cfg.width, 3), "uint8") for c in cfg.cameras})
    schema = Schema.build(keys, fps=cfg.fps, robot="aloha_sim_stream")
    rng = np.random.default_rng(cfg.seed)
    stream = TeleopStream(cfg, rng)

    # 1. record: a fixed-rate loop hands each step to the Recorder and never waits on disk
    steps = int(cfg.seconds * cfg.fps)
    dt = 1.0 / cfg.fps
    late = 0
    t_start = time.perf_counter()
    with Recorder(store_path, schema, overwrite=True) as rec:
        bar = tqdm(total=cfg.episodes * steps, desc="record", unit="step")
        tick = time.perf_counter()
        for ep in range(cfg.episodes):
            rec.start_episode(EpisodeMeta(task="demo_stream", source="teleop", operator="sim"))
            for k in range(steps):
                t = ep * cfg.seconds + k * dt
                step, _ = stream.step(t)
                rec.add_step(step, timestamp=t, segment="TELEOP")
                bar.update()
                if cfg.realtime:
                    tick += dt
                    wait = tick - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        late += 1
            rec.end_episode(success=bool(rng.random() < 0.75))
        bar.close()
        t_close = time.perf_counter()
    close_wait = time.perf_counter() - t_close
    rs = rec.stats()
    print_table("recording (caller side)", ["measure", "value"], [
        ("steps handed over", rs.steps),
        ("episodes committed", rs.episodes_committed),
        ("add_step blocked p50 / p99 / max", f"{rs.blocked_p50_ms:.3f} / {rs.blocked_p99_ms:.3f} / {rs.blocked_max_ms:.3f} ms"),
        ("end_episode blocked p99", f"{rs.end_p99_ms:.3f} ms"),
        ("ring full stalls", rs.stalls),
        ("late loop ticks", late if cfg.realtime else "n/a (realtime=false)"),
        ("wait for writer at close", f"{close_wait:.2f} s"),
        ("wall time", f"{time.perf_counter() - t_start:.1f} s"),
    ])

    # 2. inspect and check the store
    store = EpisodeStore.open(store_path)
    facts = store.info()
    problems = store.validate()
    print_table(f"store {store_path}", ["", ""], [
        ("episodes / steps", f"{facts['episodes']} / {facts['steps']}"),
        ("frames dropped", rs.steps - facts["steps"]),
        ("success rate", f"{facts['success_rate']:.0%}" if facts["success_rate"] is not None else "n/a"),
        ("size on disk", f"{human_bytes(facts['bytes_on_disk'])} ({facts['bytes_on_disk'] / 2**20 / (facts['duration_s'] / 60):.0f} MiB per minute)"),
        ("validate", "ok" if not problems else "; ".join(problems)),
    ])

    # 3. sample training windows with normalisation statistics saved in the store
    stats = get_stats(store)
    train, val = split_episodes(store.n_episodes, 0.25, seed=cfg.seed)
    obs_keys = ["obs/qpos"] + [f"obs/images/{c}" for c in cfg.cameras]
    sampler = WindowSampler(store, obs_keys, n_obs=cfg.n_obs, horizon=cfg.horizon, episodes=train)
    batch = sampler.sample(cfg.batch_size, np.random.default_rng(cfg.seed))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        sampler.sample(cfg.batch_size)
        n += cfg.batch_size
    rate = n / (time.perf_counter() - t0)
    print_table("training windows", ["", ""], [
        ("train / val episodes", f"{len(train)} / {len(val)}"),
        ("batch", ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items() if k in (*obs_keys, "action"))),
        ("action range (raw)", f"[{min(stats['action']['min']):.2f}, {max(stats['action']['max']):.2f}]"),
        ("windows per second", f"{rate:,.0f}"),
    ])
    print(f"\nstore: {store_path}   inspect it with: robo-rl dataset info {store_path}")
    return 0 if not problems and rs.steps == facts["steps"] else 1
