"""robo-rl demo: the newest end-to-end story. Today: teleop in the twin -> record -> inspect -> sample.

The TransferCube scripted expert (the twin's stand-in for a human on the leader arms) drives the
MuJoCo twin at a fixed 50 Hz; each step goes to the background Recorder, which never blocks the
loop; the store is validated and training windows are drawn from it. Grows with the project
(policies, RaC) as those land.
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
from robo_rl.data.schema import EpisodeMeta
from robo_rl.data.stats import get_stats
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("demo", "demo", run, argv)


def run(cfg: DictConfig) -> int:
    if cfg.episodes < 1:
        raise ConfigError(f"demo: episodes must be >= 1, got {cfg.episodes}")
    from robo_rl.sim.recording import demo_schema, demo_step
    from robo_rl.sim.envs import BimanualEnv

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    store_path = out / "store"
    cameras = list(cfg.cameras)
    env = BimanualEnv(cfg.task, obs_mode="state+pixels", cameras=cameras, image_size=(cfg.height, cfg.width))
    schema = demo_schema(env, cameras, (cfg.height, cfg.width))
    fps = env.robot.spec.control_hz

    # 1. teleop in the twin: a fixed-rate loop hands each step to the Recorder, never waits on disk
    dt = 1.0 / fps
    late = successes = 0
    t_start = time.perf_counter()
    with Recorder(store_path, schema, overwrite=True) as rec:
        bar = tqdm(total=cfg.episodes, desc=f"teleop {cfg.task} in the twin at {fps:g} Hz", unit="ep")
        tick = time.perf_counter()
        for ep in range(cfg.episodes):
            obs, _ = env.reset(seed=cfg.seed + ep)
            expert = env.expert()
            rec.start_episode(EpisodeMeta(task=cfg.task, source="teleop", operator="scripted_expert",
                                          extra={"seed": cfg.seed + ep, "init_state": env.sim_state().tolist()}))
            for k in range(env.max_steps):
                prev = obs
                obs, _, terminated, truncated, info = env.step(expert.act())
                rec.add_step(demo_step(prev, info["executed_action"], cameras), timestamp=k * dt, segment="TELEOP")
                if cfg.realtime:
                    tick += dt
                    wait = tick - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        late += 1
                if terminated or truncated:
                    break
            successes += bool(info["success"])
            rec.end_episode(success=bool(info["success"]))
            bar.update()
        bar.close()
        t_close = time.perf_counter()
    env.close()
    close_wait = time.perf_counter() - t_close
    rs = rec.stats()
    print_table("teleop in the twin, recorded in the background", ["measure", "value"], [
        ("episodes / steps handed over", f"{rs.episodes_ended} / {rs.steps}"),
        ("expert success", f"{successes}/{cfg.episodes}"),
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
    obs_keys = ["obs/qpos", "obs/env_state"] + [f"obs/images/{c}" for c in cameras]
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
