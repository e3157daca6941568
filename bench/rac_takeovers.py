"""What RaC's and HG-DAgger's operators take over for: one round of each on the same
policy and seeds, its takeovers counted by kind.

`robo-rl rac` at the CPU demo's sizes found RaC and HG-DAgger level in every round. The named
cause was that on PackCube without its lid nearly every takeover is the same failure, the cube
slipping from the hand, so both operators spend their samples on the same re-grasp and RaC's
END (the episode stops at the correction, sparing the operator the policy's later mistakes) has
nothing to spare. This counts it: each takeover by what triggered it and the stage it happened
in, the operator samples each kind cost, and how many takeovers come after HG-DAgger handed
control back (the ones RaC never sees).

    python bench/rac_takeovers.py --checkpoint data/demo/pretrain/checkpoints/last.pt [--episodes 120]

Rows: per method, the round's totals; then per method and trigger, takeovers and operator samples.
"""

from __future__ import annotations

import argparse
import re
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402

from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.policies import load_policy, read_checkpoint  # noqa: E402
from robo_rl.policies.inference import predictor  # noqa: E402
from robo_rl.runtime.chunking import ChunkingConfig  # noqa: E402
from robo_rl.sim.evaluate import seeded_noise  # noqa: E402
from robo_rl.sim.interventions import collect_interventions  # noqa: E402

METHODS = {"rac": "RaC", "hg_dagger": "HG-DAgger"}


def kind(reason: str) -> str:
    """A takeover's trigger with the stages it names ('stage regressed from cube_lifted to start' is
    a slipped cube; 'no progress in cube_in_box' a stall before the latch), its timings dropped."""
    return re.sub(r" for [0-9.]+ s$", "", re.sub(r"^[0-9.]+ s left", "time left", reason)) or "operator"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--episodes", type=int, default=120)
    p.add_argument("--n-envs", type=int, default=10)
    p.add_argument("--seed", type=int, default=200_100, help="the first rollout's seed (the demo's round 1)")
    args = p.parse_args()
    ckpt = read_checkpoint(Path(args.checkpoint))
    policy = load_policy(ckpt)
    task = ckpt["task"]
    chunking = ChunkingConfig(**dict(ckpt.get("chunking") or {}))
    predict = predictor(policy)
    totals, kinds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            t0 = time.perf_counter()
            with seeded_noise(args.seed):  # both methods draw the same policy noise
                stats = collect_interventions(predict, task, list(ckpt["obs_keys"]), policy.config.n_obs,
                                              policy.config.horizon, chunking, Path(tmp) / method, args.episodes,
                                              args.seed, mode=method, n_envs=args.n_envs, progress=False)
            wall = time.perf_counter() - t0
            store = EpisodeStore.open(Path(tmp) / method)
            count, later, samples = Counter(), Counter(), Counter()
            per_episode = Counter()
            for meta in store.metas:
                recs = meta.extra.get("interventions", [])
                per_episode[min(len(recs), 3)] += 1
                for i, r in enumerate(recs):
                    k = kind(r["reason"])
                    count[k] += 1
                    later[k] += i > 0  # after the first in its episode: HG-DAgger's, once it handed back
                    samples[k] += int(r["recovery_steps"]) + int(r["correction_steps"])
            store.close()
            totals[method] = (stats, wall, sum(later.values()), per_episode)
            kinds[method] = (count, later, samples)
    console = make_console()
    t = table(f"one round of {args.episodes} rollouts per method, same policy and seeds ({task}), {cpu_kind()}",
              ["method", "takeovers", "episodes with 0/1/2/3+", "later takeovers", "operator samples",
               "recovery samples", "operator minutes (whole episodes)", "wall s"])
    for method, (st, wall, later, per_episode) in totals.items():
        t.add_row(METHODS[method], str(st.interventions), "/".join(str(per_episode[k]) for k in range(4)), str(later),
                  f"{st.operator_samples:,}", f"{st.steps['RECOVERY']:,}", f"{st.operator_time_s / 60:.1f}", f"{wall:.0f}")
    console.print(t)
    t = table("takeovers by trigger", ["method", "trigger", "takeovers", "share", "later in their episode",
                                       "operator samples", "share"])
    for method, (count, later, samples) in kinds.items():
        n, s = max(sum(count.values()), 1), max(sum(samples.values()), 1)
        for k, c in count.most_common():
            t.add_row(METHODS[method], k, str(c), f"{c / n:.0%}", str(later[k]), f"{samples[k]:,}", f"{samples[k] / s:.0%}")
    console.print(t)


if __name__ == "__main__":
    main()
