"""A fresh policy sized and normalised for an episode store, with the window sampler over it:
what pre-training (robo-rl train, robo-rl demo) starts from."""

from __future__ import annotations

from pathlib import Path

from robo_rl.errors import ConfigError


def policy_for_store(dataset: str | Path, obs_keys: list[str], name: str, options: dict, n_episodes: int | None,
                     device: str | None, segment_weights: dict | None = None):
    """A fresh policy sized and normalised for the first `n_episodes` episodes of a store (all if
    None), and the window sampler over them. Returns (policy, sampler, number of episodes)."""
    from robo_rl.data.sampler import WindowSampler
    from robo_rl.data.stats import get_stats
    from robo_rl.data.store import EpisodeStore
    from robo_rl.policies import ObsShapes, make_policy

    store = EpisodeStore.open(dataset, mode="r")
    n = store.n_episodes if n_episodes is None else int(n_episodes)
    if not 1 <= n <= store.n_episodes:
        raise ConfigError(f"train: n_episodes={n_episodes} but {dataset} holds {store.n_episodes} episodes")
    shapes = ObsShapes.from_schema(store.schema, obs_keys, image_size=store.train_image_size)
    stats = get_stats(store, [*shapes.lowdim, shapes.action_key], save=False)
    policy = make_policy(name, options, shapes, stats)
    sampler = WindowSampler(store, obs_keys, n_obs=policy.config.n_obs, horizon=policy.config.horizon,
                            episodes=range(n), device=device, segment_weights=segment_weights)
    return policy, sampler, n
