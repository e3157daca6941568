"""robo-rl demo (make demo): the whole story on the long-horizon task, on a laptop CPU.

1. teleop: the scripted expert (the twin's stand-in for a human on leader arms) records demos of
   the task (PackCube, or PackCube without its lid at CPU sizes) through the background Recorder;
2. pre-train a flow action-chunk policy on them and evaluate it in the twin;
3. RaC: the policy drives, the simulated operator takes over when failure looks imminent
   (recovery, then correction, then the episode ends); every step is labelled;
4. train on demos + recovery and correction data: retrained from fresh weights with the
   pre-training's recipe, or fine-tuned from the pre-trained checkpoint (`from_scratch`; by
   default a state policy retrains and a camera policy fine-tunes);
5. the control: the same training on the demos alone (no new data), so that what RaC gains over
   it is the data's and not the extra training's;
6. evaluate both on the pre-trained policy's seeds: a three-row table (pre-trained, control,
   after RaC) with 95% Wilson intervals, a plot and a rollout video of each under `out`.

`full=auto` (the default) runs the GPU sizes where CUDA is available (PackCube, 200 demos, 30k
steps at batch 256) and the CPU sizes elsewhere (PackCube without its lid, 50 demos, 7000
steps, the flow's starting noise at half scale). `robo-rl rac` runs the longer comparison
(HG-DAgger, more expert demos, several rounds). The experiment itself lives in
robo_rl/rac/before_after.py; this verb wires the twin into it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError

# full=true: the same protocol as the CPU sizes (one round of 120 rollouts, 100 evaluation episodes)
# with 4x the demos and 8.6x the training samples per training run, for a GPU
FULL = {"demos": 200, "pretrain_steps": 30000, "batch_size": 256, "rounds": 1, "episodes_per_round": 120,
        "finetune_steps": 10000, "eval_episodes": 100, "sample_temperature": 1.0}
# task=auto: each size's task. At CPU sizes imitation seats PackCube's lid in only about half of the
# episodes, a shortfall no recovery fixes; without the lid what is left is mostly the slips
# (docs/history.md, "The CPU demo: PackCube without its lid")
TASK_AT = {False: "pack_cube_nolid", True: "pack_cube"}


def main(argv: list[str]) -> int:
    return run_app("demo", "demo", run, argv)


def record_demos(task: str, out: Path, episodes: int, seed: int, cameras: list[str] | None = None,
                 image_size: tuple[int, int] | None = None) -> dict[str, Any]:
    """Scripted-expert teleop in the twin, each step handed to the background Recorder (with
    `cameras` rendered at `image_size`, for a camera policy)."""
    from robo_rl.data.recorder import Recorder
    from robo_rl.data.schema import EpisodeMeta
    from robo_rl.sim.recording import expert_episode, recording_env

    cameras = list(cameras or [])
    env, schema = recording_env(task, cameras, image_size)
    fps = env.robot.spec.control_hz
    kept = tries = 0
    with Recorder(out, schema, overwrite=True) as rec:
        bar = tqdm(total=episodes, desc=f"1/6 teleop {task} (scripted expert)", unit="ep")
        while kept < episodes and tries < 2 * episodes:
            data, ok, facts = expert_episode(env, seed + tries, None, cameras)
            tries += 1
            if not ok:  # keep successful demos only, as ALOHA does
                continue
            rec.start_episode(EpisodeMeta(task=task, source="teleop", operator="scripted_expert", extra=facts))
            for k in range(len(data["action"])):
                rec.add_step({key: v[k] for key, v in data.items()}, timestamp=k / fps, segment="TELEOP")
            rec.end_episode(success=True)
            kept += 1
            bar.update()
        bar.close()
    env.close()
    stats = rec.stats()
    return {"episodes": kept, "tries": tries, "blocked_p99_ms": stats.blocked_p99_ms}


@dataclass
class Settings:
    """The demo's settings, checked and resolved before anything is written."""

    sizes: dict[str, Any]  # the CPU or GPU sizes, with overrides
    policy_opts: dict[str, Any]  # FlowConfig options: the demo's, the camera recipe's, image_policy
    recipe: dict[str, Any]  # obs=images: the camera recipe's learner and evaluation settings
    cameras: list[str]
    image_size: tuple[int, int] | None
    obs_keys: list[str]
    device: str


