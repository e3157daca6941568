"""Does the simulated operator's dead-end rule see what a person sees, and what does it cost?

A policy's rollouts run with the operator watching and never taking over (so each episode ends as
the policy alone would end it). Two operators watch the same twin: one with the look-ahead
(`lookahead=true`, the default), one without (the reference, in the same run). For every
takeover either would have made, the table says whether the policy then finished the task or
not: a takeover in an episode the policy finishes is a false alarm, one in an episode it fails
is a failure seen coming. The cost: the operator's time per tick with and without the look-ahead,
and per look-ahead.

    python bench/operator_lookahead.py --checkpoint data/runs/<camera run>/checkpoints/last.pt [--episodes 40]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402
from rac_takeovers import kind  # noqa: E402  (a takeover's trigger, its timings dropped)

from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.policies import load_policy, read_checkpoint  # noqa: E402
from robo_rl.policies.inference import predictor  # noqa: E402
from robo_rl.runtime.chunking import ChunkingConfig  # noqa: E402
from robo_rl.sim.evaluate import seeded_noise  # noqa: E402
from robo_rl.sim.interventions import collect_interventions  # noqa: E402
from robo_rl.sim.operator import OperatorConfig, SimOperator  # noqa: E402


class Watcher:
    """Two simulated operators watching one twin; neither ever takes over. Records each one's
    first takeover per trigger in each episode and how long its `signal` took every tick."""

    name = "watcher"

    def __init__(self, env, record: list):
        self.env = env
        self.ops = {"with": SimOperator(env, OperatorConfig(lookahead=True)),
                    "without": SimOperator(env, OperatorConfig(lookahead=False))}
        self.record = record
        self.episode: dict | None = None

    def reset(self) -> None:
        for op in self.ops.values():
            op.reset()
        self.episode = {"init_state": self.env.sim_state(), "hz": self.env.robot.spec.control_hz,
                        "seen": {k: {} for k in self.ops},
                        "ms": {k: [] for k in self.ops}}
        self.record.append(self.episode)

    def signal(self, phase, policy_action):
        for name, op in self.ops.items():
            t = time.perf_counter()
            event = op.signal(phase, policy_action)
            self.episode["ms"][name].append(1e3 * (time.perf_counter() - t))
            if event is not None:
                self.episode["seen"][name].setdefault(kind(event.reason), op._step)
        return None

    def command(self, phase, last_command):  # never in control
        return np.asarray(last_command, dtype=np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--n-envs", type=int, default=10)
    p.add_argument("--seed", type=int, default=100_000, help="the first rollout's seed (evaluation's)")
    args = p.parse_args()
    ckpt = read_checkpoint(Path(args.checkpoint))
    policy = load_policy(ckpt)
    image_size = next(iter(policy.shapes.images.values()), None)
    record: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, seeded_noise(args.seed):
        collect_interventions(predictor(policy), ckpt["task"], list(ckpt["obs_keys"]), policy.config.n_obs,
                              policy.config.horizon, ChunkingConfig(**dict(ckpt.get("chunking") or {})),
                              Path(tmp) / "rollouts", args.episodes, args.seed, mode="rac", n_envs=args.n_envs,
                              make_operator=lambda env: Watcher(env, record), image_size=image_size)
        store = EpisodeStore.open(Path(tmp) / "rollouts", mode="r")
        outcome = {tuple(np.round(m.extra["init_state"], 9)): bool(m.success) for m in store.metas}
    wall = time.perf_counter() - t0
    episodes = [e for e in record if e["ms"]["with"]]  # an env's last reset starts no episode
    for e in episodes:
        e["success"] = outcome[tuple(np.round(e["init_state"], 9))]
    n_ok = sum(e["success"] for e in episodes)
    console = make_console()
    rows = table(f"{ckpt['task']}: takeovers the operators would make, by the policy's own outcome "
                 f"({len(episodes)} episodes from seed {args.seed}, {n_ok} finished by the policy; {wall:.0f} s, "
                 f"{cpu_kind()})", ["operator", "trigger", "in episodes the policy finishes (false alarms)",
                                     "in episodes it fails (seen coming)", "first takeover in those, s (mean)"])
    for name in ("without", "with"):
        hits: Counter = Counter()
        alarms: Counter = Counter()
        first_hit = first_alarm = 0
        when: list[float] = []
        for e in episodes:
            seen = e["seen"][name]
            for trigger in seen:
                (alarms if e["success"] else hits)[trigger] += 1
            if seen:
                first_alarm += e["success"]
                first_hit += not e["success"]
                if not e["success"]:
                    when.append(min(seen.values()) / e["hz"])  # the operator counts ticks
        label = "look-ahead" if name == "with" else "no look-ahead (reference)"
        for trigger in sorted(set(hits) | set(alarms)):
            rows.add_row(label, trigger, str(alarms[trigger]), str(hits[trigger]), "")
        rows.add_row(label, "any (the first takeover)", f"{first_alarm} of {n_ok}",
                     f"{first_hit} of {len(episodes) - n_ok}", f"{np.mean(when):.1f}" if when else "-")
    console.print(rows)
    cost = table(f"the operator's time per tick ({cpu_kind()})",
                 ["operator", "ms per tick, mean", "p99", "max", "ticks over 50 ms", "ms per look-ahead"])
    for name in ("without", "with"):
        ms = np.concatenate([e["ms"][name] for e in episodes])
        slow = ms[ms > 50]
        cost.add_row("look-ahead" if name == "with" else "no look-ahead (reference)", f"{ms.mean():.2f}",
                     f"{np.percentile(ms, 99):.1f}", f"{ms.max():.0f}", str(len(slow)),
                     f"{slow.mean():.0f}" if len(slow) else "-")
    console.print(cost)


if __name__ == "__main__":
    main()
