"""robo-rl offline-rl: floq, FQL or SHARSA on an OGBench .npz, with evaluation and a results table.

`robo-rl offline-rl agent=floq dataset=data/ogbench/cube-single-play-v0.npz env=cube-single-play-singletask-task2-v0`
`agent=` picks the Hydra group `rl/` (configs/rl/*.yaml); `rl.<field>=` sets any agent field.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.learn.plots import print_training_plots
from robo_rl.errors import ConfigError

AGENT_NAMES = ("floq", "fql", "sharsa")


def main(argv: list[str]) -> int:
    # `agent=NAME` is the documented spelling; the config group itself is rl/ (docs/design.md).
    argv = [re.sub(r"^agent=", "rl=", a) for a in argv]
    return run_app("offline-rl", "offline_rl", run, argv)


def ogbench_name(cfg: DictConfig, path: Path) -> str:
    """The OGBench dataset name to load and evaluate with: `env=` or one derived from the file."""
    if cfg.env:
        return str(cfg.env)
    stem = path.name.removesuffix(".npz")
    m = re.fullmatch(r"(.+)-(v\d+)", stem)
    if not m:
        raise ConfigError(f"offline-rl: cannot tell the OGBench dataset from {path.name}; pass env=NAME "
                          f"(e.g. cube-single-play-singletask-task2-v0)")
    kind = "oraclerep" if cfg.rl.name == "sharsa" else "singletask"
    return f"{m.group(1)}-{kind}-{m.group(2)}"


def resolve_run_dir(cfg: DictConfig) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    if hc.mode.name == "MULTIRUN":
        return Path(hc.sweep.dir) / str(hc.sweep.subdir)
    return Path("data/runs") / f"offline-{cfg.rl.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_agent(cfg: DictConfig, obs_dim: int, act_dim: int, goal_dim: int, reward_range: tuple[float, float], seed: int):
    opts = {k: (tuple(v) if isinstance(v, list) else v) for k, v in OmegaConf.to_container(cfg.rl, resolve=True).items()
            if k != "name"}
    name = cfg.rl.name
    try:
        if name == "floq":
            from robo_rl.rl.floq import Floq, FloqConfig

            return Floq(obs_dim, act_dim, FloqConfig(**opts), seed=seed, reward_range=reward_range)
        if name == "fql":
            from robo_rl.rl.fql import FQL, FQLConfig

            return FQL(obs_dim, act_dim, FQLConfig(**opts), seed=seed)
        if name == "sharsa":
            from robo_rl.rl.sharsa import Sharsa, SharsaConfig

            return Sharsa(obs_dim, act_dim, goal_dim, SharsaConfig(**opts), seed=seed)
    except TypeError as e:  # an unknown field from the command line
        raise ConfigError(f"offline-rl: agent {name}: {e}") from None
    raise ConfigError(f"offline-rl: agent={name!r} unknown; agents are {', '.join(AGENT_NAMES)}")


def split_trajectories(terminals: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of whole trajectories: (train rows, held-out rows)."""
    from robo_rl.rl.td_monitor import split_heldout

    term = np.asarray(terminals, bool)
    # OGBench's compact layout marks a trajectory's last two rows terminal: one trajectory, not two
    ends = np.flatnonzero(term & ~np.append(term[1:], False))
    if len(ends) == 0 or ends[-1] != len(terminals) - 1:
        ends = np.append(ends, len(terminals) - 1)
    if fraction <= 0 or len(ends) < 2:
        return np.arange(len(terminals)), np.zeros(0, np.int64)
    return split_heldout(len(terminals), fraction, seed=seed, episode_ends=ends + 1)


