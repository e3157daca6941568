"""OGBench manipulation datasets made here, with the `ogbench` package's own scripted oracles.

OGBench's published datasets are episodes of a scripted arm doing random pick-and-place (or
button, drawer, window) tasks one after another: the environment, in `data_collection` mode,
picks a new target each time the oracle finishes the last one. The `ogbench` wheel ships the
environments and the oracles but not the script that drives them, so `generate_dataset` is that
driver: it writes `<out>.npz` (train) and `<out>-val.npz` in OGBench's file layout, which
`ogbench.utils.make_env_and_datasets` loads as it loads a downloaded file.

Dataset types:
- play:  plan oracles (a keyframe plan with temporally correlated noise),
- noisy: Markov oracles plus Gaussian action noise whose scale is drawn once per episode.

`evaluate` runs a policy in an OGBench task environment (OGBench's protocol: goal-conditioned
episodes cycle through the five evaluation tasks; single-task envs have their task built in).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from robo_rl.errors import RoboRLError

DATASET_TYPES = ("play", "noisy")
# per-dimension scale of the noisy datasets' action noise: x, y, z, yaw, gripper
NOISY_ACTION_SCALE = np.array([1.0, 1.0, 1.0, 3.0, 10.0])
EVAL_TASK_IDS = (1, 2, 3, 4, 5)


def _import_ogbench():
    """ogbench and its manipulation envs (registered with gymnasium on import), or a one-line error."""
    try:
        import ogbench  # noqa: F401
        import ogbench.manipspace  # noqa: F401
        import ogbench.utils  # noqa: F401
    except ImportError as e:
        raise RoboRLError(f"the ogbench package is not installed ({e}); pip install -e .[ogbench]") from None
    return ogbench


def dataset_name(env_name: str, dataset_type: str) -> str:
    """('cube-single-v0', 'play') -> 'cube-single-play-v0': the type goes before the version."""
    head, sep, version = env_name.rpartition("-")
    if not sep or not version.startswith("v"):
        raise RoboRLError(f"env={env_name!r}: an OGBench env name ends in a version, like cube-single-v0")
    return f"{head}-{dataset_type}-{version}"


def _check_env_name(env_name: str) -> None:
    import gymnasium

    spec = gymnasium.envs.registry.get(env_name)
    entry = str(getattr(spec, "entry_point", "")) if spec is not None else ""
    ok = (spec is not None and entry.startswith("ogbench.manipspace") and "singletask" not in env_name
          and not env_name.startswith("visual-"))
    if not ok:
        known = sorted(k for k, s in gymnasium.envs.registry.items()
                       if str(s.entry_point).startswith("ogbench.manipspace") and "singletask" not in k
                       and not k.startswith("visual-"))
        raise RoboRLError(f"env={env_name!r} is not an OGBench state-based manipulation env; "
                          f"choose one of {', '.join(known)}")


def _p_stack(env_name: str) -> float:
    """Probability that a new cube target is on top of another cube (OGBench's per-env choice)."""
    if "single" in env_name:
        return 0.0
    ranges = {"double": (0.0, 0.25), "triple": (0.05, 0.35), "quadruple": (0.1, 0.5), "octuple": (0.0, 0.35)}
    for word, (lo, hi) in ranges.items():
        if word in env_name:
            return float(np.random.uniform(lo, hi))
    return 0.5


def _make_oracles(env, env_name: str, dataset_type: str, noise: float, noise_smoothing: float,
                  min_norm: float) -> dict[str, Any]:
    """One oracle per kind of target the env can set ('cube', 'button', 'drawer', 'window')."""
    puzzle = env_name.startswith("puzzle")
    if dataset_type == "play":
        from ogbench.manipspace.oracles.plan.button_plan import ButtonPlanOracle
        from ogbench.manipspace.oracles.plan.cube_plan import CubePlanOracle
        from ogbench.manipspace.oracles.plan.drawer_plan import DrawerPlanOracle
        from ogbench.manipspace.oracles.plan.window_plan import WindowPlanOracle

        kw = dict(env=env, noise=noise, noise_smoothing=noise_smoothing)
        return {"cube": CubePlanOracle(**kw), "button": ButtonPlanOracle(gripper_always_closed=puzzle, **kw),
                "drawer": DrawerPlanOracle(**kw), "window": WindowPlanOracle(**kw)}
    from ogbench.manipspace.oracles.markov.button_markov import ButtonMarkovOracle
    from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle
    from ogbench.manipspace.oracles.markov.drawer_markov import DrawerMarkovOracle
    from ogbench.manipspace.oracles.markov.window_markov import WindowMarkovOracle

    kw = dict(env=env, min_norm=min_norm)
    return {"cube": CubeMarkovOracle(**kw), "button": ButtonMarkovOracle(gripper_always_closed=puzzle, **kw),
            "drawer": DrawerMarkovOracle(**kw), "window": WindowMarkovOracle(**kw)}


def _quiet(progress: bool) -> dict:
    """tqdm kwargs: off when progress=False; otherwise tqdm's defaults (TQDM_DISABLE=1 still silences it)."""
    return {} if progress else {"disable": True}


def _save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed into a temp file beside `path`, then rename: never a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _out_stem(out: str | Path) -> Path:
    out = Path(out)
    return out.with_suffix("") if out.suffix == ".npz" else out


def generate_dataset(env_name: str, out: str | Path, episodes: int, dataset_type: str = "play",
                     steps_per_episode: int = 1001, seed: int = 0, noise: float = 0.1,
                     noise_smoothing: float = 0.5, min_norm: float = 0.4, progress: bool = True) -> dict:
    """Run OGBench's oracles in `env_name` (data_collection mode) and write `<out>.npz` with
    `episodes` episodes and `<out>-val.npz` with the next max(1, episodes // 10).

    Each step stores the observation before the step, the clipped action, `terminals` (True on an
    episode's last step), and the physics state before the step (qpos, qvel, and button_states
    where the env has buttons), which OGBench's single-task and oracle-rep loaders need.
    The same arguments (seed included) give the same arrays.
    """
    if dataset_type not in DATASET_TYPES:
        raise RoboRLError(f"dataset_type={dataset_type!r}; choose one of {', '.join(DATASET_TYPES)}")
    if int(episodes) < 1:
        raise RoboRLError(f"episodes={episodes}: give at least 1")
    if int(steps_per_episode) < 2:
        raise RoboRLError(f"steps_per_episode={steps_per_episode}: give at least 2")
    _import_ogbench()
    _check_env_name(env_name)
    import gymnasium
    from tqdm import tqdm

    stem = _out_stem(out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    train_path, val_path = Path(f"{stem}.npz"), Path(f"{stem}-val.npz")
    n_train, n_val = int(episodes), max(1, int(episodes) // 10)
    T = int(steps_per_episode)

    np.random.seed(seed)  # the oracles and p_stack draw from numpy's global generator
    noise_rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")  # the envs' float64 action bounds
        env = gymnasium.make(env_name, terminate_at_goal=False, mode="data_collection", max_episode_steps=T)
    has_buttons = hasattr(env.unwrapped, "_cur_button_states")
    oracles = _make_oracles(env, env_name, dataset_type, noise, noise_smoothing, min_norm)

    keys = ["observations", "actions", "terminals", "qpos", "qvel"] + (["button_states"] if has_buttons else [])
    episodes_data: list[dict[str, np.ndarray]] = []
    targets = reached = 0
    t0 = time.perf_counter()
    try:
        for ep in tqdm(range(n_train + n_val), desc=f"ogbench {dataset_name(env_name, dataset_type)}",
                       unit="episode", **_quiet(progress)):
            ob, info = env.reset(seed=seed if ep == 0 else None)
            oracle = oracles[info["privileged/target_task"]]
            oracle.reset(ob, info)
            targets += 1
            xi = noise_rng.uniform(0.0, noise) if dataset_type == "noisy" else 0.0
            buf: dict[str, list] = {k: [] for k in keys}
            for t in range(T):
                action = np.asarray(oracle.select_action(ob, info), dtype=np.float64)
                if dataset_type == "noisy":
                    action = action + noise_rng.normal(0.0, 1.0, size=action.shape) * xi * NOISY_ACTION_SCALE
                action = np.clip(action, -1.0, 1.0)
                next_ob, _, _, _, info = env.step(action)
                buf["observations"].append(ob)
                buf["actions"].append(action)
                buf["terminals"].append(t == T - 1)
                buf["qpos"].append(info["prev_qpos"])
                buf["qvel"].append(info["prev_qvel"])
                if has_buttons:
                    buf["button_states"].append(info["prev_button_states"])
                ob = next_ob
                if oracle.done and t < T - 1:
                    reached += bool(info["success"])
                    ob, info = env.unwrapped.set_new_target(p_stack=_p_stack(env_name))
                    oracle = oracles[info["privileged/target_task"]]
                    oracle.reset(ob, info)
                    targets += 1
            episodes_data.append({
                "observations": np.asarray(buf["observations"], np.float32),
                "actions": np.asarray(buf["actions"], np.float32),
                "terminals": np.asarray(buf["terminals"], bool),
                "qpos": np.asarray(buf["qpos"], np.float32),
                "qvel": np.asarray(buf["qvel"], np.float32),
                **({"button_states": np.asarray(buf["button_states"], np.int64)} if has_buttons else {}),
            })
    finally:
        env.close()
    seconds = time.perf_counter() - t0

    def stack(eps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {k: np.concatenate([e[k] for e in eps]) for k in keys}

    _save_npz_atomic(train_path, stack(episodes_data[:n_train]))
    _save_npz_atomic(val_path, stack(episodes_data[n_train:]))
    steps = (n_train + n_val) * T
    return {
        "env": env_name,
        "dataset": dataset_name(env_name, dataset_type),
        "dataset_type": dataset_type,
        "train_path": str(train_path),
        "val_path": str(val_path),
        "train_episodes": n_train,
        "val_episodes": n_val,
        "steps_per_episode": T,
        "train_transitions": n_train * T,
        "val_transitions": n_val * T,
        "seconds": seconds,
        "steps_per_second": steps / max(seconds, 1e-9),
        "targets": targets,
        "targets_reached": reached,
        "train_bytes": train_path.stat().st_size,
        "val_bytes": val_path.stat().st_size,
        "seed": seed,
    }


def make_env_and_datasets(name: str, dataset_path: str | Path, **kwargs) -> tuple[Any, dict, dict | None]:
    """(env, train, val) through ogbench.utils.make_env_and_datasets from a local `<name>.npz`.
    `name` is any OGBench dataset name: goal-conditioned (cube-single-play-v0), single-task
    (cube-single-play-singletask-task2-v0) or oracle-rep. The `-val.npz` beside it is optional:
    without it, val is None and the training file is loaded as OGBench loads it (rewards relabelled
    for single-task names, oracle representations added for oracle-rep ones)."""
    path = Path(dataset_path)
    if not path.is_file():
        raise RoboRLError(f"{path}: no such dataset file; make it with `robo-rl ogbench-data`")
    has_val = Path(str(path).replace(".npz", "-val.npz")).is_file()
    og = _import_ogbench()
    import gymnasium

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        try:
            if has_val:
                return og.utils.make_env_and_datasets(name, dataset_path=str(path), **kwargs)
            env = og.utils.make_env_and_datasets(name, env_only=True, **{k: v for k, v in kwargs.items()
                                                                         if k != "compact_dataset"})
        except gymnasium.error.Error as e:
            raise RoboRLError(f"{name!r} is not an OGBench dataset name ({e}); e.g. cube-single-play-v0, "
                              f"cube-single-play-singletask-task2-v0, cube-single-play-oraclerep-v0") from None
        return env, _load_train_only(og, name, env, path, bool(kwargs.get("compact_dataset", False))), None


def _load_train_only(og: Any, name: str, env: Any, path: Path, compact: bool) -> dict:
    """The training file as ogbench.utils.make_env_and_datasets prepares it, with no val file."""
    splits, env_id = name.split("-"), env.spec.id
    visual = "visual" in env_id or "powderworld" in env_id
    extra = "singletask" in splits or "oraclerep" in splits  # these need qpos & co. while preparing
    train = og.utils.load_dataset(str(path), ob_dtype=np.uint8 if visual else np.float32,
                                  action_dtype=np.int32 if "powderworld" in env_id else np.float32,
                                  compact_dataset=compact, add_info=extra)
    if "singletask" in splits:
        og.utils.relabel_dataset(env_id, env, train)
    if "oraclerep" in splits:
        og.utils.add_oracle_reps(env_id, env, train)
    for key in ("qpos", "qvel", "button_states"):
        train.pop(key, None)
    return train


def evaluate(env, act_fn: Callable[[np.ndarray, np.ndarray | None], np.ndarray], episodes: int, seed: int = 0,
             task_ids: list[int] | None = None, goal_conditioned: bool | None = None,
             progress: bool = True) -> dict:
    """Run `episodes` episodes of `act_fn(obs, goal) -> action` in an OGBench task env.

    Goal-conditioned envs (the default when the env has no built-in task): episode i resets with
    task_id = task_ids[i % len(task_ids)] (default 1..5) and act_fn gets info['goal']. Single-task
    envs reset plainly and act_fn gets goal=None. Success is info['success'] at the episode's end.
    """
    from tqdm import tqdm

    if int(episodes) < 1:
        raise RoboRLError(f"episodes={episodes}: give at least 1")
    unwrapped = env.unwrapped
    if goal_conditioned is None:
        goal_conditioned = getattr(unwrapped, "_reward_task_id", None) is None
    if goal_conditioned:
        ids = list(task_ids) if task_ids else list(EVAL_TASK_IDS)
        n_tasks = getattr(unwrapped, "num_tasks", max(ids))
        bad = [k for k in ids if not 1 <= int(k) <= n_tasks]
        if bad:
            raise RoboRLError(f"task_ids={ids}: this env has tasks 1..{n_tasks}")
    else:
        ids = [getattr(unwrapped, "_reward_task_id", None) or 0]

    per_task: dict[int, list[bool]] = {int(k): [] for k in ids}
    lengths: list[int] = []
    t0 = time.perf_counter()
    for i in tqdm(range(int(episodes)), desc="ogbench eval", unit="episode", **_quiet(progress)):
        task = int(ids[i % len(ids)])
        first_seed = seed if i == 0 else None
        if goal_conditioned:
            ob, info = env.reset(seed=first_seed, options=dict(task_id=task, render_goal=False))
            goal = info["goal"]
        else:
            ob, info = env.reset(seed=first_seed)
            goal = None
        done, steps = False, 0
        while not done:
            action = np.clip(np.asarray(act_fn(ob, goal), dtype=np.float64), -1.0, 1.0)
            ob, _, terminated, truncated, info = env.step(action)
            steps += 1
            done = terminated or truncated
        per_task[task].append(bool(info.get("success", False)))
        lengths.append(steps)
    seconds = time.perf_counter() - t0
    everything = [s for v in per_task.values() for s in v]
    return {
        "success_rate": float(np.mean(everything)),
        "per_task": {k: float(np.mean(v)) for k, v in per_task.items() if v},
        "episodes": len(everything),
        "mean_episode_length": float(np.mean(lengths)),
        "seconds": seconds,
        "goal_conditioned": bool(goal_conditioned),
    }
