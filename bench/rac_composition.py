"""Which part of a RaC round's training data makes the policy better or worse?

One round's intervention store (from `robo-rl rac`, OUT/rac/data/round1) and its pre-trained checkpoint
stay fixed; each variant changes one thing about how the round trains, fine-tunes (or retrains)
from the same checkpoint, and is evaluated on the same seeds. The control (the demos alone,
fine-tuned the same way) runs in the same call, so every row is read against it.

Variants (pick with --variants):
    control             the demos alone (robo-rl rac's no_new_data)
    rac                 the round as robo-rl rac trains it: recovery + correction, half of each batch,
                        no recovery after a dead-end takeover (composition.no_recovery_after)
    rac_successes       rac, plus the policy's own steps in the rollouts it finished with no takeover
    all_recovery        every takeover's recovery trains, the dead ends' letting go included
    corrections         no recovery at all (mode=corrections)
    all_recovery_80     all_recovery with 80% of each batch from the demos: too much weight on the round?
    rac_80              rac with 80% of each batch from the demos: do the round's grasps and lifts dilute the
                        demos' late stages?
    rac_half_recovery   rac with recovery steps at half a correction step's weight (composition.segment_weights):
                        does a smaller share of recoveries keep what they give one policy without what they cost another?
    rac_no_dead_ends    rac without any operator step after a dead-end takeover (composition.no_intervention_after):
                        do its re-grips help or hurt?
    rac_no_stalls       rac without any operator step after a "no progress" takeover (composition.no_intervention_after):
                        do the stall corrections (most of a TransferCube round) help or hurt?
    corrections_no_regrips
                        corrections without the re-grips (after dead ends, regressions and misaligned grasps:
                        the stalls' corrections stay): do the corrections that lift the cube again cost the lift?
    corrections_80      corrections with 80% of each batch from the demos: is it the round's share of the batch?
    corrections_no_regrips_80
                        both: the hand-over corrections alone, at 20% of each batch
    all_recovery_fresh  all_recovery retrained from fresh weights with the pre-training's steps and lr

    python bench/rac_composition.py --checkpoint CKPT --round-data OUT/rac/data/round1 [--variants control,rac,all_recovery]
        [--episodes 50] [--steps 2000] [--seed 0] [--threads 0] [--out data/bench/rac_composition]

--round-data takes several stores, comma-separated (OUT/rac/data/round1,OUT/rac/data/round2): every
round so far, as `robo-rl rac` trains its later rounds. --seed is the fine-tune's training seed
(the evaluation's seeds stay 100000+): two seeds on the same data say how far one fine-tune spreads.

--report trains nothing: it prints where each variant puts the round's weight, by takeover reason
and how the intervention ended (a round whose corrections the time limit cut holds little that
trains, and half of each batch on a few hundred steps replays them again and again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace

import numpy as np
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402

from robo_rl.learn import LearnerConfig, last_checkpoint  # noqa: E402
from robo_rl.learn.recipes import camera_learner  # noqa: E402
from robo_rl.policies import load_policy, read_checkpoint  # noqa: E402
from robo_rl.policies.inference import predictor  # noqa: E402
from robo_rl.rac.finetune import composition_source, finetune  # noqa: E402
from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.errors import RoboRLError  # noqa: E402
from robo_rl.rac.mixing import CompositionConfig, composition_report, composition_weights, intervention_mask  # noqa: E402
from robo_rl.sim.interventions import OPERATOR_LABELS  # noqa: E402
from robo_rl.sim.evaluate import evaluate_with_recoveries  # noqa: E402

EVERY = {"no_recovery_after": []}
REGRIPS = ["dead end", "stage regressed", "left gripper closed", "right gripper closed"]  # takeovers whose correction grips again
VARIANTS = {  # name -> (composition overrides, retrain from fresh weights, uses the round's data)
    "control": ({"mode": "rac"}, False, False),
    "rac": ({"mode": "rac"}, False, True),
    "all_recovery": ({"mode": "rac", **EVERY}, False, True),
    "rac_successes": ({"mode": "rac", "successful_rollouts": True}, False, True),
    "corrections": ({"mode": "corrections"}, False, True),
    "all_recovery_80": ({"mode": "rac", "demo_share": 0.8, **EVERY}, False, True),
    "rac_80": ({"mode": "rac", "demo_share": 0.8}, False, True),
    "rac_no_dead_ends": ({"mode": "rac", "no_intervention_after": ["dead end"]}, False, True),
    "rac_no_stalls": ({"mode": "rac", "no_intervention_after": ["no progress"]}, False, True),
    "rac_half_recovery": ({"mode": "rac", "segment_weights": {"RECOVERY": 0.5}}, False, True),
    "corrections_no_regrips": ({"mode": "corrections", "no_intervention_after": REGRIPS}, False, True),
    "corrections_80": ({"mode": "corrections", "demo_share": 0.8}, False, True),
    "corrections_no_regrips_80": ({"mode": "corrections", "no_intervention_after": REGRIPS, "demo_share": 0.8}, False, True),
    "all_recovery_fresh": ({"mode": "rac", **EVERY}, True, True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--round-data", required=True,
                    help="the round's intervention store (robo-rl rac: OUT/rac/data/round1), or several, comma-separated")
    ap.add_argument("--variants", default="control,rac,all_recovery")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--steps", type=int, default=2000, help="fine-tune steps (retrain: the checkpoint's own)")
    ap.add_argument("--seed", type=int, default=0, help="the fine-tune's training seed (robo-rl rac: finetune.seed)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default="data/bench/rac_composition")
    ap.add_argument("--report", action="store_true", help="print where the round's weight goes; train nothing")
    args = ap.parse_args()
    console = make_console()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"rac_composition: unknown variants {unknown}; choose from {list(VARIANTS)}")
    round_data = [Path(p) for p in args.round_data.split(",") if p]
    if args.report and len(round_data) != 1:
        sys.exit(f"rac_composition: --report reads one round's store at a time; got {len(round_data)}")
    ckpt = read_checkpoint(args.checkpoint)
    demos = [(ckpt["dataset"], ckpt.get("n_episodes"))]
    if args.report:
        return report(console, demos[0], round_data[0], names)
    chunking = dict(ckpt.get("chunking") or {})
    pre = (ckpt.get("config") or {}).get("learner") or {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        overrides, retrain, data = VARIANTS[name]
        stores = round_data if data else []
        learner = LearnerConfig(steps=args.steps, batch_size=128, lr=1e-4, warmup_steps=100, weighted_sampling=True,
                                loss_weights=False, checkpoint_every=100_000, threads=args.threads, device="cpu", seed=args.seed)
        learner = replace(learner, **camera_learner("cpu"))  # bf16 where the CPU computes it, compile: as rac does
        if retrain:  # the pre-training's recipe: its steps, peak lr and warm-up
            learner = replace(learner, steps=int(ckpt.get("step") or pre.get("steps") or 4000),
                              lr=float(pre.get("lr", 3e-4)), warmup_steps=int(pre.get("warmup_steps", 500)))
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.time()
        policy, fit = finetune(ckpt, demos, stores, CompositionConfig(**overrides), learner, run_dir,
                               progress=True, from_scratch=retrain)
        train_s = time.time() - t0
        policy = load_policy(read_checkpoint(last_checkpoint(run_dir)), device="cpu")
        t0 = time.time()
        ev = evaluate_with_recoveries(policy, ckpt["task"], chunking, args.episodes, 10, 100_000, 5, run_dir / "eval",
                                      0, predictor(policy))
        row = {"variant": name, "success": ev["success_rate"], "low": ev["ci95_low"], "high": ev["ci95_high"],
               "stage_reach": ev["stage_reach"], "train_steps": fit.get("step"), "train_s": train_s,
               "eval_s": time.time() - t0}
        rows.append(row)
        (out / "rows.json").write_text(json.dumps(rows, indent=1))
        console.print(f"{name}: {row['success']:.0%} [{row['low']:.0%}, {row['high']:.0%}] {ev['stage_reach']}")
    stages = list(rows[0]["stage_reach"]) if rows else []
    t = table(f"RaC round composition, {ckpt['task']}, {len(round_data)} round(s), training seed {args.seed}, "
              f"{args.episodes} episodes (seeds 100000+), {cpu_kind()}",
              ["variant", "success [95%]", *stages, "train steps", "train min", "eval min"])
    for r in rows:
        t.add_row(*[r["variant"], f"{r['success']:.0%} [{r['low']:.0%}, {r['high']:.0%}]",
                          *(f"{r['stage_reach'][s]:.0%}" for s in stages), str(r["train_steps"]),
                          f"{r['train_s'] / 60:.1f}", f"{r['eval_s'] / 60:.1f}"])
    console.print(t)
    return 0


def report(console, demos: tuple[str, int | None], round_data: Path, names: list[str]) -> int:
    """Each variant's share of the batch by (takeover reason, ending): steps that train, of the
    operator steps recorded, and the share of each batch they get."""
    import re

    sources = []
    for path, n, is_demo in [(demos[0], demos[1], True), (round_data, None, False)]:
        store = EpisodeStore.open(path, mode="r")
        sources.append(composition_source(store, store.n_episodes if n is None else min(int(n), store.n_episodes), is_demo))
    seg, starts, records = sources[1]["segments"], sources[1]["episode_starts"], sources[1]["interventions"]

    def kind(rec: dict) -> tuple[str, str]:
        return re.sub(r" for [0-9.]+ s$", "", rec["reason"]), rec["ended"]

    # (reason, ending) -> how many interventions, and their operator steps (mixing's own span rule)
    counts: dict[tuple[str, str], int] = {}
    for rec in (r for episode in records for r in episode):
        counts[kind(rec)] = counts.get(kind(rec), 0) + 1
    spans = {key: intervention_mask(seg, starts, records, lambda rec, key=key: kind(rec) == key, OPERATOR_LABELS)
             for key in counts}
    for name in names:
        overrides, _, data = VARIANTS[name]
        if not data:
            continue
        weights = composition_weights(sources, CompositionConfig(**overrides))
        total = sum(float(w.sum()) for w in weights)
        t = table(f"{name}: {composition_report(sources, weights)}",
                  ["takeover reason", "ended", "interventions", "operator steps", "steps that train", "share of each batch"])
        for key, at in sorted(spans.items(), key=lambda kv: -float(weights[1][kv[1]].sum())):
            t.add_row(*key, str(counts[key]), str(int(at.sum())), str(int((weights[1][at] > 0).sum())),
                      f"{float(weights[1][at].sum()) / total:.1%}")
        console.print(t)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RoboRLError as e:  # a missing store or checkpoint: one line (a checkpoint's dataset path is relative to where it trained)
        sys.exit(f"rac_composition: {e}")
