"""Camera policies: success against CPU minutes, the curve a user plans with.

For each task and each budget, `robo-rl train` is run exactly as the README's camera command
(cameras + `obs/qpos`, the camera recipe picked by itself) with `learner.max_minutes=M`, so the
cosine schedule ends at the steps that fit in M minutes; the run's own evaluation (100 unseen
seeds by default) gives the row. The state policy's rows (the same tasks from object poses, 99%
and 98% in 20 minutes) are docs/results.md's and not rerun here.

    python bench/camera_curve.py --minutes 15 30 --tasks transfer_cube insertion [--parallel 2] [--seeds 0 1]
    python bench/camera_curve.py --table data/runs/curve      # the table and PNG of runs already made

Demos: `data/demos/<task>_cams` (50 scripted episodes, three cameras at 96x96), recorded first if
missing. `--parallel 2` trains two runs at once, one thread each (the 2-core machine shared);
`--parallel 1` gives one run both cores. `--randomize-room` trains on demos recorded with a new room per
episode (`data/demos/<task>_cams_rooms`, `collect randomize_room=true`); `--set KEY=VALUE ...` adds train
overrides to every run (e.g. one augmentation's row). `--seeds 0 1` trains each point once per training seed
(`learner.seed`; the evaluation seeds stay 100000+): the run-to-run spread. Writes <out>/curve.png
and <out>/curve.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_kind, make_console, table  # noqa: E402

CAMERAS = "[obs/qpos,obs/images/top,obs/images/left_wrist,obs/images/right_wrist]"


def robo_rl(*args: str, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", *args], stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})


def demos_for(task: str, episodes: int, randomize_room: bool = False) -> Path:
    """The task's camera demos, recorded first if missing; `randomize_room`: a new room per episode."""
    path = Path("data/demos") / f"{task}_cams{'_rooms' if randomize_room else ''}"
    if not path.exists():
        print(f"recording {episodes} demos of {task} with three cameras at 96x96 -> {path}")
        if robo_rl("collect", f"task={task}", f"episodes={episodes}", "cameras=[top,left_wrist,right_wrist]",
                   "image_size=[96,96]", f"randomize_room={str(randomize_room).lower()}", f"out={path}").wait() != 0:
            raise SystemExit(f"collect failed for {task}")
    return path


def run_row(run: Path) -> dict | None:
    """A finished run's row: its last evaluation, steps and training minutes."""
    evals = run / "evals.jsonl"
    if not evals.is_file():
        return None
    ev = json.loads(evals.read_text().splitlines()[-1])
    cfg = OmegaConf.load(run / "config.yaml")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    task, minutes, threads, seed = cfg.task, float(cfg.learner.max_minutes), int(cfg.learner.threads), int(cfg.learner.seed)
    return {"run": str(run), "task": task, "budget_min": minutes, "threads": threads, "seed": seed, "steps": ev["step"],
            "train_min": round(metrics[-1]["time_s"] / 60, 1) if metrics else None, "success": ev["success_rate"],
            "ci95": [round(ev["ci95_low"], 3), round(ev["ci95_high"], 3)],
            "lifted": ev.get("reach_lifted_by_right", ev.get("reach_both_lifted"))}