def run(cfg: DictConfig) -> int:
    from robo_rl.learn import LearnerConfig
    from robo_rl.learn.from_store import policy_for_store
    from robo_rl.policies import checkpoint_info
    from robo_rl.rac.before_after import BeforeAfter, run_before_after
    from robo_rl.rac.experiment import Stages, set_aside
    from robo_rl.rac.mixing import CompositionConfig
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.evaluate import (EvaluationProcess, evaluate_with_recoveries, one_thread, seeded_noise,
                                      shard_spans)
    from robo_rl.sim.interventions import collect_interventions
    from robo_rl.sim.operator import OperatorConfig

    st = settings(cfg)
    s, out = st.sizes, Path(cfg.out)
    # Every row on the same seeds, one video each, in `eval_parts` parts of consecutive episodes, each
    # part with its own noise seed and one torch thread. processes=2 runs a part beside the other,
    # the pre-trained policy's evaluation beside RaC's first round, and on a CPU the control's
    # fine-tune beside the round's: the same rows in less time.
    n_eval, parts, side_by_side = int(s["eval_episodes"]), int(cfg.eval_parts), int(cfg.processes) > 1
    demos = Path(str(cfg.demos_from)) if cfg.demos_from else out / "demos"
    recorded = existing_demos(demos, cfg.task, int(s["demos"]), st.obs_keys, st.image_size) if cfg.demos_from else None
    stages = Stages(out, cfg, bool(cfg.resume))  # the settings are checked: the run is written down from here
    t_start = time.perf_counter()

    def record() -> dict[str, Any]:  # 1. teleop demos through the Recorder (or a store recorded before)
        if recorded is not None:
            return recorded
        set_aside(demos)  # an interrupted recording's episodes are kept beside, not overwritten
        return record_demos(cfg.task, demos, int(s["demos"]), int(cfg.seed), st.cameras, st.image_size)

    rec = stages.run("1 teleop demos", record)

    def learner(steps: int, lr: float, warmup: int, **more: Any) -> LearnerConfig:
        return LearnerConfig(steps=int(steps), batch_size=int(s["batch_size"]), lr=float(lr), warmup_steps=warmup,
                             checkpoint_every=1000, seed=int(cfg.seed), device=cfg.device, threads=int(cfg.threads),
                             bf16=str(st.recipe.get("learner.bf16", "auto")),
                             compile=str(st.recipe.get("learner.compile", "false")), **more)

    policy, sampler, n_demos = policy_for_store(demos, st.obs_keys, "flow", st.policy_opts, int(rec["episodes"]), st.device)
    chunking = ({"mode": st.recipe["eval.chunking.mode"]} if "eval.chunking.mode" in st.recipe
                else {"n_action_steps": policy.config.n_action_steps})
    operator = OperatorConfig(**(OmegaConf.to_container(cfg.operator_config, resolve=True) or {}))

    def collect(method: str, predict: Any, store: Path, r: int, need: int | None) -> dict[str, Any]:
        print(f"3/6 RaC round {r}: {s['episodes_per_round']} rollouts with the simulated operator watching")
        # noise from the round's seed on one thread: a resumed or side-by-side run draws the same
        with seeded_noise(200_000 + 100 * r), one_thread():
            return collect_interventions(predict, cfg.task, st.obs_keys, policy.config.n_obs, policy.config.horizon,
                                         ChunkingConfig(**chunking), store, int(s["episodes_per_round"]),
                                         seed=200_000 + 100 * r, mode="rac", n_envs=int(cfg.n_envs), operator=operator,
                                         image_size=st.image_size).to_dict()

    def evaluate(policy: Any, name: str, checkpoint: Path) -> dict[str, Any]:
        print(f"   evaluate {name} on {n_eval} episodes" + (f" in {parts} parts, two processes (the bar shows the "
                                                          "first)" if side_by_side and parts > 1 else ""))
        with one_thread():  # as in the second process, whatever the parts
            return evaluate_with_recoveries(policy, cfg.task, chunking, n_eval, int(cfg.n_envs), 100_000, 5,
                                            out / f"eval-{name}", videos=int(cfg.videos), shards=parts,
                                            beside=(checkpoint, st.device) if side_by_side else None)

    def evaluate_beside(checkpoint: Path) -> EvaluationProcess:
        print(f"   evaluate the pre-trained policy on {n_eval} episodes in a second process, beside RaC's first round")
        return EvaluationProcess(checkpoint, st.device, cfg.task, chunking, shard_spans(n_eval, parts), int(cfg.n_envs),
                                 100_000, out / "eval-pretrained", int(cfg.videos))

    # each round retrains with the pre-training's recipe, or fine-tunes the pre-trained weights
    train = ((s["pretrain_steps"], s["lr"], 300) if cfg.from_scratch else (s["finetune_steps"], s["finetune_lr"], 100))
    plan = BeforeAfter(out, demos, n_demos, learner(s["pretrain_steps"], s["lr"], 300),
                       learner(*train, weighted_sampling=True, loss_weights=False), int(s["rounds"]),
                       bool(cfg.from_scratch), CompositionConfig(**OmegaConf.to_container(cfg.composition, resolve=True)),
                       st.device, checkpoint_info(policy, cfg.task, demos, n_demos, st.obs_keys, chunking))
    res = run_before_after(plan, policy, lambda bs, g, w: sampler.sample(bs, g, w), collect, evaluate, stages,
                           bool(cfg.resume), evaluate_beside if side_by_side else None, control_beside=side_by_side)
    report(cfg, st, rec, res, stages, time.perf_counter() - t_start)
    return 0