def ogbench_source(cfg: DictConfig, path: Path, device) -> dict:
    """An OGBench .npz: single-task rewards (floq, FQL) or goals with oracle reps (SHARSA)."""
    from robo_rl.rl.replay import DeviceReplay
    from robo_rl.sim import ogbench

    import warnings

    warnings.filterwarnings("ignore", message=".*precision lowered.*")  # OGBench's float64 Box bounds, harmless
    name = ogbench_name(cfg, path)
    goal_conditioned = cfg.rl.name == "sharsa"
    env, train, _ = ogbench.make_env_and_datasets(name, path, compact_dataset=goal_conditioned)
    seed = int(cfg.seed)
    if goal_conditioned:
        from robo_rl.rl.sharsa import goal_replay

        rows_train, rows_held = split_trajectories(train["terminals"], float(cfg.heldout_fraction), seed)
        arrays = {k: v for k, v in train.items() if k in ("observations", "actions", "terminals", "oracle_reps")}
        # train and held-out replays from whole trajectories: goals never leak across the split
        replay = goal_replay({k: v[rows_train] for k, v in arrays.items()}, device, seed)
        held = goal_replay({k: v[rows_held] for k, v in arrays.items()}, device, seed + 1) if len(rows_held) else None
        goal_dim = arrays["oracle_reps"].shape[-1] if "oracle_reps" in arrays else arrays["observations"].shape[-1]
        reward_range = (0.0, 1.0)
    else:
        if "rewards" not in train:
            raise ConfigError(f"offline-rl: {name} has no rewards; use a single-task name, e.g. "
                              f"{name.replace('-v0', '')}-singletask-task2-v0")
        terminals = train.get("terminals", np.zeros(len(train["observations"]), bool))
        rows_train, rows_held = split_trajectories(terminals, float(cfg.heldout_fraction), seed)
        arrays = {k: train[k] for k in ("observations", "actions", "rewards", "masks", "next_observations")}
        replay = DeviceReplay({k: v[rows_train] for k, v in arrays.items()}, device, seed)
        held = DeviceReplay({k: v[rows_held] for k, v in arrays.items()}, device, seed + 1) if len(rows_held) else None
        goal_dim = 0
        # floq's return support spans the rewards seen and 0 (a short dataset may hold no success)
        reward_range = (min(float(train["rewards"].min()), 0.0), max(float(train["rewards"].max()), 0.0))

    def evaluate(act_fn):
        r = ogbench.evaluate(env, act_fn, int(cfg.eval.episodes), seed=int(cfg.eval.seed),
                             task_ids=list(cfg.eval.task_ids) if cfg.eval.task_ids else None,
                             goal_conditioned=goal_conditioned, progress=False)
        return {"success_rate": r["success_rate"], "episodes": r["episodes"], "mean_length": r["mean_episode_length"],
                **{f"task{k}": v for k, v in r["per_task"].items()}}

    return {"name": name, "replay": replay, "held": held, "n_train": len(rows_train), "n_held": len(rows_held),
            "goal_dim": goal_dim, "reward_range": reward_range, "arrays": arrays, "evaluate": evaluate, "env": env}


def store_source(cfg: DictConfig, path: Path, device) -> dict:
    """An episode store (demos, rollouts, RaC interventions): one-step transitions with sparse
    success or stage rewards; actions scaled to [-1, 1] over their recorded range; evaluation
    and online fine-tuning in the twin (FlatTwinEnv)."""
    from robo_rl.data.store import EpisodeStore
    from robo_rl.rl.replay import DeviceReplay, transitions_from_store
    from robo_rl.rl.td_monitor import split_heldout
    from robo_rl.sim.rl_env import FlatTwinEnv, evaluate_flat
    from robo_rl.sim.tasks import TASKS, make_task

    store = EpisodeStore.open(path, mode="r")
    if store.n_episodes == 0:
        raise ConfigError(f"offline-rl: {path} holds no episodes")
    task = cfg.task or store.meta(0).task
    if task not in TASKS:
        raise ConfigError(f"offline-rl: task={task!r} unknown; pass task= one of {sorted(TASKS)}")
    obs_keys = list(cfg.obs_keys)
    stages = None
    if cfg.reward == "stage":
        if "stage" not in store.data_keys:
            raise ConfigError(f"offline-rl: reward=stage needs a per-step 'stage' key in {path} (rollouts recorded with "
                              f"stages); use reward=success")
        stages = [store.episode(e, keys=["stage"])["stage"] for e in range(store.n_episodes)]
    seed = int(cfg.seed)
    episodes = np.arange(store.n_episodes)
    if float(cfg.heldout_fraction) > 0 and store.n_episodes >= 2:
        train_eps, held_eps = split_heldout(store.n_episodes, float(cfg.heldout_fraction), seed=seed)
    else:
        train_eps, held_eps = episodes, np.zeros(0, np.int64)

    n_stages = len(make_task(task).stage_names) - 1  # the same scale as FlatTwinEnv's rewards

    def transitions(eps):
        return transitions_from_store(store, obs_keys, reward=str(cfg.reward), episodes=eps.tolist(),
                                      stages=[stages[e] for e in eps] if stages is not None else None,
                                      n_stages=n_stages)

    train = transitions(train_eps)
    low, high = train["actions"].min(0), train["actions"].max(0)
    span = np.maximum(high - low, 1e-3)  # a joint that never moved still maps to a finite box
    low, high = low - 0.05 * span, high + 0.05 * span

    def scaled(tr):
        tr = dict(tr)
        tr["actions"] = (2 * (tr["actions"] - low) / (high - low) - 1).astype(np.float32)
        return {k: tr[k] for k in ("observations", "actions", "rewards", "masks", "next_observations")}

    arrays = scaled(train)
    replay = DeviceReplay(arrays, device, seed)
    held = DeviceReplay(scaled(transitions(held_eps)), device, seed + 1) if len(held_eps) else None
    env = FlatTwinEnv(task, obs_keys, low, high, reward=str(cfg.reward))

    def evaluate(act_fn):
        return evaluate_flat(env, lambda o: act_fn(o), int(cfg.eval.episodes), int(cfg.eval.seed))

    return {"name": f"{task} ({path.name})", "replay": replay, "held": held, "n_train": len(replay),
            "n_held": len(held) if held is not None else 0, "goal_dim": 0, "reward_range": (0.0, 1.0),
            "arrays": arrays, "evaluate": evaluate, "env": env}