def plot(rows: list[dict], path: Path, cpu: str, peer: list[dict] | None = None, peer_name: str = "") -> None:
    """Success against minutes, a colour per task; `peer` (bench/peer_act.py's rows) dashed in the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for task in sorted({r["task"] for r in rows}):
        pts = sorted((r["budget_min"], r["success"] * 100, r["ci95"][0] * 100, r["ci95"][1] * 100) for r in rows if r["task"] == task)
        x, y, lo, hi = zip(*pts)
        bars = ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]], marker="o",
                           capsize=3, linestyle="none", label=f"{task} (a point per training seed)")
        budgets = sorted(set(x))  # the line joins each budget's mean over seeds
        ax.plot(budgets, [np.mean([b for a, b in zip(x, y) if a == m]) for m in budgets], color=bars[0].get_color())
        theirs = sorted((r["budget_min"], r["success"] * 100) for r in peer or [] if r["task"] == task)
        if theirs:
            ax.plot(*zip(*theirs), marker="s", linestyle="--", fillstyle="none", color=bars[0].get_color(),
                    label=f"{task}: {peer_name}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["budget_min"] for r in rows}), [f"{m:g}" for m in sorted({r["budget_min"] for r in rows})])
    threads = sorted({r["threads"] for r in rows})
    ax.set_xlabel(f"training minutes ({'/'.join(map(str, threads))} CPU thread(s) per run)")
    ax.set_ylabel("success, 100 unseen seeds (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"camera policies, 50 demos\n{cpu}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def curve_arguments(description: str) -> argparse.ArgumentParser:
    """The options every point of the curve is defined by (this bench and bench/peer_act.py)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["transfer_cube", "insertion"])
    ap.add_argument("--minutes", nargs="+", type=float, default=[15, 30, 60, 120])
    ap.add_argument("--demos", type=int, default=50)
    ap.add_argument("--episodes", type=int, default=100, help="evaluation episodes per row")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (each gets cores / parallel threads)")
    return ap


def main() -> None:
    ap = curve_arguments(__doc__)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds (learner.seed) per point")
    ap.add_argument("--steps", type=int, default=None,
                    help="learner.steps, the schedule's cap (default: none, the steps that fit in the minutes)")
    ap.add_argument("--randomize-room", action="store_true",
                    help="train on demos recorded with a new room per episode (data/demos/<task>_cams_rooms)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="more train overrides for every run, e.g. policy.color_jitter=[0.4,0,0,0]")
    ap.add_argument("--out", type=Path, default=Path("data/runs/curve"))
    ap.add_argument("--table", type=Path, default=None, help="only tabulate the runs under this folder")
    args = ap.parse_args()
    cpu = cpu_kind()
    out = args.table or args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.table is None:
        jobs = [(t, m, seed) for seed in args.seeds for m in args.minutes for t in args.tasks]
        threads = max(1, (os.cpu_count() or 2) // args.parallel)
        while jobs:
            batch, jobs = jobs[: args.parallel], jobs[args.parallel:]
            procs = []
            for task, minutes, seed in batch:
                run = out / f"{task}-{minutes:g}min{f'-seed{seed}' if seed else ''}"
                if (run / "evals.jsonl").is_file():
                    continue
                print(f"training {task} for {minutes:g} min ({threads} thread(s)) -> {run}")
                procs.append(robo_rl("train", "policy=flow", f"task={task}", f"dataset={demos_for(task, args.demos, args.randomize_room)}",
                                     f"obs_keys={CAMERAS}", f"learner.max_minutes={minutes:g}", f"learner.threads={threads}",
                                     f"eval.episodes={args.episodes}", "eval.videos=0", f"run_dir={run}",
                                     f"learner.seed={seed}",
                                     *([f"learner.steps={args.steps}"] if args.steps else []), *args.set,
                                     log=run.with_suffix(".log")))
            for p in procs:
                p.wait()
    rows = [r for r in (run_row(p) for p in sorted(out.iterdir()) if p.is_dir()) if r and r["budget_min"] > 0]
    rows.sort(key=lambda r: (r["task"], r["budget_min"], r["seed"]))
    t = table(f"camera policies: success against training minutes ({cpu})",
              ["task", "minutes", "threads", "seed", "steps", "success [95%]", "lifted"])
    for r in rows:
        t.add_row(r["task"], f"{r['budget_min']:g}", str(r["threads"]), str(r["seed"]), str(r["steps"]),
                  f"{r['success']:.0%} [{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]", f"{r['lifted']:.0%}" if r["lifted"] is not None else "-")
    make_console().print(t)
    if rows:
        plot(rows, out / "curve.png", cpu)
        (out / "curve.json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))
        print(f"plot: {out / 'curve.png'}")


if __name__ == "__main__":
    main()
