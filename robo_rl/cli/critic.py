"""robo-rl critic: train a chunk critic (robo_rl/rl/chunk_critic.py) on episode stores, for
value-guided chunk selection in `robo-rl eval critic=PATH` and `robo-rl deploy critic=PATH`.

`robo-rl critic dataset=[data/demos/pack_cube,data/rollouts] task=pack_cube horizon=8 reward=stage`
Per-step stages come from a store's `stage` key (rollouts recorded by `robo-rl eval record=PATH`)
or, for episodes recorded in the twin without one, from replaying them (robo_rl/sim/critic_data.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError

ACTION_KEY = "action"


def main(argv: list[str]) -> int:
    return run_app("critic", "critic", run, argv)


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


def load_episodes(paths: list[str], obs_keys: list[str], task: str | None, reward: str,
                  progress: bool = True) -> tuple[list[dict], str, dict[str, int]]:
    """Every episode of every store as {obs, action, success, stages, store}; the task they share."""
    from robo_rl.data.store import EpisodeStore

    stores = [EpisodeStore.open(p) for p in paths]  # a missing path is a one-line StoreError
    try:
        tasks = set()
        for st in stores:
            missing = [k for k in (*obs_keys, ACTION_KEY) if k not in st.data_keys]
            if missing:
                raise ConfigError(f"critic: {st.location} has no key(s) {missing} (it has {st.data_keys}); "
                                  f"pass obs_keys= that every store holds")
            images = [k for k in obs_keys if len(st.schema.keys[k].shape) != 1]
            if images:
                raise ConfigError(f"critic: obs_keys {images} are not 1-D; the chunk critic reads low-dim keys only")
            if st.n_episodes == 0:
                raise ConfigError(f"critic: {st.location} holds no episodes")
            tasks |= {m.task for m in st.metas if m.task}
        if task is None:
            if len(tasks) != 1:
                raise ConfigError(f"critic: the stores name tasks {sorted(tasks) or 'none'}; pass task=NAME")
            task = tasks.pop()
        elif tasks - {task}:
            raise ConfigError(f"critic: task={task}, but the stores hold episodes of {sorted(tasks - {task})}")
        episodes, counts = [], {}
        for st in stores:
            stages = None
            if reward == "stage":
                from robo_rl.sim.critic_data import episode_stages

                stages = episode_stages(st, task=task, progress=progress)
            for e in range(st.n_episodes):
                ep = st.episode(e, [*obs_keys, ACTION_KEY])
                T = len(ep[ACTION_KEY])
                episodes.append({"obs": np.concatenate([ep[k].reshape(T, -1) for k in obs_keys], 1),
                                 "action": ep[ACTION_KEY].reshape(T, -1), "success": bool(st.meta(e).success),
                                 "stages": None if stages is None else stages[e], "store": st.location})
            counts[st.location] = st.n_episodes
        return episodes, task, counts
    finally:
        for st in stores:
            st.close()


def heldout_report(critic: Any, data: Any) -> dict[str, float]:
    """On held-out episodes: BCE to the SARSA target, and how Q(s, A_data) tracks what the data's
    own chunks went on to earn (the discounted return-to-go)."""
    import torch

    rows = data.rows
    qs, ys = [], []
    for part in torch.split(rows, 4096):
        batch = data.gather(part)
        qs.append(critic.score(batch["obs"], batch["chunk"]))
        ys.append(critic.target(batch))
    q, y = torch.cat(qs).numpy(), torch.cat(ys).numpy()
    mc = data.mc_returns[data.train_rows_np]
    ok = data.success_of_row[data.train_rows_np]
    out = {"heldout_rows": int(len(q)), "heldout_bce": float(np.mean(-(y * np.log(np.clip(q, 1e-6, 1))
                                                                       + (1 - y) * np.log(np.clip(1 - q, 1e-6, 1))))),
           "heldout_abs_err_to_return": float(np.mean(np.abs(q - mc))),
           "heldout_corr_q_return": float(np.corrcoef(q, mc)[0, 1]) if q.std() > 0 and mc.std() > 0 else float("nan")}
    if ok.any():
        out["heldout_q_success_eps"] = float(q[ok].mean())
    if (~ok).any():
        out["heldout_q_failed_eps"] = float(q[~ok].mean())
    return out


def run(cfg: DictConfig) -> int:
    import torch

    from robo_rl.learn.learner import atomic_save, seed_everything
    from robo_rl.learn.offline import OfflineConfig, OfflineLoop
    from robo_rl.rl.chunk_critic import ChunkCritic, ChunkCriticConfig, chunk_data_from_episodes
    from robo_rl.sim.tasks import make_task

    paths = as_list(cfg.dataset)
    if not paths:
        raise ConfigError("critic: pass dataset=PATH or dataset=[PATH,PATH,...] (episode stores)")
    obs_keys = as_list(cfg.obs_keys)
    if not obs_keys:
        raise ConfigError("critic: pass obs_keys=[...], the observation keys of the policy it will guide")
    for key in ("steps", "batch_size"):
        if int(cfg[key]) < 1:
            raise ConfigError(f"critic: {key}={cfg[key]} must be >= 1")
    ccfg = ChunkCriticConfig.from_dict({"horizon": int(cfg.horizon), "reward": str(cfg.reward), "gamma": float(cfg.gamma),
                                        "hidden": tuple(int(h) for h in cfg.hidden), "ensemble": int(cfg.ensemble),
                                        "aggregate": str(cfg.aggregate), "lr": float(cfg.lr), "tau": float(cfg.tau)})
    run_dir = Path(cfg.run_dir) if cfg.run_dir else Path("data/runs") / f"critic-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / "critic.pt").exists() and not cfg.overwrite:
        raise ConfigError(f"critic: {run_dir} already holds a critic; pass overwrite=true or another run_dir=")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    seed_everything(int(cfg.seed))

    t0 = time.perf_counter()
    task = str(cfg.task) if cfg.task else None
    episodes, task, counts = load_episodes(paths, obs_keys, task, ccfg.reward, progress=True)
    n_stages = len(make_task(task).stage_names) - 1
    load_s = time.perf_counter() - t0

    rng = np.random.default_rng(int(cfg.seed))
    order = rng.permutation(len(episodes))
    n_held = int(round(float(cfg.heldout_fraction) * len(episodes))) if len(episodes) > 1 else 0
    n_held = min(n_held, len(episodes) - 1)
    held_eps, train_eps = sorted(order[:n_held]), sorted(order[n_held:])
    train = chunk_data_from_episodes([episodes[i] for i in train_eps], ccfg, n_stages, seed=int(cfg.seed))
    held = chunk_data_from_episodes([episodes[i] for i in held_eps], ccfg, n_stages, seed=int(cfg.seed) + 1) if n_held else None
    critic = ChunkCritic(train.obs.shape[1], train.actions.shape[1], ccfg, obs_keys, task, train.stats(), n_stages,
                         seed=int(cfg.seed))

    loop_cfg = OfflineConfig(steps=int(cfg.steps), batch_size=int(cfg.batch_size), log_every=int(cfg.log_every),
                             eval_every=0, heldout_every=int(cfg.heldout_every) if held is not None else 0,
                             checkpoint_every=0, max_minutes=float(cfg.max_minutes), seed=int(cfg.seed))
    evaluate = (lambda step: heldout_report(critic, held)) if held is not None else None  # noqa: E731
    extra = {"task": task, "obs_keys": obs_keys, "stores": counts, "episodes": len(episodes),
             "successes": int(sum(e["success"] for e in episodes)), "train_rows": len(train),
             "heldout_episodes": n_held, "critic_config": {**OmegaConf.to_container(cfg, resolve=True)}}
    loop = OfflineLoop(critic, loop_cfg, run_dir, train.sample, evaluate, held.sample if held is not None else None,
                       generator=train.generator, extra=extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    n_params = sum(p.numel() for p in critic.critic.parameters())
    print(f"critic ({n_params / 1e6:.2f}M params, {ccfg.ensemble} members, H_c={ccfg.horizon}, reward={ccfg.reward}) on "
          f"{len(episodes)} episodes of {task} ({len(train)} train rows, {n_held} episodes held out; "
          f"loaded in {load_s:.0f} s) -> {run_dir}", flush=True)
    critic.train()
    result = loop.fit()
    critic.eval()
    atomic_save(critic.checkpoint(stores=counts), run_dir / "critic.pt")
    final = result.get("final_eval") or {}
    (run_dir / "results.json").write_text(json.dumps({**result, "critic": str(run_dir / "critic.pt")}, indent=1,
                                                     default=float))
    rows = [("task, reward", f"{task}, {ccfg.reward}"), ("episodes (successes)", f"{len(episodes)} ({extra['successes']})"),
            ("updates", result["updates"]), ("updates/s", f"{result['updates_per_s']:.1f}"),
            ("train time", f"{result['train_time_s'] / 60:.1f} min")]
    if "heldout_td_error" in result:
        rows.append(("TD error train / held-out", f"{result['train_td_error']:.4f} / {result['heldout_td_error']:.4f}"))
    for k in ("heldout_bce", "heldout_corr_q_return", "heldout_abs_err_to_return", "heldout_q_success_eps",
              "heldout_q_failed_eps"):
        if k in final:
            rows.append((k.replace("heldout_", "held-out ").replace("_", " "), f"{final[k]:.4f}"))
    rows.append(("critic", str(run_dir / "critic.pt")))
    print_table("robo-rl critic", ["", ""], rows)
    return 0