def settings(cfg: DictConfig) -> Settings:
    """The sizes, policy and observations of `cfg`, each checked (a one-line ConfigError) before
    the run is written down or any demo recorded; `full` and `task` are resolved in `cfg` itself,
    so that config.yaml and resume=true hold the sizes that ran."""
    from robo_rl.learn.learner import resolve_device
    from robo_rl.learn.recipes import camera_recipe
    from robo_rl.policies import FlowConfig
    from robo_rl.sim.tasks import TASKS

    device = resolve_device(str(cfg.device))
    if not (isinstance(cfg.full, bool) or cfg.full == "auto"):
        raise ConfigError(f"demo: full={cfg.full!r}; choose true (GPU sizes), false (CPU sizes) or auto "
                          "(GPU sizes where CUDA is available)")
    cfg.full = device.startswith("cuda") if cfg.full == "auto" else bool(cfg.full)
    cfg.task = TASK_AT[cfg.full] if cfg.task == "auto" else cfg.task
    s = {**OmegaConf.to_container(cfg.small, resolve=True), **(FULL if cfg.full else {})}
    if cfg.task not in TASKS:
        raise ConfigError(f"demo: task={cfg.task!r} unknown; tasks are {sorted(TASKS)}")
    if min(s["demos"], s["pretrain_steps"], s["finetune_steps"], s["rounds"], s["episodes_per_round"],
           s["eval_episodes"]) < 1:
        raise ConfigError(f"demo: every size must be >= 1, got {s}")
    if int(cfg.eval_parts) < 1 or int(cfg.processes) not in (1, 2):
        raise ConfigError(f"demo: eval_parts={cfg.eval_parts} must be >= 1 and processes={cfg.processes} 1 or 2")
    # the flow's starting-noise scale: each size's, unless policy.sample_temperature= is given
    s["sample_temperature"] = float(cfg.policy.get("sample_temperature", s["sample_temperature"]))
    policy_opts = OmegaConf.to_container(cfg.policy, resolve=True) or {}
    policy_opts["sample_temperature"] = s["sample_temperature"]
    FlowConfig.from_dict(policy_opts)  # the policy's own checks
    if not (isinstance(cfg.from_scratch, bool) or cfg.from_scratch == "auto"):
        raise ConfigError(f"demo: from_scratch={cfg.from_scratch!r}; choose true (retrain), false (fine-tune) or auto")
    cfg.from_scratch = cfg.obs == "state" if cfg.from_scratch == "auto" else cfg.from_scratch
    if cfg.obs == "state":
        return Settings(s, policy_opts, {}, [], None, ["obs/qpos", "obs/env_state"], device)
    if cfg.obs != "images":
        raise ConfigError(f"demo: obs={cfg.obs!r}; choose state or images")
    # what a real arm can run: its cameras and joint positions, no object poses
    cameras = [str(c) for c in cfg.cameras]
    image_size = (int(cfg.image_size[0]), int(cfg.image_size[1]))
    if not cameras:
        raise ConfigError("demo: obs=images needs cameras, e.g. cameras=[top,right_wrist]")
    from robo_rl.sim.recording import recording_env

    recording_env(cfg.task, cameras, image_size)[0].close()  # a camera the twin lacks: one line, nothing written
    # the camera recipe `train` picks (robo_rl/learn/recipes.py), then image_policy on top
    recipe = camera_recipe("flow", device)
    policy_opts.update({k.split(".", 1)[1]: v for k, v in recipe.items() if k.startswith("policy.")})
    policy_opts.update(OmegaConf.to_container(cfg.image_policy, resolve=True) or {})
    return Settings(s, policy_opts, recipe, cameras, image_size, ["obs/qpos", *(f"obs/images/{c}" for c in cameras)],
                    device)


