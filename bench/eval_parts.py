"""The demo's evaluation in one process against two: the same checkpoint, episodes and
parts (each part its own noise seed, one torch thread), timed in the same run.

`robo-rl demo processes=2` (the default) runs the second half of each evaluation in a spawned
process beside the first, and the pre-trained policy's evaluation beside RaC's first round. This
times an evaluation both ways and checks that the two give the same episodes.

    python bench/eval_parts.py --checkpoint data/demo/rac-round1/checkpoints/last.pt [--episodes 40]

Rows: one process (both parts in turn), two processes (the demo's way), with wall time, the
ratio to the first row and success; then whether every episode matched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402

from robo_rl.policies import load_policy, read_checkpoint  # noqa: E402
from robo_rl.sim.evaluate import evaluate_with_recoveries  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--n-envs", type=int, default=10)
    args = p.parse_args()
    ckpt = read_checkpoint(Path(args.checkpoint))
    policy = load_policy(ckpt)
    chunking = ckpt.get("chunking") or {"n_action_steps": policy.config.n_action_steps}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, beside in (("one process (both parts in turn)", None),
                             ("two processes (demo processes=2)", (Path(args.checkpoint), "cpu"))):
            t0 = time.perf_counter()
            row = evaluate_with_recoveries(policy, ckpt["task"], chunking, args.episodes, args.n_envs, 100_000, 5,
                                           Path(tmp) / name[:3], shards=2, beside=beside, progress=False)
            episodes = json.loads((Path(tmp) / name[:3] / "eval.json").read_text())["per_episode"]
            rows[name] = (time.perf_counter() - t0, row["success_rate"], episodes)
    base = next(iter(rows.values()))[0]
    t = table(f"evaluation of {args.episodes} episodes ({ckpt['task']}, {args.n_envs} envs per part), {cpu_kind()}",
              ["how", "wall s", "vs one process", "success"])
    for name, (wall, success, _) in rows.items():
        t.add_row(name, f"{wall:.1f}", f"{base / wall:.2f}x", f"{success:.0%}")
    console = make_console()
    console.print(t)
    same = [r[2] for r in rows.values()]
    console.print(f"every episode the same both ways: {same[0] == same[1]}")


if __name__ == "__main__":
    main()
