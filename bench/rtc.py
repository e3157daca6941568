"""Real-time chunking against receding-horizon execution with blending, under inference delay.

A policy runs in the twin through the real-time Controller (50 Hz against the wall clock, the
safety filter of hardware/aloha.yaml, the inference worker thread), exactly as `robo-rl deploy
robot=sim` runs it, with a delay injected into every inference (a sleep before the network), so
the chunk arrives that much later. For each injected delay, over the same seeds:
- baseline: receding horizon with the blend at hand-over (deploy's default; frozen sampler);
- rtc: real-time chunking (robo_rl/policies/rtc.py; d from measured latency, eager sampler).
Columns: success with its 95% interval, the largest joint jump at a chunk hand-over (the
policy's command, before the safety filter, which would hide it), its p99 over hand-overs, the
actions dropped late and the inference latency measured (injected delay included).

    python bench/rtc.py CHECKPOINT [--episodes 20] [--delays 100 200] [--n-action-steps 16]

The checkpoint's horizon must leave room for the delay (d ticks < n_action_steps < horizon): at
50 Hz, 200 ms is 10 ticks, so docs/results.md's row uses a TransferCube state policy with horizon 32.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_flags, make_console, table  # noqa: E402

from robo_rl.hardware.safety import SafetyConfig, SafetyFilter, Watchdog  # noqa: E402
from robo_rl.policies import load_policy, read_checkpoint  # noqa: E402
from robo_rl.policies.inference import predictor  # noqa: E402
from robo_rl.policies.rtc import RtcPredictor  # noqa: E402
from robo_rl.runtime.controller import Controller  # noqa: E402
from robo_rl.runtime.episodes import ControllerConfig  # noqa: E402
from robo_rl.runtime.sources import observation_window  # noqa: E402
from robo_rl.sim.envs import BimanualEnv, TaskTwin  # noqa: E402
from robo_rl.sim.rollout import wilson_interval  # noqa: E402


def delayed(predict, delay_s: float):
    """`predict` that answers `delay_s` later: what a slower network or a remote server would do."""
    def call(window, **extra):
        time.sleep(delay_s)
        return predict(window, **extra)
    return call


def run(policy, task: str, method: str, delay_ms: float, seeds: list[int], n_action_steps: int) -> dict:
    env = BimanualEnv(task, obs_mode="state")
    twin = TaskTwin(env)
    base = RtcPredictor(policy) if method == "rtc" else predictor(policy)
    predict = delayed(base, delay_ms / 1e3)
    cfg = ControllerConfig(hz=env.robot.spec.control_hz, n_obs=policy.config.n_obs, n_action_steps=n_action_steps,
                           blend_steps=4, rtc=method == "rtc")
    safety_cfg = SafetyConfig.from_yaml("aloha")
    successes, jumps, dropped, latency = 0, [], 0, []
    for seed in seeds:
        twin.reset(seed)
        window = observation_window([twin.observe()] * cfg.n_obs)  # warm-up, as deploy does
        base.warm_up(window) if method == "rtc" else base(window)
        controller = Controller(twin, predict, cfg, safety=SafetyFilter(twin.spec, safety_cfg), watchdog=Watchdog(safety_cfg))
        report = controller.run(env.max_steps / cfg.hz, stop=lambda: twin.success)
        successes += bool(twin.success)
        jumps += report.handover_jumps
        dropped += report.dropped_actions
        latency += report.inference_ms
    twin.close()
    return {"successes": successes, "episodes": len(seeds), "jumps": np.asarray(jumps), "dropped": dropped,
            "latency": np.asarray(latency)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--delays", type=float, nargs="+", default=[100.0, 200.0], help="injected delays, ms")
    ap.add_argument("--n-action-steps", type=int, default=None, help="default: the checkpoint's")
    ap.add_argument("--seed", type=int, default=100_000, help="the first evaluation seed (robo-rl eval's)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the control loop keeps the other core, as on a robot's computer
    ckpt = read_checkpoint(args.checkpoint)
    policy = load_policy(ckpt)
    task = ckpt.get("task") or "transfer_cube"
    n_action_steps = args.n_action_steps or policy.config.n_action_steps
    seeds = list(range(args.seed, args.seed + args.episodes))
    console = make_console()
    cpu = platform.processor() or platform.machine()
    flags = cpu_flags()
    t = table(f"real-time chunking vs receding + blend: {task}, {policy.name} (horizon {policy.config.horizon}, "
              f"{n_action_steps} actions per chunk), {len(seeds)} seeds from {args.seed}, 50 Hz in real time; "
              f"{os.cpu_count()} cores {cpu}, {'AVX512-BF16' if 'avx512_bf16' in flags else 'no AVX512-BF16'}",
              ["injected delay", "method", "success [95%]", "max jump (rad)", "p99 jump (rad)", "dropped late",
               "inference p50 / p99 (ms)"])
    for delay in args.delays:
        for method in ("receding + blend", "rtc"):
            t0 = time.perf_counter()
            r = run(policy, task, "rtc" if method == "rtc" else "receding", delay, seeds, n_action_steps)
            lo, hi = wilson_interval(r["successes"], r["episodes"])
            j, lat = r["jumps"], r["latency"]
            t.add_row(f"{delay:g} ms", method, f"{r['successes']}/{r['episodes']} [{lo:.0%}, {hi:.0%}]",
                      f"{j.max(initial=0):.3f}", f"{np.percentile(j, 99) if j.size else 0:.3f}", str(r["dropped"]),
                      f"{np.percentile(lat, 50):.0f} / {np.percentile(lat, 99):.0f}" if lat.size else "-")
            console.print(f"{delay:g} ms {method}: {r['successes']}/{r['episodes']} in {time.perf_counter() - t0:.0f} s")
    console.print(t)


if __name__ == "__main__":
    main()
