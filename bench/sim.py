"""Simulation benchmark: the twin's gymnasium envs against baselines measured in the same run.

(a) state: env steps/s of each task (robo_rl/TransferCube-v0, Insertion-v0, PackCube-v0, obs_mode
    "state", made with gym.make) against raw MuJoCo on the SAME model and data: a loop of
    `data.ctrl[:] = c; mujoco.mj_step(model, data, nstep=robot.substeps)` replaying the very ctrl
    the env sent (recorded in an untimed pass), so both follow the same trajectory (checked bit
    for bit). One control step (nstep=substeps) counts as one step. Fixed actions: the home pose
    plus a small sinusoid on the arm joints, so no expert/IK time is included.
    Target env/raw >= 0.8. gym-aloha's TransferCube is quoted (0.68), not run.
(b) pixels: TransferCube with top + left_wrist + right_wrist cameras at 240x320 and 96x96, obs_mode
    "pixels" and "state+pixels", and the top camera alone at 480x640, against the state-mode rate.
    Target >= 100 steps/s at 240x320. gym-aloha's pixel env (5.7 steps/s at 480x640) is quoted.
(c) vector: gymnasium AsyncVectorEnv (and SyncVectorEnv) with N copies of TransferCube in state
    mode and in pixels mode (top camera 96x96); total env steps/s summed over the N envs, against
    one plain env in the same process. Workers start with multiprocessing context "forkserver"
    (preloading robo_rl.sim.envs) unless --context says otherwise; autoreset mode SAME_STEP, so
    every step() call steps every env.

    python bench/sim.py [--quick] [--only state|pixels|vector] [--seed 0] [--context forkserver]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import random
import sys
from pathlib import Path
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import mujoco
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import make_console, table  # noqa: E402

import robo_rl.sim.envs  # noqa: E402  (registers the robo_rl/* ids)
from robo_rl.sim.tasks import TASKS  # noqa: E402

TASK_IDS = {TASKS[task].__name__: env_id for task, env_id in robo_rl.sim.envs.TASK_IDS.items()}  # class name -> gym id
ENV_ID = TASK_IDS["TransferCube"]
ALL_CAMS = ("top", "left_wrist", "right_wrist")
STATE_RATIO_TARGET = 0.8
PIXELS_TARGET = 100.0  # env steps/s, 3 cameras 240x320
QUOTED_GYM_ALOHA_RATIO = 0.68  # gym-aloha TransferCube env/raw on this kind of 2-core machine (not run)
QUOTED_GYM_ALOHA_PIXELS = 5.7  # gym-aloha pixel env steps/s at 480x640 here (not run)
AMPLITUDE = 0.05  # rad, sinusoid on the 12 arm joints around the home pose
FREQ = 0.5  # Hz




def _load() -> str:
    """1-minute load average: other work on the machine moves the timings."""
    return f"{os.getloadavg()[0]:.2f}"


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def actions(spec, n: int, phase: float = 0.0, hz: float = 50.0) -> np.ndarray:
    """(n, 14) float32: home pose plus a small sinusoid on the arm joints, grippers held at home."""
    t = np.arange(n)[:, None] / hz
    arm = np.ones(spec.action_dim, dtype=bool)
    arm[sorted(spec.grippers)] = False
    joint_phase = np.linspace(0, np.pi, spec.action_dim)[None]
    a = np.repeat(spec.home[None].astype(np.float64), n, axis=0)
    a[:, arm] += (AMPLITUDE * np.sin(2 * np.pi * FREQ * t + joint_phase + phase))[:, arm]
    return np.clip(a, spec.lower, spec.upper).astype(np.float32)


def _make_env(obs_mode: str, cameras: tuple[str, ...], image_size: tuple[int, int]):
    """Env fn for vector workers: a fresh (spawn/forkserver) process must import robo_rl.sim.envs
    before gym.make can find the robo_rl/* ids."""
    import robo_rl.sim.envs  # noqa: F401

    return gym.make(ENV_ID, obs_mode=obs_mode, cameras=cameras, image_size=image_size)


def _gl_renderer() -> str:
    try:
        env = gym.make(ENV_ID, obs_mode="pixels", cameras=("top",), image_size=(16, 16))
        env.reset(seed=0)
        from OpenGL import GL

        s = f"{GL.glGetString(GL.GL_RENDERER).decode()} / {GL.glGetString(GL.GL_VERSION).decode()}"
        env.close()
        return s
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unknown ({type(e).__name__})"


# ====================================================================== (a) state
def state_benchmark(args, console) -> dict[str, float]:
    episodes, warmup, timed = (1, 50, 200) if args.quick else (3, 50, 350)
    rates = {}
    t = table(
        f"(a) state mode: env.step vs raw mj_step(nstep=substeps) on the same model/data, fixed actions "
        f"(home + {AMPLITUDE} rad sinusoid); {episodes} episode(s) x {timed} timed steps after {warmup} warm-up "
        f"per repeat, best of {args.repeats}; target env/raw >= {STATE_RATIO_TARGET}",
        ["task", "nq/nv", "substeps", "contacts", "env steps/s", "raw steps/s", "env/raw", "env/raw (CPU)",
         "overhead us/step", "stage() us", "target", "pass", "same traj."],
    )
    for ti, (name, env_id) in enumerate(TASK_IDS.items()):
        env = gym.make(env_id, obs_mode="state")
        u = env.unwrapped
        robot = u.robot
        m, d = robot.model, robot.data
        nstep = robot.substeps
        seeds = [args.seed + 1000 * ti + k for k in range(episodes)]
        acts = [actions(robot.spec, warmup + timed, phase=0.3 * k) for k in range(episodes)]

        # Untimed pass: the ctrl the env sends at each step, and the state it ends in.
        ctrls, finals, ncon = [], [], []
        for k, seed in enumerate(seeds):
            env.reset(seed=seed)
            c = np.empty((warmup + timed, m.nu))
            for i, a in enumerate(acts[k]):
                env.step(a)
                c[i] = d.ctrl
                ncon.append(d.ncon)
            ctrls.append(c)
            finals.append(d.qpos.copy())

        # Each episode runs through the env, then (same seed, same ctrl) through raw mj_step, back
        # to back, so both see the same load; wall-clock and this thread's CPU time.
        best = {"env": 0.0, "raw": 0.0, "env_cpu": 0.0, "raw_cpu": 0.0}
        same = True
        for _ in range(args.repeats):
            wall = {"env": 0.0, "raw": 0.0}
            cpu = {"env": 0.0, "raw": 0.0}
            for k, seed in enumerate(seeds):
                env.reset(seed=seed)
                a = acts[k]
                for i in range(warmup):
                    env.step(a[i])
                c0, t0 = time.thread_time(), time.perf_counter()
                for i in range(warmup, warmup + timed):
                    env.step(a[i])
                wall["env"] += time.perf_counter() - t0
                cpu["env"] += time.thread_time() - c0
                same &= np.array_equal(d.qpos, finals[k])

                env.reset(seed=seed)  # same initial state as the env run
                c = ctrls[k]
                for i in range(warmup):
                    d.ctrl[:] = c[i]
                    mujoco.mj_step(m, d, nstep=nstep)
                c0, t0 = time.thread_time(), time.perf_counter()
                for i in range(warmup, warmup + timed):
                    d.ctrl[:] = c[i]
                    mujoco.mj_step(m, d, nstep=nstep)
                wall["raw"] += time.perf_counter() - t0
                cpu["raw"] += time.thread_time() - c0
                same &= np.array_equal(d.qpos, finals[k])
            for w in ("env", "raw"):
                best[w] = max(best[w], episodes * timed / wall[w])
                best[w + "_cpu"] = max(best[w + "_cpu"], episodes * timed / max(cpu[w], 1e-9))
        best_env, best_raw = best["env"], best["raw"]

        # task.stage() alone, on the final state of the last episode (it runs once per env.step)
        n = 500
        t0 = time.perf_counter()
        for _ in range(n):
            u.task.stage(robot)
        stage_us = (time.perf_counter() - t0) / n * 1e6
        env.close()

        ratio = best_env / best_raw
        ratio_cpu = best["env_cpu"] / best["raw_cpu"]
        rates[name] = best_env
        t.add_row(
            name, f"{m.nq}/{m.nv}", str(nstep), f"{np.mean(ncon):.1f}", f"{best_env:,.0f}", f"{best_raw:,.0f}", f"{ratio:.2f}",
            f"{ratio_cpu:.2f}", f"{1e6 / best_env - 1e6 / best_raw:.0f}", f"{stage_us:.0f}", f">= {STATE_RATIO_TARGET}",
            _pf(ratio >= STATE_RATIO_TARGET), "yes" if same else "NO",
        )
    t.add_row("gym-aloha TransferCube (QUOTED)", "-", "-", "-", "-", "-", f"{QUOTED_GYM_ALOHA_RATIO:.2f}",
              "-", "-", "-", "-", "-", "-")
    console.print(t)
    console.print("contacts: mean d.ncon over the steps; env/raw (CPU): the same ratio from this thread's CPU time, "
                  "which a busy machine disturbs less than wall-clock; overhead us/step = 1e6/env - 1e6/raw: the env's "
                  "own work per step (action checks and clip, task.stage() contact scans, observation, gymnasium "
                  "wrappers), of which stage() us is task.stage() alone; same traj.: env and raw end in bit-identical qpos")
    console.print()
    return rates


# ====================================================================== (b) pixels
def _env_rate(env, acts: np.ndarray, warmup: int, timed: int, reps: int, seed: int) -> tuple[float, float, dict]:
    """Best-of-reps steps/s of one env (reset untimed), process CPU s per wall s, last obs."""
    best, cpu_ratio, obs = 0.0, 0.0, None
    for _ in range(reps):
        env.reset(seed=seed)
        for i in range(warmup):
            env.step(acts[i])
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(warmup, warmup + timed):
            obs = env.step(acts[i])[0]
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if timed / dt > best:
            best, cpu_ratio = timed / dt, dc / dt
    return best, cpu_ratio, obs


def _frames_ok(obs: dict, cams: tuple[str, ...], hw: tuple[int, int]) -> bool:
    imgs = obs.get("images", {})
    if sorted(imgs) != sorted(cams):
        return False
    if any(im.shape != (*hw, 3) or im.dtype != np.uint8 or im.std() < 1.0 for im in imgs.values()):
        return False  # wrong shape or blank
    ims = list(imgs.values())
    return all(not np.array_equal(ims[i], ims[j]) for i in range(len(ims)) for j in range(i + 1, len(ims)))


def pixels_benchmark(args, console) -> None:
    warmup, timed = (5, 40) if args.quick else (10, 150)
    reps = args.repeats
    settings = [
        ("state", (), None),
        ("pixels", ALL_CAMS, (240, 320)),
        ("state+pixels", ALL_CAMS, (240, 320)),
        ("pixels", ALL_CAMS, (96, 96)),
        ("state+pixels", ALL_CAMS, (96, 96)),
        ("pixels", ("top",), (480, 640)),
    ]
    rows = []
    state_rate = None
    for mode, cams, hw in settings:
        kw = {"obs_mode": mode}
        if hw:
            kw.update(cameras=cams, image_size=hw)
        env = gym.make(ENV_ID, **kw)
        n = timed * 4 if mode == "state" else timed  # state mode is fast: more steps for a stable number
        acts = actions(env.unwrapped.robot.spec, warmup + n)
        rate, cpu, obs = _env_rate(env, acts, warmup, n, reps, args.seed)
        env.close()
        if mode == "state":
            state_rate = rate
        rows.append((mode, cams, hw, rate, cpu, _frames_ok(obs, cams, hw) if hw else None))

    t = table(
        f"(b) pixels: {ENV_ID}, fixed actions, {timed} timed steps after {warmup} warm-up, best of {reps}; "
        f"target >= {PIXELS_TARGET:.0f} steps/s with 3 cameras at 240x320",
        ["obs_mode", "cameras", "image", "env steps/s", "ms/step", "x state mode", "CPU s / wall s",
         "frames ok", "target", "pass"],
    )
    for mode, cams, hw, rate, cpu, ok in rows:
        is_target = hw == (240, 320) and len(cams) == 3
        t.add_row(
            mode + (" (baseline)" if mode == "state" else ""), " + ".join(cams) or "-", f"{hw[0]}x{hw[1]}" if hw else "-",
            f"{rate:,.0f}", f"{1e3 / rate:.2f}", f"{rate / state_rate:.3f}", f"{cpu:.2f}",
            "-" if ok is None else ("yes" if ok else "NO"),
            f">= {PIXELS_TARGET:.0f}" if is_target else "-", _pf(rate >= PIXELS_TARGET) if is_target else "-",
        )
    t.add_row("gym-aloha (QUOTED)", "top", "480x640", f"{QUOTED_GYM_ALOHA_PIXELS}",
              f"{1e3 / QUOTED_GYM_ALOHA_PIXELS:.0f}", "-", "-", "-", "-", "-")
    console.print(t)
    top640 = [r for r in rows if r[2] == (480, 640)][0][3]
    console.print(f"top camera 480x640: {top640:,.0f} steps/s here vs {QUOTED_GYM_ALOHA_PIXELS} quoted for gym-aloha "
                  f"({top640 / QUOTED_GYM_ALOHA_PIXELS:.0f}x). CPU s / wall s > 1 means the renderer's own threads "
                  f"(llvmpipe) use the second core.")
    console.print()


# ====================================================================== (c) vector
def _vector_rate(venv, n_envs: int, acts: np.ndarray, warmup: int, min_time: float, reps: int, seed: int) -> float:
    venv.reset(seed=seed)
    k = 0
    for _ in range(warmup):
        venv.step(acts[k % len(acts)])
        k += 1
    best = 0.0
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            venv.step(acts[k % len(acts)])
            k += 1
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = max(best, n * n_envs / dt)
    return best


def vector_benchmark(args, console) -> None:
    ns = [1, 2] if args.quick else [1, 2, 4, 8]
    min_time = 0.4 if args.quick else 1.0
    reps = args.repeats
    ctx = args.context
    headroom = [parallel_headroom(ctx, min_time)]
    modes = [("state", "state", (), (96, 96)), ("pixels top 96x96", "pixels", ("top",), (96, 96))]
    probe = gym.make(ENV_ID)
    spec = probe.unwrapped.robot.spec
    probe.close()
    period = 400  # one episode of actions, cycled
    t = table(
        f"(c) vector envs: {ENV_ID}, N copies, total env steps/s summed over envs; timing windows of {min_time} s "
        f"after warm-up, best of {reps}; AsyncVectorEnv context {ctx!r}, shared memory, autoreset SAME_STEP; "
        f"{os.cpu_count()} CPU(s)",
        ["mode", "vector env", "N", "total env steps/s", "per env", "x single env", "start-up s"],
    )
    for label, mode, cams, hw in modes:
        kw = {"obs_mode": mode}
        if cams:
            kw.update(cameras=cams, image_size=hw)
        single = gym.make(ENV_ID, **kw)
        one = actions(spec, period)
        single_rate = _vector_rate(_Single(single), 1, one[:, None], 10, min_time, reps, args.seed)
        single.close()
        t.add_row(label, "single env (baseline)", "1", f"{single_rate:,.0f}", f"{single_rate:,.0f}", "1.00", "-")
        for kind in ("async", "sync"):
            for n in ns:
                acts = np.stack([actions(spec, period, phase=0.7 * j) for j in range(n)], axis=1)  # (T, N, 14)
                fns = [functools.partial(_make_env, mode, cams or ("top",), hw) for _ in range(n)]
                venv = None
                try:
                    t0 = time.perf_counter()
                    if kind == "async":
                        venv = gym.vector.AsyncVectorEnv(fns, context=ctx, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
                    else:
                        venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
                    venv.reset(seed=args.seed)
                    startup = time.perf_counter() - t0
                    rate = _vector_rate(venv, n, acts, 10, min_time, reps, args.seed)
                    t.add_row(label, f"{'Async' if kind == 'async' else 'Sync'}VectorEnv", str(n), f"{rate:,.0f}",
                              f"{rate / n:,.0f}", f"{rate / single_rate:.2f}", f"{startup:.1f}")
                except Exception as e:  # noqa: BLE001 - report, keep going
                    t.add_row(label, f"{kind} ERROR {type(e).__name__}: {e}"[:80], str(n), "-", "-", "-", "-")
                finally:
                    if venv is not None:
                        venv.close()
    headroom.append(parallel_headroom(ctx, min_time))
    console.print(t)
    console.print("x single env: total rate over one plain env stepped in this process (same mode, same actions)")
    console.print("parallel headroom (raw mj_step, TransferCube scene; 1 process vs summed over 2 concurrent processes; "
                  "2.0x = two free cores): " + ", ".join(
                      f"{when} {a:,.0f} vs {b:,.0f} steps/s ({b / a:.2f}x)" for when, (a, b) in zip(("before", "after"), headroom)))
    console.print()


def _raw_worker(seconds: float, q) -> None:
    import mujoco as mj

    from robo_rl.sim.robot import SimRobot

    robot = SimRobot("transfer_cube.xml", cameras=[])  # arms at home, as after env.reset()
    m, d = robot.model, robot.data
    mj.mj_step(m, d, nstep=100)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        mj.mj_step(m, d, nstep=robot.substeps)
        n += 1
    q.put(n / (time.perf_counter() - t0))


def parallel_headroom(ctx: str, seconds: float) -> tuple[float, float]:
    """Raw MuJoCo control steps/s (TransferCube scene, arms at home) in 1 process, and summed over 2
    concurrent processes: how much of a second core this machine gives right now."""
    mp = multiprocessing.get_context(ctx)
    out = []
    for k in (1, 2):
        q = mp.Queue()
        procs = [mp.Process(target=_raw_worker, args=(seconds, q)) for _ in range(k)]
        for p in procs:
            p.start()
        out.append(sum(q.get() for _ in procs))
        for p in procs:
            p.join()
    return out[0], out[1]


class _Single:
    """A plain env behind the vector-env calls _vector_rate makes (actions (1, 14))."""

    def __init__(self, env):
        self.env = env

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def step(self, a):
        out = self.env.step(a[0])
        if out[2] or out[3]:
            self.env.reset()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short timings, N = 1, 2 only")
    ap.add_argument("--only", choices=["state", "pixels", "vector"], default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timings are the best of this many repeats")
    # no "fork": once this process has an EGL context (it renders before the vector section), forked
    # workers hang in their first render
    ap.add_argument("--context", choices=["forkserver", "spawn"], default="forkserver",
                    help="multiprocessing context of AsyncVectorEnv (default forkserver)")
    args = ap.parse_args(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    if args.context == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", "robo_rl.sim.envs"])
    console = make_console(200)
    t0 = time.perf_counter()
    load0 = _load()
    one, two = parallel_headroom(args.context, 0.5)
    console.print(
        f"bench/sim.py: {os.cpu_count()} CPU(s), mujoco {mujoco.__version__}, gymnasium {gym.__version__}, "
        f"numpy {np.__version__}, MUJOCO_GL={os.environ.get('MUJOCO_GL')}, GL: {_gl_renderer()}, "
        f"{'quick' if args.quick else 'full'} run, seed {args.seed}; parallel headroom {two / one:.2f}x "
        f"(raw mj_step summed over 2 processes / 1 process: 2.0x = both cores free, timings are then comparable)"
    )
    if args.only in (None, "state"):
        state_benchmark(args, console)
    if args.only in (None, "pixels"):
        pixels_benchmark(args, console)
    if args.only in (None, "vector"):
        vector_benchmark(args, console)
    console.print(f"total {time.perf_counter() - t0:.0f} s; load average at start {load0}, at end {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