def run(cfg: DictConfig) -> int:
    import torch

    from robo_rl.learn.learner import last_checkpoint, resolve_device, seed_everything
    from robo_rl.learn.offline import OfflineConfig, OfflineLoop
    if cfg.rl.name not in AGENT_NAMES:
        raise ConfigError(f"offline-rl: agent={cfg.rl.name!r} unknown; agents are {', '.join(AGENT_NAMES)}")
    if not cfg.dataset:
        raise ConfigError("offline-rl: pass dataset=PATH (an OGBench .npz from `robo-rl ogbench-data`, or an episode store)")
    path = Path(cfg.dataset)
    if path.suffix != ".npz" and not path.is_dir():
        raise ConfigError(f"offline-rl: dataset={path}: give an OGBench-layout .npz or an episode store directory")
    if path.is_dir() and cfg.rl.name == "sharsa":
        raise ConfigError("offline-rl: sharsa is goal-conditioned; train it on an OGBench goal-conditioned or "
                          "oracle-rep dataset (.npz)")
    for key in ("steps", "batch_size"):
        if int(cfg[key]) < 1:
            raise ConfigError(f"offline-rl: {key}={cfg[key]} must be >= 1")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    seed_everything(int(cfg.seed))
    device = resolve_device(str(cfg.device))
    run_dir = resolve_run_dir(cfg)
    last = last_checkpoint(run_dir)
    if cfg.resume and not last.is_file():
        raise ConfigError(f"offline-rl: resume=true but {last} does not exist")
    if not cfg.resume and last.is_file():
        raise ConfigError(f"offline-rl: {run_dir} already holds a run; pass resume=true or another run_dir=")

    goal_conditioned = cfg.rl.name == "sharsa"
    t0 = time.perf_counter()
    if path.suffix == ".npz":
        src = ogbench_source(cfg, path, device)
    else:
        src = store_source(cfg, path, device)
    name, replay, held_replay, n_train, n_held = src["name"], src["replay"], src["held"], src["n_train"], src["n_held"]
    goal_dim, reward_range, arrays = src["goal_dim"], src["reward_range"], src["arrays"]
    load_s = time.perf_counter() - t0
    obs_dim, act_dim = arrays["observations"].shape[-1], arrays["actions"].shape[-1]
    agent = make_agent(cfg, obs_dim, act_dim, goal_dim, reward_range, int(cfg.seed)).to(device)
    agent.generator = replay.generator

    if goal_conditioned:
        from robo_rl.rl.sharsa import sample_batch as sharsa_batch

        sample = lambda n: sharsa_batch(replay, n, agent.config)  # noqa: E731
        heldout = (lambda n: sharsa_batch(held_replay, n, agent.config)) if held_replay is not None else None  # noqa: E731
    else:
        sample, heldout = replay.sample, (held_replay.sample if held_replay is not None else None)

    def act_fn(obs, goal=None):
        with torch.no_grad():
            o = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)
            if goal_conditioned:
                g = torch.as_tensor(goal, dtype=torch.float32, device=device).unsqueeze(0)
                return agent.act(o, g)[0].cpu().numpy()
            return agent.act(o)[0].cpu().numpy()

    def evaluate(step):
        agent.eval()
        try:
            return src["evaluate"](act_fn)
        finally:
            agent.train()

    loop_cfg = OfflineConfig(steps=int(cfg.steps), batch_size=int(cfg.batch_size), log_every=int(cfg.log_every),
                             eval_every=int(cfg.eval.every), heldout_every=int(cfg.heldout_every),
                             checkpoint_every=int(cfg.checkpoint_every), max_minutes=float(cfg.max_minutes),
                             seed=int(cfg.seed))
    n_params = sum(p.numel() for p in agent.parameters())
    # UTD laws' N is the critic's size (Fu et al. 2025, arXiv 2508.14881): the trained value networks, no targets or actors
    critics = ("critic", "floq", "distilled", "value", "low_critic", "low_value")
    n_critic = sum(p.numel() for c in critics if hasattr(agent, c) for p in getattr(agent, c).parameters())
    extra = {"agent": cfg.rl.name, "dataset": str(path), "env": name, "sigma": 1.0, "n_params": n_critic,
             "n_params_total": n_params,
             "width": int(cfg.rl.hidden[0]), "batch_size": int(cfg.batch_size), "lr": float(cfg.rl.lr),
             "seed": int(cfg.seed), "device": str(device)}
    loop = OfflineLoop(agent, loop_cfg, run_dir, sample, evaluate if cfg.eval.episodes > 0 else None, heldout,
                       generator=replay.generator, extra=extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.resume:
        loop.load(last)
        print(f"resumed {run_dir} at update {loop.step}")
    print(f"offline-rl {cfg.rl.name} ({n_params / 1e6:.2f}M params) on {name}: {n_train} train rows, "
          f"{n_held} held out, replay {replay.nbytes() / 2**20:.0f} MiB on {device} (loaded in {load_s:.1f} s) -> {run_dir}")
    result = loop.fit()

    if int(cfg.online.env_steps) > 0 and not goal_conditioned:
        result["online"] = online_phase(cfg, agent, src["env"], replay, evaluate, run_dir)
        # an online run is one point of a UTD sweep: sigma is its UTD, the curve its learning curve
        result.update(sigma=float(cfg.online.utd), curve=result["online"]["curve"], final_score=result["online"]["success_rate"])
        (run_dir / "results.json").write_text(json.dumps(result, indent=1, default=float))

    final = result.get("final_eval") or {}
    rows = [("agent", cfg.rl.name), ("dataset", f"{name} ({n_train} rows)"), ("updates", result["updates"]),
            ("updates/s", f"{result['updates_per_s']:.2f}"), ("train time", f"{result['train_time_s'] / 60:.1f} min")]
    if "heldout_td_error" in result:
        rows.append(("TD error train / held-out", f"{result['train_td_error']:.4g} / {result['heldout_td_error']:.4g}"))
    if final:
        rows.append(("success", f"{final['success_rate']:.1%} over {final['episodes']} episodes"))
        rows += [(f"  {k}", f"{v:.0%}") for k, v in final.items() if k.startswith("task")]
    if "online" in result:
        o = result["online"]
        rows.append(("online", f"{o['env_steps']} env steps at UTD {o['utd']}, success {o.get('success_rate', float('nan')):.1%}"))
    rows.append(("run", str(run_dir)))
    print_table(f"offline-rl {cfg.rl.name}", ["", ""], rows)
    print_training_plots(run_dir)
    return 0


def online_phase(cfg: DictConfig, agent, env, replay, evaluate, run_dir: Path) -> dict:
    """Fine-tune online in the env at UTD sigma, appending to the same device replay."""
    import torch

    from robo_rl.learn.online import online_finetune

    class Acting:
        def act(self, obs):
            with torch.no_grad():
                return agent.act(torch.as_tensor(obs, dtype=torch.float32, device=replay.device).unsqueeze(0))[0].cpu().numpy()

        def update(self, batch):
            return {k: float(v) for k, v in agent.update(batch).items()}

    def add(obs, action, reward, next_obs, terminated, truncated):
        replay.add({"observations": obs, "actions": action, "rewards": reward, "masks": 0.0 if terminated else 1.0,
                    "next_observations": next_obs})

    replay.reserve(int(cfg.online.env_steps))
    every = int(cfg.online.eval_every)
    out = online_finetune(Acting(), env, add, float(cfg.online.utd), int(cfg.online.env_steps), int(cfg.batch_size),
                          replay.sample, eval_fn=(lambda _: evaluate(agent.updates)["success_rate"]) if every else None,
                          eval_every=every, progress=True, seed=int(cfg.seed))
    final = evaluate(agent.updates)
    summary = {"env_steps": out["env_steps"], "updates": out["updates"], "utd": float(cfg.online.utd),
               "utd_achieved": out["utd_achieved"], "episodes": out["episodes"], "success_rate": final["success_rate"],
               "eval": final, "evaluations": out["evaluations"],
               # what `robo-rl utd-fit` reads: score against environment data consumed
               "curve": [[e["env_step"], e["score"]] for e in out["evaluations"] if "score" in e]
               + [[out["env_steps"], final["success_rate"]]]}
    (run_dir / "online.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary
