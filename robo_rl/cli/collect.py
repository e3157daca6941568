"""robo-rl collect: scripted expert demos in the twin -> EpisodeStore."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.data.schema import EpisodeMeta
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError, SchemaError


def main(argv: list[str]) -> int:
    return run_app("collect", "collect", run, argv)


def run(cfg: DictConfig) -> int:
    from robo_rl.sim.recording import expert_episode, recording_env
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.room import randomizer_option

    if cfg.episodes < 1:
        raise ConfigError(f"collect: episodes must be >= 1, got {cfg.episodes}")
    if cfg.noise not in ("human", "none"):
        raise ConfigError(f"collect: noise={cfg.noise!r}; choose human or none")
    along = tuple(float(v) for v in cfg.grasp_along)
    if len(along) != 2 or not -0.01 <= along[0] <= along[1] <= 0.03:
        # nearer the tip than 9 cm the expert's own insertion fails; past 13 cm the fingers leave the peg
        raise ConfigError(f"collect: grasp_along={list(cfg.grasp_along)}; give [low, high] with -0.01 <= low <= high <= 0.03 (metres)")
    if along != (0.0, 0.0) and cfg.task != "insertion":
        raise ConfigError(f"collect: grasp_along moves Insertion's grip on its peg; task={cfg.task} has no long part to grip")
    cameras = list(cfg.cameras or [])
    size = tuple(cfg.image_size)
    rooms = randomizer_option(cfg.randomize_room, "collect", None if cameras else "name cameras=[...]")
    env, schema = recording_env(cfg.task, cameras, size, randomize=rooms)
    out = Path(cfg.out)
    try:
        store = EpisodeStore.open_or_create(out, schema, overwrite=bool(cfg.overwrite))
    except SchemaError:
        raise ConfigError(f"{out}: holds a different schema; pass overwrite=true or another out=") from None
    (out.parent / f"{out.name}.collect.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    noise = ExpertNoise() if cfg.noise == "human" else ExpertNoise.none()
    noise.grasp_along = along
    max_tries = cfg.max_tries or 2 * cfg.episodes
    tries = kept = successes = 0
    lengths, t0 = [], time.perf_counter()
    bar = tqdm(total=cfg.episodes, desc=f"collect {cfg.task}", unit="ep")
    with store:
        while kept < cfg.episodes and tries < max_tries:
            seed = int(cfg.seed) + tries
            tries += 1
            data, ok, facts = expert_episode(env, seed, noise, cameras)
            successes += ok
            n = len(data["action"])
            if ok or cfg.keep_failed:
                ts = np.arange(n) / env.robot.spec.control_hz
                meta = EpisodeMeta(task=cfg.task, success=ok, source="scripted", operator="expert",
                                   extra={**facts, "noise": cfg.noise, "room": env.room.describe()})
                store.add_episode(data, ts, "SCRIPTED", meta)
                kept += 1
                lengths.append(n)
                bar.update()
            bar.set_postfix(success=f"{successes}/{tries}")
        bar.close()
        total = store.n_episodes
    elapsed = time.perf_counter() - t0
    env.close()
    print_table(f"collect {cfg.task} -> {out}", ["measure", "value"], [
        ("episodes recorded", f"{kept} (store now holds {total})"),
        ("expert success rate", f"{successes / max(tries, 1):.1%} ({successes}/{tries} tries)"),
        ("mean length", f"{np.mean(lengths):.0f} steps ({np.mean(lengths) / env.robot.spec.control_hz:.1f} s)" if lengths else "-"),
        ("cameras", ", ".join(f"{c} {size[0]}x{size[1]}" for c in cameras) or "none (state only)"),
        ("room", "a new one per episode (randomize_room)" if cfg.randomize_room else "the twin's own"),
        ("time", f"{elapsed:.0f} s ({elapsed / max(tries, 1):.1f} s per episode)"),
    ])
    if kept < cfg.episodes:
        print(f"warning: only {kept} of {cfg.episodes} episodes succeeded within {max_tries} tries")
        return 1
    return 0
