"""robo-rl demo (make demo): the whole story on the long-horizon task, on a laptop CPU.

1. teleop: the scripted expert (the twin's stand-in for a human on leader arms) records demos of
   the task (PackCube, or PackCube without its lid at CPU sizes) through the background Recorder;
2. pre-train a flow action-chunk policy on them and evaluate it in the twin;
3. RaC: the policy drives, the simulated operator takes over when failure looks imminent
   (recovery, then correction, then the episode ends); every step is labelled;
4. train on demos + recovery and correction data: by default retrained from fresh weights with
   the pre-training's recipe (`from_scratch`; robo_rl/rac/finetune.py says why), or fine-tuned
   from the pre-trained checkpoint;
5. the control: the same training on the demos alone (no new data), so that what RaC gains over
   it is the data's and not the extra training's;
6. evaluate both on the pre-trained policy's seeds: a three-row table (pre-trained, control,
   after RaC) with 95% Wilson intervals, a plot and a rollout video of each under `out`.

`full=auto` (the default) runs the GPU sizes where CUDA is available (PackCube, 200 demos, 30k
steps at batch 256) and the CPU sizes elsewhere (PackCube without its lid, 50 demos, 7000
steps, the flow's starting noise at half scale). `robo-rl rac` runs the longer comparison
(HG-DAgger, more expert demos, several rounds).
"""

from __future__ import annotations

import json
import time
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