def report(cfg: DictConfig, st: Settings, rec: dict[str, Any], res: dict[str, Any], stages: Any, wall_s: float) -> None:
    """results.json, the three rows, the verdict, the time of each stage and the plot."""
    out, s = Path(cfg.out), st.sizes
    control_name = "control (= the pre-training)" if res["control_is_pretraining"] else "control (no new data)"
    rows = {"pre-trained": res["before"], control_name: res["control"], "after RaC": res["after"]}
    plot = write_rows_plot(rows, cfg.task, out / "before_after.png")
    timings = stages.timings
    result = {"task": cfg.task, "sizes": s, "policy": st.policy_opts, "device": st.device, "recording": rec, **res,
              "timings_s": timings, "wall_s": sum(timings.values()), "resumed": stages.resumed}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print_rows(rows, cfg.task, int(s["eval_episodes"]), res["operator_samples"], "GPU sizes" if cfg.full else "CPU sizes")
    print(res["verdict"]["line"])
    beside = {k: f" ({where}: the wait after it)" for k, where in res["beside"].items()}
    print_table("time", ["step", "seconds"], [[k + beside.get(k, "") + (" (an earlier run)" if k in stages.resumed else ""),
                                               f"{v:.0f}"] for k, v in timings.items()] +
                [["total", f"{sum(timings.values()):.0f}"], ["this run", f"{wall_s:.0f}"]])
    videos = list(dict.fromkeys(v for d in rows.values() for v in d["videos"][:1]))  # the reused control adds none
    print(f"\nresults: {out / 'results.json'}   plot: {plot}   videos: {', '.join(videos) or 'none'}")


def existing_demos(path: Path, task: str, episodes: int, obs_keys: list[str],
                   image_size: tuple[int, int] | None) -> dict[str, Any]:
    """`demos_from=`: a store recorded before (by this demo, `robo-rl collect` or a teleop session),
    with the demo's observations and its cameras' frames at the size the rollouts render."""
    from robo_rl.data.store import EpisodeStore

    store = EpisodeStore.open(path, mode="r")  # a missing or foreign folder is a one-line StoreError
    tasks = {m.task for m in store.metas[: min(episodes, store.n_episodes)]}
    if store.n_episodes < episodes or tasks != {task}:
        raise ConfigError(f"demo: demos_from={path} holds {store.n_episodes} episodes of {sorted(tasks)}; "
                          f"the demo needs {episodes} of {task}")
    cameras = {k: list(store.train_image_size or store.schema.keys[k].shape[:2]) for k in store.schema.image_keys}
    missing = [k for k in obs_keys if k not in store.schema.keys]
    if missing:
        raise ConfigError(f"demo: demos_from={path} has no {missing}; its cameras are "
                          f"{sorted(k.rsplit('/', 1)[-1] for k in cameras) or 'none'} (record the demo's cameras, or pass cameras=)")
    wrong = {k.rsplit("/", 1)[-1]: v for k, v in cameras.items() if k in obs_keys and tuple(v) != tuple(image_size or ())}
    if wrong:
        raise ConfigError(f"demo: demos_from={path} has frames of {wrong} (height, width); the demo renders its rollouts "
                          f"at image_size={list(image_size or ())}: record the demos at that size or pass image_size=")
    return {"episodes": episodes, "from": str(path)}


def print_rows(rows: dict[str, dict[str, Any]], task: str, episodes: int, samples: int, sizes: str) -> None:
    first = next(iter(rows.values()))
    header = ["", *rows]
    table = [["success (95% Wilson)", *(f"{d['success_rate']:.0%} [{d['ci95_low']:.0%}, {d['ci95_high']:.0%}]"
                                         for d in rows.values())]]
    table += [[f"reached {k}", *(f"{d['stage_reach'][k]:.0%}" for d in rows.values())] for k in first["stage_reach"]]
    if first.get("disturbed", {}).get("episodes"):
        table += [["success when disturbed", *(
            f"{d['disturbed']['successes']}/{d['disturbed']['episodes']}" for d in rows.values())]]
    table += [["recovery manoeuvres / episode", *(f"{d['mean_recoveries']:.2f}" for d in rows.values())],
              ["mean episode length", *(f"{d['mean_length']:.0f}" for d in rows.values())]]
    print_table(f"{task} at {sizes}: pre-trained, control and after RaC ({episodes} eval episodes each, same seeds; "
                f"{samples:,} operator samples)", header, table)


def write_rows_plot(rows: dict[str, dict[str, Any]], task: str, path: Path) -> Path:
    """Stage reach and success of each row as grouped bars, with the success intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(rows.values()))
    names = list(first["stage_reach"]) + ["success"]
    x = np.arange(len(names))
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (label, d) in enumerate(rows.items()):
        values = [d["stage_reach"][k] for k in names[:-1]] + [d["success_rate"]]
        at = x + (i - (len(rows) - 1) / 2) * width
        ax.bar(at, values, width, label=label)
        ax.errorbar(at[-1], d["success_rate"], yerr=[[d["success_rate"] - d["ci95_low"]],
                                                     [d["ci95_high"] - d["success_rate"]]], color="black", capsize=3)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("share of eval episodes")
    ax.set_ylim(0, 1)
    ax.set_title(f"{task}: stage reach and success (95% interval on success)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
