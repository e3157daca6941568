"""A trained policy rolled out in the twin: the evaluation behind eval, train, rac and demo.

`run_eval` wires a policy (or a predictor it is given, e.g. value-guided selection) into
`robo_rl.sim.rollout.evaluate_policy`, or records the rollouts (`record=`); `write_eval` writes
eval.json; `evaluate_with_recoveries` adds RaC's test-time-scaling curve (success had each
episode been allowed at most k recovery manoeuvres).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from robo_rl.errors import ConfigError


def run_eval(policy: Any, task: str, chunking: Mapping[str, Any], episodes: int, n_envs: int, seed: int,
             videos: int, out: Path | None, inference_steps: int | None = None, max_steps: int | None = None,
             progress: bool = True, count_recoveries: bool = False, predict: Any = None, record: str | None = None,
             disturb: bool = True):
    import torch

    # The policy's sampling noise is drawn from a generator seeded by the evaluation seed alone, so an
    # evaluation inside demo, rac or train gives what robo-rl eval gives on the same checkpoint and
    # seeds, whatever the caller drew before; the caller's own random stream is left as it was.
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return _run_eval(policy, task, chunking, episodes, n_envs, seed, videos, out, inference_steps, max_steps,
                         progress, count_recoveries, predict, record, disturb)


def _run_eval(policy, task, chunking, episodes, n_envs, seed, videos, out, inference_steps, max_steps, progress,
              count_recoveries, predict, record, disturb):
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.rollout import evaluate_policy

    shapes, cfg = policy.shapes, policy.config
    keys = [*shapes.lowdim, *shapes.images]
    image_size = next(iter(shapes.images.values()), None)
    try:
        chunk_cfg = ChunkingConfig(**dict(chunking))
    except TypeError as e:
        raise ConfigError(f"chunking: {e}") from None
    from robo_rl.policies.common import predictor

    predict = predictor(policy, inference_steps) if predict is None else predict  # value-guided selection passes its own (issue 7)
    if record:  # issue 7: the same rollouts, also written to an episode store with per-step stages
        from robo_rl.sim.critic_data import record_rollouts

        return record_rollouts(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg, record, episodes=episodes,
                               n_envs=n_envs, seed=seed, image_size=image_size, max_steps=max_steps, progress=progress,
                               disturb=disturb)
    return evaluate_policy(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg,
                           episodes=episodes, n_envs=n_envs, seed=seed, image_size=image_size, videos=videos,
                           video_dir=out / "videos" if out is not None else None, max_steps=max_steps, progress=progress,
                           count_recoveries=count_recoveries, disturb=disturb)


def write_eval(summary: Any, out: Path, **extra: Any) -> dict[str, Any]:
    """eval.json in `out`: the summary plus `extra` (checkpoint, step, ...); returns the dict."""
    result = {**summary.to_dict(), **extra}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def evaluate_with_recoveries(policy: Any, task: str, chunking: Mapping[str, Any], episodes: int, n_envs: int, seed: int,
                             max_recoveries: int, out: Path | None, videos: int = 0, predict: Any = None) -> dict[str, Any]:
    """Success with its interval, stage reach and the test-time-scaling curve of one policy
    (`predict`: its predictor, when the caller has one to share)."""
    summary = run_eval(policy, task, chunking, episodes, n_envs, seed, videos, out, count_recoveries=True, predict=predict)
    d = summary.to_dict()
    if out is not None:
        write_eval(summary, out)
    recoveries = [e.recoveries for e in summary.episodes]
    return {"success_rate": d["success_rate"], "ci95_low": d["ci95_low"], "ci95_high": d["ci95_high"],
            "stage_reach": d["stage_reach"], "mean_length": d["mean_length"], "disturbed": d["disturbed"],
            "mean_recoveries": sum(recoveries) / max(1, len(recoveries)),
            "success_within": [summary.success_within(k) for k in range(max_recoveries + 1)],
            "videos": d["videos"]}
