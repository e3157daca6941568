"""robo-rl demo (make demo): the whole story on the long-horizon task, on a laptop CPU.

1. teleop: the scripted expert (the twin's stand-in for a human on leader arms) records demos of
   PackCube through the background Recorder;
2. pre-train a flow action-chunk policy on them and evaluate it in the twin;
3. RaC: the policy drives, the simulated operator takes over when failure looks imminent
   (recovery, then correction, then the episode ends); every step is labelled;
4. fine-tune from the pre-trained checkpoint on demos + recovery and correction data;
5. evaluate again: a before/after table, a plot and a rollout video under `out`.

`full=true` swaps in paper-scale settings meant for a GPU. The numbers behind the README's RaC
results come from `robo-rl rac` at full size; this is the story end to end in minutes.
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
        bar = tqdm(total=episodes, desc=f"1/5 teleop {task} (scripted expert)", unit="ep")
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
    from robo_rl.cli.eval import predictor
    from robo_rl.cli.rac import evaluate
    from robo_rl.cli.train import policy_for_store
    from robo_rl.learn import Learner, LearnerConfig
    from robo_rl.learn.learner import resolve_device
    from robo_rl.policies import checkpoint_info, load_policy, read_checkpoint
    from robo_rl.rac.finetune import finetune
    from robo_rl.rac.mixing import CompositionConfig
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.interventions import collect_interventions
    from robo_rl.sim.tasks import TASKS

    s = {**OmegaConf.to_container(cfg.small, resolve=True), **(FULL if cfg.full else {})}
    if cfg.task not in TASKS:
        raise ConfigError(f"demo: task={cfg.task!r} unknown; tasks are {sorted(TASKS)}")
    if min(s["demos"], s["pretrain_steps"], s["rounds"], s["episodes_per_round"], s["eval_episodes"]) < 1:
        raise ConfigError(f"demo: every size must be >= 1, got {s}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    eval_cfg = OmegaConf.create({"eval": {"episodes": s["eval_episodes"], "n_envs": cfg.n_envs, "seed": 100_000,
                                          "max_recoveries": 5}})
    obs_keys = ["obs/qpos", "obs/env_state"]

    # 1. teleop demos through the Recorder
    t = time.perf_counter()
    demos = out / "demos"
    rec = record_demos(cfg.task, demos, int(s["demos"]), int(cfg.seed))
    timings["1 teleop demos"] = time.perf_counter() - t

    # 2. pre-train a flow policy
    t = time.perf_counter()
    lcfg = LearnerConfig(steps=int(s["pretrain_steps"]), batch_size=int(s["batch_size"]), lr=3e-4, warmup_steps=300,
                         checkpoint_every=1000, seed=int(cfg.seed), device=cfg.device, threads=int(cfg.threads))
    policy, sampler, n_demos = policy_for_store(demos, obs_keys, "flow", {}, None, resolve_device(lcfg.device))
    chunking = {"n_action_steps": policy.config.n_action_steps}
    pre_dir = out / "pretrain"
    print(f"2/5 pre-train a flow policy ({sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params) on "
          f"{n_demos} demos, {lcfg.steps} steps")
    Learner(policy, lcfg, pre_dir, lambda bs, g, w: sampler.sample(bs, g, w),
            extra=checkpoint_info(policy, cfg.task, demos, n_demos, obs_keys, chunking)).fit()
    ckpt = read_checkpoint(pre_dir / "checkpoints" / "last.pt")
    timings["2 pre-train"] = time.perf_counter() - t
    t = time.perf_counter()
    print(f"   evaluate the pre-trained policy on {s['eval_episodes']} episodes")
    base = load_policy(ckpt)
    before = evaluate(base, cfg.task, chunking, eval_cfg, out / "eval-before", videos=1)
    timings["2 evaluate"] = time.perf_counter() - t

    # 3-4. RaC rounds with the simulated operator, each fine-tuning from the pre-trained checkpoint
    policy_now, total_samples, rounds = base, 0, []
    for r in range(1, int(s["rounds"]) + 1):
        t = time.perf_counter()
        st = collect_interventions(predictor(policy_now), cfg.task, obs_keys, base.config.n_obs, base.config.horizon,
                                   ChunkingConfig(**chunking), out / "interventions", int(s["episodes_per_round"]),
                                   seed=200_000 + 100 * r, mode="rac", n_envs=int(cfg.n_envs))
        total_samples += st.operator_samples
        timings[f"3 RaC rollouts, round {r}"] = time.perf_counter() - t
        t = time.perf_counter()
        ft = LearnerConfig(steps=int(s["finetune_steps"]), batch_size=int(s["batch_size"]), lr=1e-4, warmup_steps=100,
                           weighted_sampling=True, loss_weights=False, checkpoint_every=1000, seed=int(cfg.seed),
                           device=cfg.device, threads=int(cfg.threads))
        print(f"4/5 fine-tune round {r}: demos + {st.steps['RECOVERY']} recovery and {st.steps['CORRECTION']} correction "
              f"steps from {st.interventions} interventions, {ft.steps} steps")
        policy_now, _ = finetune(ckpt, [(demos, None)], [out / "interventions"], CompositionConfig(mode="rac"), ft,
                                 out / f"rac-round{r}")
        timings[f"4 fine-tune, round {r}"] = time.perf_counter() - t
        rounds.append({"round": r, "collect": st.to_dict(), "operator_samples": total_samples})

    # 5. evaluate again
    t = time.perf_counter()
    after = evaluate(policy_now, cfg.task, chunking, eval_cfg, out / "eval-after", videos=1)
    timings["5 evaluate"] = time.perf_counter() - t
    plot = write_before_after_plot(before, after, cfg.task, out / "before_after.png")
    result = {"task": cfg.task, "sizes": s, "recording": rec, "before": before, "after": after, "rounds": rounds,
              "timings_s": timings, "wall_s": time.perf_counter() - t_start}
    (out / "results.json").write_text(json.dumps(result, indent=1))

    def pct(d: dict, key: str) -> str:
        return f"{d[key]:.0%}"

    rows = [["success (95% Wilson)", f"{before['success_rate']:.0%} [{before['ci95_low']:.0%}, {before['ci95_high']:.0%}]",
             f"{after['success_rate']:.0%} [{after['ci95_low']:.0%}, {after['ci95_high']:.0%}]"]]
    rows += [[f"reached {k}", pct(before["stage_reach"], k), pct(after["stage_reach"], k)] for k in before["stage_reach"]]
    rows += [["recovery manoeuvres / episode", f"{before['mean_recoveries']:.2f}", f"{after['mean_recoveries']:.2f}"],
             ["mean episode length", f"{before['mean_length']:.0f}", f"{after['mean_length']:.0f}"]]
    print_table(f"{cfg.task}: before and after RaC ({s['eval_episodes']} eval episodes each, "
                f"{total_samples:,} operator samples)", ["", "pre-trained", "after RaC"], rows)
    print_table("time", ["step", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()] +
                [["total", f"{time.perf_counter() - t_start:.0f}"]])
    video = (after["videos"] or before["videos"] or [None])[0]
    print(f"\nresults: {out / 'results.json'}   plot: {plot}   video: {video}")
    return 0


def write_before_after_plot(before: dict[str, Any], after: dict[str, Any], task: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(before["stage_reach"]) + ["success"]
    b = [before["stage_reach"][k] for k in names[:-1]] + [before["success_rate"]]
    a = [after["stage_reach"][k] for k in names[:-1]] + [after["success_rate"]]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.2, b, 0.4, label="pre-trained")
    ax.bar(x + 0.2, a, 0.4, label="after RaC")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("share of eval episodes")
    ax.set_ylim(0, 1)
    ax.set_title(f"{task}: stage reach and success, before and after RaC")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
