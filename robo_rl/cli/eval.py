"""robo-rl eval: roll a trained policy out in the twin; success with a 95% Wilson interval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("eval", "eval", run, argv)


def predictor(policy: Any, inference_steps: int | None = None, frozen: bool = True):
    """numpy windows -> numpy chunks, without autograd. On a CPU the sampler is traced and frozen
    into one graph (FrozenPredictor): same chunks, several times less per-call overhead."""
    import torch

    from robo_rl.policies.common import FrozenPredictor

    if frozen and policy.body.device.type == "cpu":
        return FrozenPredictor(policy, inference_steps)

    def predict(batch: Mapping[str, Any]):
        with torch.inference_mode():
            return policy.predict(batch, steps=inference_steps)

    return predict


def run_eval(policy: Any, task: str, chunking: Mapping[str, Any], episodes: int, n_envs: int, seed: int,
             videos: int, out: Path | None, inference_steps: int | None = None, max_steps: int | None = None,
             progress: bool = True, count_recoveries: bool = False, predict: Any = None, record: str | None = None):
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.rollout import evaluate_policy

    shapes, cfg = policy.shapes, policy.config
    keys = [*shapes.lowdim, *shapes.images]
    image_size = next(iter(shapes.images.values()), None)
    try:
        chunk_cfg = ChunkingConfig(**dict(chunking))
    except TypeError as e:
        raise ConfigError(f"chunking: {e}") from None
    predict = predictor(policy, inference_steps) if predict is None else predict  # value-guided selection passes its own (issue 7)
    if record:  # issue 7: the same rollouts, also written to an episode store with per-step stages
        from robo_rl.sim.critic_data import record_rollouts

        return record_rollouts(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg, record, episodes=episodes,
                               n_envs=n_envs, seed=seed, image_size=image_size, max_steps=max_steps, progress=progress)
    return evaluate_policy(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg,
                           episodes=episodes, n_envs=n_envs, seed=seed, image_size=image_size, videos=videos,
                           video_dir=out / "videos" if out is not None else None, max_steps=max_steps, progress=progress,
                           count_recoveries=count_recoveries)


def write_eval(summary: Any, out: Path, **extra: Any) -> dict[str, Any]:
    """eval.json in `out`: the summary plus `extra` (checkpoint, step, ...); returns the dict."""
    result = {**summary.to_dict(), **extra}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def print_summary(summary: Any, title: str) -> None:
    d = summary.to_dict()
    rows = [["success", f"{d['success_rate']:.1%} ({d['successes']}/{d['episodes']})"],
            ["95% Wilson interval", f"[{d['ci95_low']:.1%}, {d['ci95_high']:.1%}]"],
            ["mean episode length", f"{d['mean_length']:.0f} steps"]]
    rows += [[f"reached {name}", f"{share:.0%}"] for name, share in d["stage_reach"].items()]
    rows += [["wall time", f"{d['wall_s']:.0f} s"]]
    if d["videos"]:
        rows += [["videos", str(Path(d["videos"][0]).parent)]]
    print_table(title, ["", ""], rows)


def run(cfg: DictConfig) -> int:
    import torch

    from robo_rl.policies import load_policy, read_checkpoint

    if not cfg.checkpoint:
        raise ConfigError("eval: pass checkpoint=PATH (a checkpoint written by robo-rl train)")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    path = Path(cfg.checkpoint)
    ckpt = read_checkpoint(path, cfg.device)
    policy = load_policy(ckpt, ema=bool(cfg.ema), device=cfg.device)
    task = cfg.task or ckpt.get("task")
    if not task:
        raise ConfigError("eval: the checkpoint does not name its task; pass task=...")
    chunking = dict(ckpt.get("chunking") or {"n_action_steps": policy.config.n_action_steps})
    overrides = OmegaConf.to_container(cfg.chunking, resolve=True) if cfg.chunking else {}
    chunking.update({k: v for k, v in overrides.items() if v is not None})
    out = Path(cfg.out) if cfg.out else path.parent.parent / f"eval-{path.stem}"
    torch.manual_seed(int(cfg.seed))
    # --- issue 7: value-guided chunk selection (critic=PATH) and rollout recording (record=PATH) ---
    predict, guided = predictor(policy, cfg.inference_steps), None
    if cfg.critic:
        from robo_rl.cli.critic import value_guided

        predict = guided = value_guided(predict, cfg.critic, int(cfg.critic_samples), policy, task, chunking)
    summary = run_eval(policy, task, chunking, int(cfg.episodes), int(cfg.n_envs), int(cfg.seed), int(cfg.videos), out,
                       cfg.inference_steps, cfg.max_steps, predict=predict, record=cfg.record)
    extra = {"critic": str(cfg.critic), **guided.stats()} if guided is not None else {}
    if cfg.record:
        extra["record"] = str(cfg.record)
    # --- end issue 7 ---
    result = write_eval(summary, out, checkpoint=str(path), step=int(ckpt.get("step", 0)), ema=bool(cfg.ema),
                        chunking=chunking, inference_steps=cfg.inference_steps or policy.config.inference_steps, **extra)
    print_summary(summary, f"eval {task}: {policy.name} policy, step {result['step']}")
    if guided is not None:
        print(guided.describe())
    print(f"results: {out / 'eval.json'}")
    return 0
