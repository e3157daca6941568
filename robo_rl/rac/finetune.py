"""Fine-tune a pre-trained action-chunk policy on its demos plus intervention data.

Starts from the pre-trained checkpoint's EMA weights (normalisation stats come with them, so the
intervention data is scaled exactly as the demos were), builds one window sampler per store,
weighs every step by the data composition (robo_rl.rac.mixing) and trains with the same Learner
as pre-training. By default windows are *drawn* in proportion to their weights, so a
composition's shares are the batch fractions and masked steps are never drawn.

`from_scratch=True` retrains instead: fresh weights (seeded by the learner's seed; only the
checkpoint's normalisation is kept) trained on the same union. A few dozen recoveries are rare
states among the demos' 50,000 steps, and a short fine-tune from the converged weights fits them
poorly (on PackCube its chunks at the takeover states stayed 3x further from the operator's than
a retrained policy's) while it costs the demos' behaviour points; a retrain with the pre-training's
recipe fits both. Its control (the demos alone) is then a pre-training with the learner's seed.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from robo_rl.data.sampler import WindowSampler
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.learn import Learner, LearnerConfig
from robo_rl.learn.learner import resolve_device
from robo_rl.policies import checkpoint_info, load_policy, make_policy
from robo_rl.policies.body import TensorNormalizer
from robo_rl.rac.mixing import CompositionConfig, MixedSampler, composition_report, composition_weights


def composition_source(store: EpisodeStore, count: int, demo: bool, segments: Any = None,
                       episode_starts: Any = None) -> dict[str, Any]:
    """What `composition_weights` reads of a store's first `count` episodes: their segment labels,
    episode starts, intervention records and successes (segments and starts read from the store
    unless a sampler already holds them)."""
    if segments is None:
        episode_starts = np.asarray(store.episode_starts[:count])
        end = int(episode_starts[-1] + store.episode_lengths[count - 1]) if count else 0
        segments = np.asarray(store.array("segment")[:end])
    metas = store.metas[:count]
    return {"segments": segments, "episode_starts": episode_starts, "demo": demo,
            "interventions": [(m.extra or {}).get("interventions") or [] for m in metas],
            "successes": [bool(m.success) for m in metas]}


def finetune(checkpoint: Mapping[str, Any], demos: Sequence[tuple[str | Path, int | None]],
             interventions: Sequence[str | Path], composition: CompositionConfig, learner: LearnerConfig,
             run_dir: str | Path, evaluate: Callable[[Any, int], Mapping[str, Any]] | None = None,
             progress: bool = True, extra: Mapping[str, Any] | None = None,
             resume: bool = False, from_scratch: bool = False) -> tuple[Any, dict[str, Any]]:
    """`demos`: (store, first n episodes or None for all) pairs, the pre-training demos first;
    `interventions`: stores of intervention rollouts. `resume`: go on from `run_dir`'s last
    checkpoint if it has one. `from_scratch`: fresh weights (see the module docstring).
    Returns (the EMA policy, the Learner's result)."""
    obs_keys = list(checkpoint.get("obs_keys") or [])
    if not obs_keys:
        raise ConfigError("finetune: the checkpoint does not list its observation keys (was it written by robo-rl train?)")
    policy = load_policy(checkpoint, ema=True, device="cpu").train()
    if from_scratch:
        policy = fresh_like(policy, learner.seed)
    cfg = policy.config
    device = resolve_device(learner.device)
    sources, samplers = [], []
    for path, n, is_demo in [*((p, n, True) for p, n in demos), *((p, None, False) for p in interventions)]:
        store = EpisodeStore.open(path, mode="r")
        if store.n_episodes == 0:
            continue
        count = store.n_episodes if n is None else min(int(n), store.n_episodes)
        s = WindowSampler(store, obs_keys, n_obs=cfg.n_obs, horizon=cfg.horizon, episodes=range(count), device=device)
        wrong = {k: list(v) for k, v in s.image_sizes.items() if tuple(policy.shapes.images.get(k, v)) != tuple(v)}
        if wrong:
            raise ConfigError(f"finetune: {path} gives camera frames at {wrong}, the policy was trained on "
                              f"{ {k: list(policy.shapes.images[k]) for k in wrong} }; record at the policy's image size")
        samplers.append(s)
        sources.append({**composition_source(store, count, is_demo, s.data["segment"], np.unique(s.start)), "path": str(path)})
    if not samplers:
        raise ConfigError("finetune: no episodes in the given stores")
    weights = composition_weights(sources, composition)
    for s, w in zip(samplers, weights):
        s.reweight(w)
    if progress and interventions:
        print(f"   composition: {composition_report(sources, weights)}")
    mixed = MixedSampler(samplers)
    info = checkpoint_info(policy, checkpoint.get("task"), demos[0][0] if demos else None, demos[0][1] if demos else None,
                           obs_keys, checkpoint.get("chunking"),
                           finetune={"stores": [s["path"] for s in sources], "composition": asdict(composition)},
                           **dict(extra or {}))
    trainer = Learner(policy, learner, run_dir, lambda bs, gen, weighted: mixed.sample(bs, gen, weighted), extra=info,
                      evaluate=evaluate, progress=progress)
    if resume:
        trainer.resume_from_last()
    result = trainer.fit()
    return trainer.ema.eval(), result


def fresh_like(policy: Any, seed: int) -> Any:
    """A freshly initialised policy of the same architecture, with `policy`'s normalisation
    buffers (the demos' statistics, so every store is scaled as before)."""
    torch.manual_seed(seed)
    fresh = make_policy(policy.name, policy.config.to_dict(), policy.shapes)
    for mine, theirs in zip(fresh.modules(), policy.modules()):
        if isinstance(mine, TensorNormalizer):
            mine.load_state_dict(theirs.state_dict())
    return fresh.train()
