"""robo-rl train: an action-chunk policy from an episode store, evaluated in the twin at the end."""

from __future__ import annotations

import os
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("train", "train", run, argv)


def default_run_dir(cfg: DictConfig) -> Path:
    # Under torchrun every rank must agree on the directory: use the job id, not the clock.
    stamp = os.environ.get("TORCHELASTIC_RUN_ID") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    return Path("data/runs") / f"{cfg.task}-{cfg.policy.name}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"


def user_keys() -> set[str]:
    """The dotted keys this command line set."""
    from hydra.core.hydra_config import HydraConfig

    from robo_rl.learn.recipes import overridden_keys

    return overridden_keys(HydraConfig.get().overrides.task) if HydraConfig.initialized() else set()


def camera_recipe_for(cfg: DictConfig, obs_keys: list[str], device: str, user: set[str]) -> dict:
    """Fill `cfg` with the camera recipe (robo_rl/learn/recipes.py) where obs_keys names a camera
    of the store and the command line left the key alone; returns what was filled in."""
    from robo_rl.data.store import EpisodeStore
    from robo_rl.learn.recipes import pick_recipe

    store = EpisodeStore.open(cfg.dataset, mode="r")
    cameras = [k for k in obs_keys if k in store.schema.image_keys]
    sizes = {k: tuple(store.train_image_size or store.schema.keys[k].shape[:2]) for k in cameras}
    recipe = pick_recipe(str(cfg.get("recipe", "auto")), str(cfg.policy.name), cameras, sizes, device, user)
    for key, value in recipe.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return recipe


def run(cfg: DictConfig) -> int:
    import torch

    from robo_rl.cli.tables import print_summary
    from robo_rl.learn.from_store import policy_for_store
    from robo_rl.learn.plots import print_training_plots
    from robo_rl.sim.evaluate import run_eval, write_eval
    from robo_rl.learn import Learner, LearnerConfig, last_checkpoint
    from robo_rl.learn.learner import resolve_device
    from robo_rl.policies import checkpoint_info
    from robo_rl.sim.tasks import TASKS

    if cfg.task not in TASKS:
        raise ConfigError(f"train: task={cfg.task!r} unknown; tasks are {sorted(TASKS)}")
    if not cfg.dataset:
        raise ConfigError("train: pass dataset=PATH (an episode store, e.g. from robo-rl collect)")
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    last = last_checkpoint(run_dir)
    if cfg.resume and not last.is_file():
        raise ConfigError(f"train: resume=true but {last} does not exist; pass run_dir= of the run to continue")
    if not cfg.resume and last.is_file():
        raise ConfigError(f"train: {run_dir} already holds a run; pass resume=true to continue it or another run_dir=")
    obs_keys = list(cfg.obs_keys)
    device = resolve_device(str(cfg.learner.device), int(os.environ.get("LOCAL_RANK", "0")))
    user = user_keys()
    recipe = camera_recipe_for(cfg, obs_keys, device, user)
    if float(cfg.learner.max_minutes) > 0 and "learner.steps" not in user:
        cfg.learner.steps = 0  # a time budget and no step count: the schedule's length is what fits in the time
    learner_cfg = LearnerConfig.from_dict(OmegaConf.to_container(cfg.learner, resolve=True))
    policy_options = {k: v for k, v in OmegaConf.to_container(cfg.policy, resolve=True).items() if k != "name"}
    policy, sampler, n = policy_for_store(
        cfg.dataset, obs_keys, cfg.policy.name, policy_options, cfg.n_episodes, device,
        OmegaConf.to_container(cfg.segment_weights) if cfg.segment_weights else None)
    chunking = OmegaConf.to_container(cfg.eval.chunking, resolve=True)
    extra = checkpoint_info(policy, cfg.task, cfg.dataset, n, obs_keys, chunking, config=OmegaConf.to_container(cfg, resolve=True))

    def evaluate(model, step):
        out = run_dir / f"eval-step{step}"
        summary = run_eval(model, cfg.task, chunking, int(cfg.eval.episodes), int(cfg.eval.n_envs), int(cfg.eval.seed),
                           int(cfg.eval.videos), out, progress=True)
        d = write_eval(summary, out, step=step)
        print_summary(summary, f"eval {cfg.task} at step {step}")
        return {"success_rate": d["success_rate"], "ci95_low": d["ci95_low"], "ci95_high": d["ci95_high"],
                "mean_length": d["mean_length"], **{f"reach_{k}": v for k, v in d["stage_reach"].items()}}

    learner = Learner(policy, learner_cfg, run_dir, lambda bs, gen, weighted: sampler.sample(bs, gen, weighted),
                      extra=extra, evaluate=evaluate if cfg.eval.episodes > 0 else None)
    if learner.dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.resume:
        learner.load(last)
        print(f"resumed {run_dir} at step {learner.step}")
    n_params = sum(p.numel() for p in policy.parameters())
    if learner.dist.main and recipe:
        print(f"camera recipe (any of these can be overridden): {' '.join(f'{k}={v}' for k, v in recipe.items())}")
    if learner.dist.main:
        print(f"train {cfg.policy.name} ({policy.config.backbone}, {n_params / 1e6:.2f}M params) on {n} episodes "
              f"({len(sampler)} windows) of {cfg.dataset} -> {run_dir}  [device {learner.device}, world {learner.dist.world}]")
    torch.backends.cudnn.benchmark = True
    result = learner.fit()
    if learner.dist.main:
        print(f"done: step {result['step']}, loss {result['loss']:.4f}, {result['train_time_s'] / 60:.1f} min; "
              f"checkpoint {last}")
        print_training_plots(run_dir)
    return 0
