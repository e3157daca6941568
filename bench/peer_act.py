"""A peer in the same run: LeRobot's ACT beside our camera policy, at the same CPU minutes.

    python bench/peer_act.py --minutes 15 30 --tasks transfer_cube insertion [--parallel 2]
    python bench/peer_act.py --table                  # the table of runs already made

- LeRobot: the newest 0.4.x, in a venv of its own (`--venv`, default data/peer/venv), made here with
  pip if missing (it pulls LeRobot's own torch, several GB). It is never a dependency of robo_rl:
  ACT runs in bench/peer_act_worker.py under that venv's python.
- Data: the same 50 demos as bench/camera_curve.py (`data/demos/<task>_cams`), exported with
  `robo-rl dataset export-lerobot` (LeRobot's default AV1 video) to `data/peer/<task>_lerobot`.
- Training: ACT with LeRobot's defaults, one run per task for the largest budget; its learning rate
  is constant, so the checkpoint at M minutes is the M-minute point. No ImageNet weights can be
  downloaded here: the ResNet-18 starts from scratch (said beside every number).
- Evaluation: in our twin, on the seeds our evaluation uses (100000, 100001, ...), through a small
  adapter: a `predict(window) -> chunks` function that sends the frames and joints to the worker
  (`serve`) and gets ACT's un-normalised 100-step chunks back; our episode loop runs them two ways:
  as LeRobot does by default (all 100 actions of a chunk, then a new one) and with ACT's temporal
  ensembling (a chunk every step, weights exp(-0.01 i), the oldest first).
- Ours: the rows of bench/camera_curve.py under `--ours` (data/runs/curve), same demos, seeds, machine.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from camera_curve import CAMERAS, curve_arguments, demos_for, plot, robo_rl, run_row  # noqa: E402
from common import cpu_kind, make_console, table  # noqa: E402

WORKER = Path(__file__).resolve().parent / "peer_act_worker.py"
OBS_KEYS = CAMERAS.strip("[]").split(",")  # obs/qpos and the three cameras, as our curve's policy reads them
LEROBOT = "lerobot>=0.4,<0.5"
EXECUTIONS = {"chunk100": "LeRobot's default: 100 actions, then a new chunk",
              "ensemble": "ACT's temporal ensembling: a chunk every step, exp(-0.01 i)"}


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        return python
    print(f"making LeRobot's venv at {venv} ({LEROBOT}; it installs its own torch, several GB)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", LEROBOT], check=True)
    return python


def exported(task: str) -> Path:
    return Path("data/peer") / f"{task}_lerobot"


def export_for(task: str, demos: int) -> Path:
    out = exported(task)
    if not (out / "meta" / "info.json").is_file():
        print(f"exporting {task}'s demos to {out} (robo-rl dataset export-lerobot)")
        if robo_rl("dataset", "export-lerobot", str(demos_for(task, demos)), str(out)).wait() != 0:
            raise SystemExit(f"export-lerobot failed for {task}")
    return out


class ActServer:
    """The adapter: our evaluation's `predict(window) -> (B, 100, 14)`, answered by ACT in its venv."""

    def __init__(self, python: Path, data: Path, checkpoint: Path, threads: int):
        self.proc = subprocess.Popen([str(python), str(WORKER), "serve", "--data", str(data), "--checkpoint",
                                      str(checkpoint), "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self._read() != b"ready":
            raise SystemExit(f"ACT's server did not start for {checkpoint}")

    def _read(self) -> bytes:
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            raise SystemExit("ACT's server stopped (its error is above)")
        return self.proc.stdout.read(struct.unpack("<Q", head)[0])

    def __call__(self, window) -> np.ndarray:
        obs = {"observation.state": np.ascontiguousarray(window["obs/qpos"][:, -1], dtype=np.float32)}
        for key in OBS_KEYS[1:]:
            obs["observation.images." + key.rsplit("/", 1)[1]] = np.ascontiguousarray(window[key][:, -1])
        buf = io.BytesIO()
        np.savez(buf, **obs)
        self.proc.stdin.write(struct.pack("<Q", buf.getbuffer().nbytes) + buf.getvalue())
        self.proc.stdin.flush()
        return np.load(io.BytesIO(self._read()))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def evaluate_one(python: Path, task: str, checkpoint: Path, execution: str, episodes: int, threads: int) -> dict:
    """One checkpoint, one execution, in our twin; the row is also written next to the checkpoint."""
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.rollout import evaluate_policy

    chunking = (ChunkingConfig(mode="receding", n_action_steps=100) if execution == "chunk100"
                else ChunkingConfig(mode="ensemble", query_every=1, ensemble_decay=0.01))
    server = ActServer(python, exported(task), checkpoint, threads)
    try:
        summary = evaluate_policy(server, task, OBS_KEYS, n_obs=1, horizon=100, chunking=chunking,
                                  episodes=episodes, n_envs=10, seed=100_000, image_size=(96, 96))
    finally:
        server.close()
    lo, hi = summary.interval
    reach = summary.stage_reach()
    row = {"task": task, "checkpoint": str(checkpoint), "execution": execution, "episodes": summary.n,
           "success": summary.success_rate, "ci95": [round(lo, 3), round(hi, 3)],
           "lifted": reach.get("lifted_by_right", reach.get("both_lifted")),
           **json.loads((checkpoint / "trained.json").read_text())}
    (checkpoint / f"eval-{execution}.json").write_text(json.dumps(row, indent=1))
    return row


def act_rows(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("*/*min/eval-*.json")):
        row = json.loads(path.read_text())
        row["budget_min"] = float(path.parent.name.removesuffix("min"))
        rows.append(row)
    return rows


def main() -> None:
    ap = curve_arguments(__doc__)
    ap.add_argument("--executions", nargs="+", default=list(EXECUTIONS), choices=list(EXECUTIONS),
                    help="; ".join(f"{k}: {v}" for k, v in EXECUTIONS.items()))
    ap.add_argument("--venv", type=Path, default=Path("data/peer/venv"))
    ap.add_argument("--out", type=Path, default=Path("data/runs/peer_act"))
    ap.add_argument("--ours", type=Path, default=Path("data/runs/curve"), help="bench/camera_curve.py's runs")
    ap.add_argument("--table", action="store_true", help="only tabulate the runs already made")
    ap.add_argument("--eval-one", nargs=3, metavar=("TASK", "CHECKPOINT", "EXECUTION"), help="(internal) evaluate one checkpoint")
    args = ap.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    threads = max(1, (os.cpu_count() or 2) // args.parallel)
    if args.eval_one:
        task, ckpt, execution = args.eval_one
        evaluate_one(ensure_venv(args.venv), task, Path(ckpt), execution, args.episodes, threads)
        return
    if not args.table:
        python = ensure_venv(args.venv)
        data = {task: export_for(task, args.demos) for task in args.tasks}
        todo = [t for t in args.tasks if not all((args.out / t / f"{m:g}min").is_dir() for m in args.minutes)]
        for start in range(0, len(todo), args.parallel):
            procs = []
            for task in todo[start:start + args.parallel]:
                print(f"training ACT on {task} for {max(args.minutes):g} min ({threads} thread(s)), checkpoints at "
                      f"{', '.join(f'{m:g}' for m in sorted(args.minutes))} min -> {args.out / task}")
                (args.out / task).mkdir(parents=True, exist_ok=True)
                log = open(args.out / f"{task}.log", "a")
                procs.append(subprocess.Popen([str(python), str(WORKER), "train", "--data", str(data[task]), "--out",
                                               str(args.out / task), "--threads", str(threads), "--minutes",
                                               *[f"{m:g}" for m in args.minutes]], stdout=log, stderr=subprocess.STDOUT))
            if any(p.wait() for p in procs):
                raise SystemExit(f"ACT's training failed: see {args.out}/<task>.log")
        evals = [(t, args.out / t / f"{m:g}min", e) for t in args.tasks for m in args.minutes for e in args.executions
                 if not (args.out / t / f"{m:g}min" / f"eval-{e}.json").is_file()]
        for start in range(0, len(evals), args.parallel):
            procs = [subprocess.Popen([sys.executable, __file__, "--eval-one", t, str(c), e, "--episodes",
                                       str(args.episodes), "--parallel", str(args.parallel), "--venv", str(args.venv)])
                     for t, c, e in evals[start:start + args.parallel]]
            for p in procs:
                p.wait()
    cpu = cpu_kind()
    ours_all = [r for r in (run_row(p) for p in sorted(args.ours.glob("*min*")) if p.is_dir()) if r]
    ours = {(r["task"], r["budget_min"]): r for r in ours_all if r["seed"] == 0}
    t = table(f"camera policies, 50 demos, 100 unseen seeds: ours against LeRobot's ACT (backbone from scratch), {cpu}",
              ["task", "minutes", "ours [95%] (steps)", "ACT, 100-action chunks [95%] (steps)",
               "ACT, temporal ensembling [95%]"])
    act = {(r["task"], r["budget_min"], r["execution"]): r for r in act_rows(args.out)}
    fmt = lambda r, steps=True: "-" if r is None else (f"{r['success']:.0%} [{r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]"
                                                       + (f" ({r['steps']})" if steps else ""))
    keys = sorted({(task, m) for task, m, _ in act} | set(ours))
    for task, m in keys:
        t.add_row(task, f"{m:g}", fmt(ours.get((task, m))), fmt(act.get((task, m, "chunk100"))),
                  fmt(act.get((task, m, "ensemble")), steps=False))
    make_console().print(t)
    if ours_all:
        plot(ours_all, args.out / "peer.png", cpu, [r for r in act.values() if r["execution"] == "chunk100"],
             "LeRobot's ACT, backbone from scratch")
        print(f"plot: {args.out / 'peer.png'}")
    (args.out / "peer.json").write_text(json.dumps({"cpu": cpu, "ours": list(ours.values()),
                                                    "act": list(act.values())}, indent=1))


if __name__ == "__main__":
    main()
