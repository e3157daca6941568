"""The episode loop's overhead in the twin: evaluation and intervention collection against plain
env stepping, measured in the same run.

Every closed-loop episode goes through one loop (robo_rl/runtime/episodes.py). In the twin it
steps several envs in lockstep with one batched policy call per tick; what it adds over a bare
`env.step` loop (windows, chunk schedule, episode bookkeeping, the stage and success checks,
the store writes of intervention collection) is what this measures. The policy is a cheap
numpy function (hold the current joints, plus a slow sweep), so the physics and the loop are all
there is to time.

    python bench/episodes.py [--task transfer_cube] [--episodes 20] [--n-envs 10] [--max-steps 200]

Rows: baseline (n envs stepped by `env.step` in a Python loop, the same actions, no policy
windows), `evaluate_policy`, `collect_interventions` (simulated operator; episodes written to a
temporary zarr store). Columns: env steps per second over all envs and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402

from robo_rl.runtime.chunking import ChunkingConfig  # noqa: E402
from robo_rl.sim.envs import BimanualEnv  # noqa: E402
from robo_rl.sim.interventions import collect_interventions  # noqa: E402
from robo_rl.sim.rollout import evaluate_policy  # noqa: E402

HORIZON = 16
KEYS = ["obs/qpos", "obs/env_state"]


def sweep_policy(batch):
    """Hold the newest joints with a slow sinusoidal sweep on top: a chunk per env, no network."""
    q = batch["obs/qpos"][:, -1]  # (B, A)
    t = np.arange(HORIZON, dtype=np.float32)[None, :, None]
    return q[:, None, :] + 0.05 * np.sin(0.2 * t + np.arange(q.shape[1])[None, None, :])


def plain_steps(task: str, n_envs: int, episodes: int, max_steps: int) -> tuple[int, float]:
    """The baseline: the same envs and episode count, `env.step` in lockstep, the same actions
    computed per tick from the newest joints (no windows, no chunk schedule, no bookkeeping)."""
    envs = [BimanualEnv(task, obs_mode="state", max_steps=max_steps, disturb=True) for _ in range(n_envs)]
    steps, started = 0, 0
    obs = [None] * n_envs
    t0 = time.perf_counter()
    for i, env in enumerate(envs):
        obs[i], _ = env.reset(seed=started)
        started += 1
    active = list(range(n_envs))
    k = 0
    while active:
        if k % 8 == 0:
            chunks = sweep_policy({"obs/qpos": np.stack([obs[i]["qpos"] for i in active])[:, None]})
        for j, i in enumerate(list(active)):
            o, _, _, truncated, _ = envs[i].step(chunks[min(j, len(chunks) - 1), k % 8].astype(np.float32))
            obs[i], steps = o, steps + 1
            if truncated:
                if started < episodes:
                    obs[i], _ = envs[i].reset(seed=started)
                    started += 1
                else:
                    active.remove(i)
        k += 1
    wall = time.perf_counter() - t0
    for env in envs:
        env.close()
    return steps, wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="transfer_cube")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--n-envs", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=3, help="best of this many runs per row")
    args = p.parse_args(argv)
    console = make_console()
    chunking = ChunkingConfig(n_action_steps=8)
    rows: dict[str, float] = {}

    def best(fn):
        return max(fn() for _ in range(args.reps))

    def baseline() -> float:
        steps, wall = plain_steps(args.task, args.n_envs, args.episodes, args.max_steps)
        return steps / wall

    def evaluation() -> float:
        s = evaluate_policy(sweep_policy, args.task, KEYS, 2, HORIZON, chunking, episodes=args.episodes,
                            n_envs=args.n_envs, seed=0, max_steps=args.max_steps, progress=False, stop_on_success=False)
        return sum(e.length for e in s.episodes) / s.wall_s

    def interventions() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            s = collect_interventions(sweep_policy, args.task, KEYS, 2, HORIZON, chunking, Path(tmp) / "store",
                                      episodes=args.episodes, seed=0, n_envs=args.n_envs, progress=False)
            return sum(s.steps.values()) / s.wall_s

    rows["baseline: env.step in lockstep"] = best(baseline)
    rows["evaluate_policy"] = best(evaluation)
    rows["collect_interventions (store writes)"] = best(interventions)
    t = table(f"episode loop, {args.task}: {args.n_envs} envs, {args.episodes} episodes of <= {args.max_steps} steps "
              f"({cpu_kind()}, best of {args.reps})",
              ["row", "env steps/s", "x baseline"])
    base = rows["baseline: env.step in lockstep"]
    for name, rate in rows.items():
        t.add_row(name, f"{rate:,.0f}", f"{rate / base:.2f}")
    console.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