def run(cfg: DictConfig) -> int:
    from robo_rl.learn import Learner, LearnerConfig
    from robo_rl.learn.from_store import policy_for_store
    from robo_rl.learn.learner import resolve_device
    from robo_rl.learn.recipes import camera_recipe
    from robo_rl.policies import FlowConfig, checkpoint_info, load_policy, read_checkpoint
    from robo_rl.policies.inference import predictor
    from robo_rl.rac.experiment import Rounds, Stages, gain_verdict, run_rounds, set_aside, trained
    from robo_rl.rac.mixing import CompositionConfig
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.evaluate import (EvaluationProcess, evaluate_with_recoveries, merge_shards, one_thread,
                                      recovery_row, seeded_noise, shard_spans)
    from robo_rl.sim.interventions import collect_interventions
    from robo_rl.sim.operator import OperatorConfig
    from robo_rl.sim.tasks import TASKS

    device = resolve_device(str(cfg.device))
    if not (isinstance(cfg.full, bool) or cfg.full == "auto"):
        raise ConfigError(f"demo: full={cfg.full!r}; choose true (GPU sizes), false (CPU sizes) or auto "
                          "(GPU sizes where CUDA is available)")
    # resolved before the run is written down, so that resume=true and config.yaml hold the sizes that ran
    cfg.full = device.startswith("cuda") if cfg.full == "auto" else bool(cfg.full)
    cfg.task = TASK_AT[cfg.full] if cfg.task == "auto" else cfg.task
    s = {**OmegaConf.to_container(cfg.small, resolve=True), **(FULL if cfg.full else {})}
    if cfg.task not in TASKS:
        raise ConfigError(f"demo: task={cfg.task!r} unknown; tasks are {sorted(TASKS)}")
    if min(s["demos"], s["pretrain_steps"], s["finetune_steps"], s["rounds"], s["episodes_per_round"],
           s["eval_episodes"]) < 1:
        raise ConfigError(f"demo: every size must be >= 1, got {s}")
    # the flow's starting-noise scale: each size's, unless policy.sample_temperature= is given
    s["sample_temperature"] = float(cfg.policy.get("sample_temperature", s["sample_temperature"]))
    policy_opts = OmegaConf.to_container(cfg.policy, resolve=True) or {}
    policy_opts["sample_temperature"] = s["sample_temperature"]
    FlowConfig.from_dict(policy_opts)  # the policy's own checks, before the run is written down or demos recorded
    out = Path(cfg.out)
    if cfg.obs == "state":
        cameras, image_size = [], None
        obs_keys = ["obs/qpos", "obs/env_state"]
    elif cfg.obs == "images":  # what a real arm can run: its cameras and joint positions, no object poses
        cameras = [str(c) for c in cfg.cameras]
        image_size = (int(cfg.image_size[0]), int(cfg.image_size[1]))
        if not cameras:
            raise ConfigError("demo: obs=images needs cameras, e.g. cameras=[top,right_wrist]")
        from robo_rl.sim.recording import recording_env

        recording_env(cfg.task, cameras, image_size)[0].close()  # a camera the twin lacks: one line, nothing written
        obs_keys = ["obs/qpos", *(f"obs/images/{c}" for c in cameras)]
    else:
        raise ConfigError(f"demo: obs={cfg.obs!r}; choose state or images")
    # obs=images: the camera recipe `train` picks (robo_rl/learn/recipes.py), then image_policy on top
    recipe = {}
    if cameras:
        recipe = camera_recipe("flow", device)
        policy_opts.update({k.split(".", 1)[1]: v for k, v in recipe.items() if k.startswith("policy.")})
        policy_opts.update(OmegaConf.to_container(cfg.image_policy, resolve=True) or {})

    # Every row on the same seeds, one video each, in `eval_parts` parts of consecutive episodes, each
    # part with its own noise seed and one torch thread. processes=2 runs a part beside the other,
    # and the pre-trained policy's evaluation beside RaC's first round: the same rows in less time.
    n_eval, parts, side_by_side = int(s["eval_episodes"]), int(cfg.eval_parts), int(cfg.processes) > 1
    if parts < 1 or int(cfg.processes) not in (1, 2):
        raise ConfigError(f"demo: eval_parts={parts} must be >= 1 and processes={cfg.processes} 1 or 2")
    # a store recorded before: checked before anything is written
    recorded = existing_demos(Path(str(cfg.demos_from)), cfg.task, int(s["demos"]), obs_keys, image_size) if cfg.demos_from else None
    stages = Stages(out, cfg, bool(cfg.resume))  # the settings are checked: the run is written down from here
    t_start = time.perf_counter()

    def evaluate(policy: Any, name: str, checkpoint: Path) -> dict[str, Any]:
        if side_by_side and parts > 1:
            print(f"   ({n_eval} episodes in {parts} parts, two processes; the bar shows the first part)")
        with one_thread():  # as in the second process, whatever the parts
            return evaluate_with_recoveries(policy, cfg.task, chunking, n_eval, int(cfg.n_envs), 100_000, 5,
                                            out / f"eval-{name}", videos=int(cfg.videos), shards=parts,
                                            beside=(checkpoint, device) if side_by_side else None)

    def learner(steps: int, lr: float, warmup: int, **more: Any) -> LearnerConfig:
        return LearnerConfig(steps=steps, batch_size=int(s["batch_size"]), lr=lr, warmup_steps=warmup,
                             checkpoint_every=1000, seed=int(cfg.seed), device=cfg.device, threads=int(cfg.threads),
                             bf16=str(recipe.get("learner.bf16", "auto")),
                             compile=str(recipe.get("learner.compile", "false")), **more)

    # 1. teleop demos through the Recorder (or a store recorded before)
    if cfg.demos_from:
        demos = Path(str(cfg.demos_from))
        rec = stages.run("1 teleop demos", lambda: recorded)
    else:
        demos = out / "demos"

        def record() -> dict[str, Any]:
            set_aside(demos)  # an interrupted recording's episodes are kept beside, not overwritten
            return record_demos(cfg.task, demos, int(s["demos"]), int(cfg.seed), cameras, image_size)

        rec = stages.run("1 teleop demos", record)

    # 2. pre-train a flow policy
    pre_dir = out / "pretrain"
    lcfg = learner(int(s["pretrain_steps"]), float(s["lr"]), 300)
    policy, sampler, n_demos = policy_for_store(demos, obs_keys, "flow", policy_opts, int(rec["episodes"]),
                                                resolve_device(lcfg.device))
    chunking = ({"mode": recipe["eval.chunking.mode"]} if "eval.chunking.mode" in recipe
                else {"n_action_steps": policy.config.n_action_steps})

    def pretrain() -> dict[str, Any]:
        print(f"2/6 pre-train a flow policy ({sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params) on "
              f"{n_demos} demos, {lcfg.steps} steps")
        trainer = Learner(policy, lcfg, pre_dir, lambda bs, g, w: sampler.sample(bs, g, w),
                          extra=checkpoint_info(policy, cfg.task, demos, n_demos, obs_keys, chunking))
        if cfg.resume and trainer.resume_from_last():
            print(f"   resumed at step {trainer.step}")
        return trained(trainer.fit())

    stages.run("2 pre-train", pretrain)
    ckpt = read_checkpoint(pre_dir / "checkpoints" / "last.pt")
    base = load_policy(ckpt, device=device)
    # processes=2: the pre-trained policy is evaluated in a second process during the first round
    # (both run its policy; the twin steps on one core each), and its row is taken after the round
    pre_eval: Any = None
    if side_by_side and "2 evaluate pre-trained" not in stages.done and "3 RaC rollouts, round 1" not in stages.done:
        print(f"   evaluate the pre-trained policy on {n_eval} episodes in a second process, beside RaC's first round")
        pre_eval = EvaluationProcess(pre_dir / "checkpoints" / "last.pt", device, cfg.task, chunking,
                                     shard_spans(n_eval, parts), int(cfg.n_envs), 100_000, out / "eval-pretrained",
                                     int(cfg.videos))
    ran_beside = pre_eval is not None
    if pre_eval is None:
        print(f"   evaluate the pre-trained policy on {n_eval} episodes")
        before = stages.run("2 evaluate pre-trained", lambda: evaluate(base, "pretrained", pre_dir / "checkpoints" / "last.pt"))

    # 3-4. RaC rounds with the simulated operator; each retrains from fresh weights (or fine-tunes the
    # pre-trained checkpoint) on the demos plus every intervention so far; the next round uses that policy
    from_scratch = bool(cfg.from_scratch)
    steps, lr, warmup = ((s["pretrain_steps"], s["lr"], 300) if from_scratch else (s["finetune_steps"], s["finetune_lr"], 100))
    ft = learner(int(steps), float(lr), warmup, weighted_sampling=True, loss_weights=False)
    how = "retrain" if from_scratch else "fine-tune"
    composition = CompositionConfig(**(OmegaConf.to_container(cfg.composition, resolve=True) or {}))
    operator = OperatorConfig(**(OmegaConf.to_container(cfg.operator_config, resolve=True) or {}))

    def collect(method: str, predict: Any, store: Path, r: int, need: int | None) -> dict[str, Any]:
        print(f"3/6 RaC round {r}: {s['episodes_per_round']} rollouts with the simulated operator watching")
        set_aside(store)  # an interrupted round's partial rollouts are kept beside, not mixed in
        # noise from the round's seed on one thread: a resumed or side-by-side run draws the same
        with seeded_noise(200_000 + 100 * r), one_thread():
            return collect_interventions(predict, cfg.task, obs_keys, base.config.n_obs, base.config.horizon,
                                         ChunkingConfig(**chunking), store, int(s["episodes_per_round"]),
                                         seed=200_000 + 100 * r, mode="rac", n_envs=int(cfg.n_envs), operator=operator,
                                         image_size=image_size).to_dict()

    def after_collect(r: int) -> None:
        nonlocal pre_eval, before
        if pre_eval is not None:  # the pre-trained row, evaluated beside this round; its time is the wait after it
            print("   the pre-trained policy's evaluation, beside the round: waiting for it")
            before = stages.run("2 evaluate pre-trained", lambda: recovery_row(
                merge_shards(pre_eval.parts()), 5, out / "eval-pretrained"))
            pre_eval = None

    plan = Rounds("rac", int(s["rounds"]), ckpt, [(demos, n_demos)], lambda r: out / "interventions" / f"round{r}",
                  lambda r: out / f"rac-round{r}", ft, composition, from_scratch, device)
    try:
        policy_now, round_rows = run_rounds(plan, base, predictor(base), collect, stages=stages, resume=bool(cfg.resume),
                                            after_collect=after_collect, predictor=predictor)
    except BaseException:
        if pre_eval is not None:
            pre_eval.cancel()
        raise
    total_samples = round_rows[-1]["operator_samples"]
    rounds = [{"round": row["round"], "collect": row["collect"], "operator_samples": row["operator_samples"]}
              for row in round_rows]

    # 5. the control: the same training on the demos alone. What it gains over the pre-trained
    # policy is the extra training's; what RaC gains over it is the data's. Retrained from scratch,
    # the same recipe, steps and seed on the demos alone is the pre-training itself: its row is the
    # pre-trained policy's (a retrain with another seed gave 32% against 33%: docs/history.md, "PackCube with slips and 30 s").
    if from_scratch:
        print("5/6 control: retraining on the demos alone is the pre-training itself (same recipe, steps and seed)")
    else:
        print(f"5/6 control: {how} on the demos alone, no new data, {ft.steps} steps")
        control_plan = Rounds("no_new_data", 1, ckpt, [(demos, n_demos)], lambda r: out / "control",
                              lambda r: out / "control", ft, composition, from_scratch, device,
                              stage_names=("", "5 {how}, control"))
        control, _ = run_rounds(control_plan, base, None, collect, stages=stages, resume=bool(cfg.resume))

    # 6. evaluate on the same seeds as the pre-trained policy
    print(f"6/6 evaluate after RaC{'' if from_scratch else ' and the control'} on the same {s['eval_episodes']} episodes")
    last = out / f"rac-round{s['rounds']}" / "checkpoints" / "last.pt"
    after = stages.run("6 evaluate after RaC", lambda: evaluate(policy_now, "after-rac", last))
    ctrl = before if from_scratch else stages.run("6 evaluate control", lambda: evaluate(
        control, "control", out / "control" / "checkpoints" / "last.pt"))
    rows = {"pre-trained": before, "control (= the pre-training)" if from_scratch else "control (no new data)": ctrl,
            "after RaC": after}
    plot = write_rows_plot(rows, cfg.task, out / "before_after.png")
    verdict = gain_verdict(before, ctrl, after)
    timings = stages.timings
    result = {"task": cfg.task, "sizes": s, "policy": policy_opts, "device": device, "recording": rec,
              "before": before, "control": ctrl, "control_is_pretraining": from_scratch, "after": after,
              "verdict": verdict, "rounds": rounds,
              "operator_samples": total_samples, "timings_s": timings, "wall_s": sum(timings.values()),
              "resumed": stages.resumed}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print_rows(rows, cfg.task, int(s["eval_episodes"]), total_samples, "GPU sizes" if cfg.full else "CPU sizes")
    print(verdict["line"])
    beside = {"2 evaluate pre-trained": " (beside round 1: the wait after it)"} if ran_beside else {}
    print_table("time", ["step", "seconds"], [[k + beside.get(k, "") + (" (an earlier run)" if k in stages.resumed else ""),
                                               f"{v:.0f}"]
                                              for k, v in timings.items()] +
                [["total", f"{sum(timings.values()):.0f}"], ["this run", f"{time.perf_counter() - t_start:.0f}"]])
    videos = list(dict.fromkeys(v for d in rows.values() for v in d["videos"][:1]))  # the reused control adds none
    print(f"\nresults: {out / 'results.json'}   plot: {plot}   videos: {', '.join(videos) or 'none'}")
    return 0


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
