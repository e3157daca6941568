"""robo-rl ogbench-data: an OGBench dataset (<out>.npz + <out>-val.npz) from OGBench's own oracles."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import human_bytes, print_table
from robo_rl.errors import ConfigError, RoboRLError


def _name_or_placeholder(env: str, dataset_type: str) -> str:
    from robo_rl.sim.ogbench import dataset_name

    try:
        return dataset_name(str(env), str(dataset_type))
    except RoboRLError:
        return f"{env}-{dataset_type}"  # a bad env name is reported by the generator, with the choices


def main(argv: list[str]) -> int:
    OmegaConf.register_new_resolver("ogbench_dataset_name", _name_or_placeholder, replace=True)
    return run_app("ogbench-data", "ogbench_data", run, argv)


def run(cfg: DictConfig) -> int:
    from robo_rl.sim.ogbench import DATASET_TYPES, dataset_name, generate_dataset

    if cfg.type not in DATASET_TYPES:
        raise ConfigError(f"type={cfg.type!r}; choose one of {', '.join(DATASET_TYPES)}")

    if int(cfg.episodes) < 1:
        raise ConfigError(f"episodes={cfg.episodes}: give at least 1")
    if not cfg.out:
        raise ConfigError("out is empty; give a file like out=data/ogbench/cube-single-play-v0.npz")
    out = Path(str(cfg.out))
    if out.suffix != ".npz":
        raise ConfigError(f"out={out}: give a .npz file name (the -val.npz is written beside it)")
    if out.is_dir():
        raise ConfigError(f"out={out}: is a directory; give a file name ending in .npz")
    s = generate_dataset(str(cfg.env), out, int(cfg.episodes), dataset_type=str(cfg.type),
                         steps_per_episode=int(cfg.steps), seed=int(cfg.seed), noise=float(cfg.noise),
                         noise_smoothing=float(cfg.noise_smoothing), min_norm=float(cfg.min_norm))
    config_path = out.with_suffix(".yaml")
    config_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    name = dataset_name(str(cfg.env), str(cfg.type))
    rows = [
        ("dataset", f"{name} ({s['dataset_type']}, seed {s['seed']})"),
        ("train", f"{s['train_path']}: {s['train_episodes']} episodes x {s['steps_per_episode']} steps = "
                  f"{s['train_transitions']} ({human_bytes(s['train_bytes'])})"),
        ("val", f"{s['val_path']}: {s['val_episodes']} episodes = {s['val_transitions']} "
                f"({human_bytes(s['val_bytes'])})"),
        ("targets reached", f"{s['targets_reached']} of {s['targets']} set by the env"),
        ("time", f"{s['seconds']:.1f} s ({s['steps_per_second']:.0f} steps/s)"),
        ("config", str(config_path)),
        ("load with", f"ogbench.utils.make_env_and_datasets('{name}', dataset_path='{out}')"),
    ]
    print_table(f"ogbench-data {name}", ["", ""], rows)
    return 0
