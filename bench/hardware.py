"""Hardware-side benchmark (issue 6), first part: the Controller's tick timing on this machine.

(a) period jitter at 50, 200 and 500 Hz for 5 s each: the Controller (its own work: observe,
    chunk schedule, safety filter, act, record call) driving the MuJoCo twin without cameras,
    with the default flow DiT (frozen, one thread) predicting chunks in its own thread. Baseline in the same run: a bare
    loop that only sleeps to the same absolute deadlines (what the OS timer gives for free).
    Jitter = |period - nominal|; target p99 < 1 ms at 500 Hz.

    python bench/hardware.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))
from common import make_console, table  # noqa: E402

import torch  # noqa: E402

from robo_rl.hardware.safety import SafetyConfig, SafetyFilter  # noqa: E402
from robo_rl.policies import ObsShapes, make_policy  # noqa: E402
from robo_rl.policies.common import FrozenPredictor  # noqa: E402
from robo_rl.runtime.controller import Controller, ControllerConfig, wait_until  # noqa: E402
from robo_rl.sim.robot import SimRobot  # noqa: E402


def bare_loop(hz: float, seconds: float, spin_s: float) -> np.ndarray:
    """Periods (ms) of a loop that does nothing but wait for its deadlines, as the Controller does."""
    period, t0, starts = 1.0 / hz, time.monotonic(), []
    for k in range(int(seconds * hz)):
        wait_until(t0 + k * period, spin_s)
        starts.append(time.monotonic())
    return np.diff(starts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    console = make_console()
    robot = SimRobot(cameras=[])
    home = robot.spec.home

    # the real thing: the default flow DiT (K = 10) on qpos, traced and frozen as deploy runs it
    torch.set_num_threads(1)
    policy = make_policy("flow", {}, ObsShapes({"obs/qpos": 14}, {}, 14)).eval()
    predict = FrozenPredictor(policy)
    predict({"obs/qpos": np.repeat(home[None, None], 2, 1)})  # trace before timing

    t = table(f"(a) tick period jitter, {args.seconds:.0f} s per rate (|period - nominal|, ms)",
              ["loop", "rate", "p50", "p99", "max", "overruns", "target p99"])
    for hz in (50, 200, 500):
        cfg = ControllerConfig(hz=hz, record_hz=min(hz, 50))
        robot.reset()
        safety = SafetyFilter(robot.spec, SafetyConfig())
        rep = Controller(robot, predict, cfg, safety=safety, on_record=lambda obs, cmd: None).run(args.seconds)
        jitter = np.abs(np.asarray(rep.period_ms) - 1e3 / hz)
        target = ("< 1 ok" if np.percentile(jitter, 99) < 1 else "< 1 MISSED") if hz == 500 else ""
        t.add_row("Controller + twin + policy thread", f"{hz} Hz", f"{np.percentile(jitter, 50):.3f}",
                  f"{np.percentile(jitter, 99):.3f}", f"{jitter.max():.3f}", str(rep.overruns), target)
        base = np.abs(bare_loop(hz, args.seconds, cfg.spin_s) - 1e3 / hz)
        t.add_row("baseline: bare deadline loop", f"{hz} Hz", f"{np.percentile(base, 50):.3f}",
                  f"{np.percentile(base, 99):.3f}", f"{base.max():.3f}", "", "")
    console.print(t)


if __name__ == "__main__":
    main()
