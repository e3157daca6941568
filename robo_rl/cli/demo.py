"""robo-rl demo (make demo): the whole story on the long-horizon task, on a laptop CPU.

1. teleop: the scripted expert (the twin's stand-in for a human on leader arms) records demos of
   PackCube through the background Recorder;
2. pre-train a flow action-chunk policy on them and evaluate it in the twin;
3. RaC: the policy drives, the simulated operator takes over when failure looks imminent
   (recovery, then correction, then the episode ends); every step is labelled;
4. fine-tune from the pre-trained checkpoint on demos + recovery and correction data;
5. the control: the same fine-tuning from the same checkpoint on the demos alone (no new data),
   so that what RaC gains over it is the data's and not the extra training steps';
6. evaluate both on the pre-trained policy's seeds: a three-row table (pre-trained, control,
   after RaC) with 95% Wilson intervals, a plot and a rollout video of each under `out`.

`full=true` swaps in paper-scale settings meant for a GPU. `robo-rl rac` runs the longer
comparison (HG-DAgger, more expert demos, several rounds).
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

FULL = {"demos": 200, "pretrain_steps": 30000, "batch_size": 256, "rounds": 3, "episodes_per_round": 20,
        "finetune_steps": 10000, "eval_episodes": 100}


def main(argv: list[str]) -> int:
    return run_app("demo", "demo", run, argv)


def record_demos(task: str, out: Path, episodes: int, seed: int) -> dict[str, Any]:
    """Scripted-expert teleop in the twin, each step handed to the background Recorder."""
    from robo_rl.data.recorder import Recorder
    from robo_rl.data.schema import EpisodeMeta
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.recording import demo_schema, demo_step

    env = BimanualEnv(task, obs_mode="state")
    schema = demo_schema(env, [], (0, 0))
    fps = env.robot.spec.control_hz
    kept = tries = 0
    with Recorder(out, schema, overwrite=True) as rec:
        bar = tqdm(total=episodes, desc=f"1/6 teleop {task} (scripted expert)", unit="ep")
        while kept < episodes and tries < 2 * episodes:
            obs, _ = env.reset(seed=seed + tries)
            expert = env.expert()
            rec.start_episode(EpisodeMeta(task=task, source="teleop", operator="scripted_expert",
                                          extra={"seed": seed + tries, "init_state": env.sim_state().tolist()}))
            tries += 1
            for k in range(env.max_steps):
                prev = obs
                obs, _, terminated, truncated, info = env.step(expert.act())
                rec.add_step(demo_step(prev, info["executed_action"], []), timestamp=k / fps, segment="TELEOP")
                if terminated or truncated:
                    break
            if info["success"]:
                rec.end_episode(success=True)
                kept += 1
                bar.update()
            else:
                rec.discard_episode()  # keep successful demos only, as ALOHA does
        bar.close()
    env.close()
    stats = rec.stats()
    return {"episodes": kept, "tries": tries, "blocked_p99_ms": stats.blocked_p99_ms}


def run(cfg: DictConfig) -> int:
    from robo_rl.learn import Learner, LearnerConfig
    from robo_rl.learn.from_store import policy_for_store
    from robo_rl.learn.learner import resolve_device
    from robo_rl.policies import checkpoint_info, load_policy, read_checkpoint
    from robo_rl.policies.common import predictor
    from robo_rl.rac.finetune import finetune
    from robo_rl.rac.mixing import CompositionConfig
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.evaluate import evaluate_with_recoveries
    from robo_rl.sim.interventions import collect_interventions
    from robo_rl.sim.tasks import TASKS

    s = {**OmegaConf.to_container(cfg.small, resolve=True), **(FULL if cfg.full else {})}
    if cfg.task not in TASKS:
        raise ConfigError(f"demo: task={cfg.task!r} unknown; tasks are {sorted(TASKS)}")
    if min(s["demos"], s["pretrain_steps"], s["finetune_steps"], s["rounds"], s["episodes_per_round"],
           s["eval_episodes"]) < 1:
        raise ConfigError(f"demo: every size must be >= 1, got {s}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    obs_keys = ["obs/qpos", "obs/env_state"]
    policy_opts = OmegaConf.to_container(cfg.policy, resolve=True) or {}

    def evaluate(policy: Any, name: str) -> dict[str, Any]:  # every row on the same seeds, one video each
        return evaluate_with_recoveries(policy, cfg.task, chunking, int(s["eval_episodes"]), int(cfg.n_envs), 100_000,
                                        5, out / f"eval-{name}", videos=1)

    def learner(steps: int, lr: float, warmup: int, **more: Any) -> LearnerConfig:
        return LearnerConfig(steps=steps, batch_size=int(s["batch_size"]), lr=lr, warmup_steps=warmup,
                             checkpoint_every=1000, seed=int(cfg.seed), device=cfg.device, threads=int(cfg.threads),
                             **more)

    # 1. teleop demos through the Recorder
    t = time.perf_counter()
    demos = out / "demos"
    rec = record_demos(cfg.task, demos, int(s["demos"]), int(cfg.seed))
    timings["1 teleop demos"] = time.perf_counter() - t

    # 2. pre-train a flow policy
    t = time.perf_counter()
    lcfg = learner(int(s["pretrain_steps"]), float(s["lr"]), 300)
    policy, sampler, n_demos = policy_for_store(demos, obs_keys, "flow", policy_opts, None, resolve_device(lcfg.device))
    chunking = {"n_action_steps": policy.config.n_action_steps}
    pre_dir = out / "pretrain"
    print(f"2/6 pre-train a flow policy ({sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params) on "
          f"{n_demos} demos, {lcfg.steps} steps")
    Learner(policy, lcfg, pre_dir, lambda bs, g, w: sampler.sample(bs, g, w),
            extra=checkpoint_info(policy, cfg.task, demos, n_demos, obs_keys, chunking)).fit()
    ckpt = read_checkpoint(pre_dir / "checkpoints" / "last.pt")
    timings["2 pre-train"] = time.perf_counter() - t
    t = time.perf_counter()
    print(f"   evaluate the pre-trained policy on {s['eval_episodes']} episodes")
    base = load_policy(ckpt)
    before = evaluate(base, "pretrained")
    timings["2 evaluate pre-trained"] = time.perf_counter() - t

    # 3-4. RaC rounds with the simulated operator; each fine-tunes from the pre-trained checkpoint on
    # the demos plus every intervention so far, and the next round's rollouts use that policy
    ft = learner(int(s["finetune_steps"]), float(s["finetune_lr"]), 100, weighted_sampling=True, loss_weights=False)
    composition = CompositionConfig(**(OmegaConf.to_container(cfg.composition, resolve=True) or {}))
    policy_now, total_samples, rounds = base, 0, []
    for r in range(1, int(s["rounds"]) + 1):
        t = time.perf_counter()
        print(f"3/6 RaC round {r}: {s['episodes_per_round']} rollouts with the simulated operator watching")
        st = collect_interventions(predictor(policy_now), cfg.task, obs_keys, base.config.n_obs, base.config.horizon,
                                   ChunkingConfig(**chunking), out / "interventions", int(s["episodes_per_round"]),
                                   seed=200_000 + 100 * r, mode="rac", n_envs=int(cfg.n_envs))
        total_samples += st.operator_samples
        timings[f"3 RaC rollouts, round {r}"] = time.perf_counter() - t
        t = time.perf_counter()
        print(f"4/6 fine-tune round {r}: demos + {st.steps['RECOVERY']} recovery and {st.steps['CORRECTION']} correction "
              f"steps from {st.interventions} interventions, {ft.steps} steps")
        policy_now, _ = finetune(ckpt, [(demos, None)], [out / "interventions"], composition, ft, out / f"rac-round{r}")
        timings[f"4 fine-tune, round {r}"] = time.perf_counter() - t
        rounds.append({"round": r, "collect": st.to_dict(), "operator_samples": total_samples})

    # 5. the control: the same fine-tuning from the same checkpoint on the demos alone. What it
    # gains over the pre-trained policy is the extra training; what RaC gains over it is the data's.
    t = time.perf_counter()
    print(f"5/6 control: fine-tune on the demos alone, no new data, {ft.steps} steps")
    control, _ = finetune(ckpt, [(demos, None)], [], composition, ft, out / "control")
    timings["5 fine-tune, control"] = time.perf_counter() - t

    # 6. evaluate both on the same seeds as the pre-trained policy
    t = time.perf_counter()
    print(f"6/6 evaluate after RaC and the control on the same {s['eval_episodes']} episodes")
    after = evaluate(policy_now, "after-rac")
    timings["6 evaluate after RaC"] = time.perf_counter() - t
    t = time.perf_counter()
    ctrl = evaluate(control, "control")
    timings["6 evaluate control"] = time.perf_counter() - t
    rows = {"pre-trained": before, "control (no new data)": ctrl, "after RaC": after}
    plot = write_rows_plot(rows, cfg.task, out / "before_after.png")
    verdict = gain_verdict(before, ctrl, after)
    result = {"task": cfg.task, "sizes": s, "policy": policy_opts, "recording": rec, "before": before, "control": ctrl,
              "after": after, "verdict": verdict, "rounds": rounds, "operator_samples": total_samples,
              "timings_s": timings, "wall_s": time.perf_counter() - t_start}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print_rows(rows, cfg.task, int(s["eval_episodes"]), total_samples)
    print(verdict["line"])
    print_table("time", ["step", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()] +
                [["total", f"{time.perf_counter() - t_start:.0f}"]])
    videos = [v for d in rows.values() for v in d["videos"][:1]]
    print(f"\nresults: {out / 'results.json'}   plot: {plot}   videos: {', '.join(videos) or 'none'}")
    return 0


def gain_verdict(before: dict[str, Any], control: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """After RaC against the pre-trained policy and against the control, in points, and whether
    the 95% Wilson intervals are apart (after's low end above the other's high end)."""
    def vs(other: dict[str, Any]) -> dict[str, Any]:
        return {"points": 100 * (after["success_rate"] - other["success_rate"]),
                "intervals_apart": after["ci95_low"] > other["ci95_high"]}

    v = {"vs_pretrained": vs(before), "vs_control": vs(control),
         "control_vs_pretrained_points": 100 * (control["success_rate"] - before["success_rate"])}
    v["line"] = (f"after RaC vs pre-trained: {v['vs_pretrained']['points']:+.0f} points "
                 f"(intervals {'apart' if v['vs_pretrained']['intervals_apart'] else 'overlap'}); "
                 f"vs control: {v['vs_control']['points']:+.0f} points "
                 f"(intervals {'apart' if v['vs_control']['intervals_apart'] else 'overlap'}); "
                 f"control vs pre-trained: {v['control_vs_pretrained_points']:+.0f} points")
    return v


def print_rows(rows: dict[str, dict[str, Any]], task: str, episodes: int, samples: int) -> None:
    first = next(iter(rows.values()))
    header = ["", *rows]
    table = [["success (95% Wilson)", *(f"{d['success_rate']:.0%} [{d['ci95_low']:.0%}, {d['ci95_high']:.0%}]"
                                         for d in rows.values())]]
    table += [[f"reached {k}", *(f"{d['stage_reach'][k]:.0%}" for d in rows.values())] for k in first["stage_reach"]]
    table += [["recovery manoeuvres / episode", *(f"{d['mean_recoveries']:.2f}" for d in rows.values())],
              ["mean episode length", *(f"{d['mean_length']:.0f}" for d in rows.values())]]
    print_table(f"{task}: pre-trained, control and after RaC ({episodes} eval episodes each, same seeds; "
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
