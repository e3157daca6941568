"""`robo-rl <verb> key=value ...`: one console script, one module per verb under robo_rl/cli."""

from __future__ import annotations

import importlib
import os
import sys

from robo_rl import __version__
from robo_rl.errors import INSTALL_GL

# verb -> (module, one-line summary). A verb appears here once it works end to end.
VERBS: dict[str, tuple[str, str]] = {
    "demo": ("robo_rl.cli.demo", "the main job: the newest end-to-end story (make demo)"),
    "collect": ("robo_rl.cli.collect", "record scripted expert demos of a task in the MuJoCo twin"),
    "ogbench-data": ("robo_rl.cli.ogbench_data", "make an OGBench dataset (.npz) locally with OGBench's own scripted oracles"),
    "dataset": ("robo_rl.cli.dataset", "inspect, check, repair, merge, filter and delete episode stores; import rosbag2, LeRobot and ACT HDF5; export LeRobot"),
    "replay": ("robo_rl.cli.replay", "re-run recorded episodes in the twin and report per-joint divergence"),
    "video": ("robo_rl.cli.video", "write an episode as an H.264 MP4 with its segment labels drawn in"),
    "view": ("robo_rl.cli.view", "show an episode in the Rerun viewer (or --save x.rrd): joints, cameras, segment labels"),
    "train": ("robo_rl.cli.train", "train a flow or diffusion action-chunk policy on an episode store"),
    "eval": ("robo_rl.cli.eval", "evaluate a trained policy in the twin: success with a 95% interval, videos"),
    "rac": ("robo_rl.cli.rac", "RaC rounds: interventions -> fine-tune -> eval, vs HG-DAgger and more demos"),
    "deploy": ("robo_rl.cli.deploy", "run a policy on the twin or ROS 2 arms: fixed-rate loop, safety, watchdog"),
    "teleop": ("robo_rl.cli.teleop", "drive the arms (twin or ROS 2) from a keyboard, gamepad, SpaceMouse or leader arms"),
    "record": ("robo_rl.cli.record", "record teleop demos or RaC interventions into an episode store, with cameras"),
    "sim-bridge": ("robo_rl.cli.sim_bridge", "serve the MuJoCo twin as a ROS 2 robot (CycloneDDS, no ROS install)"),
    "critic": ("robo_rl.cli.critic", "train a chunk critic on episode stores for value-guided chunk selection (eval/deploy critic=)"),
    "offline-rl": ("robo_rl.cli.offline_rl", "offline RL (floq, FQL, SHARSA) on an OGBench dataset: progress, evaluation, results table"),
    "utd-fit": ("robo_rl.cli.utd_fit", "fit compute-optimal UTD scaling laws to a sweep; pick sigma, N, batch, lr for a budget"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [
        f"robo-rl {__version__}: record, train, fine-tune with RaC, and deploy policies on bimanual arms",
        "",
        "usage: robo-rl <verb> [args] [key=value ...]     (Hydra overrides)",
        "       robo-rl <verb> --help                     (the verb's config and options)",
        "",
        "verbs:",
    ]
    lines += [f"  {v:<{width}}  {summary}" for v, (_, summary) in VERBS.items()]
    return "\n".join(lines)


# Offscreen rendering backends, in the order tried, with the library each needs and the Debian /
# Ubuntu package that has it.
GL_BACKENDS = {"egl": ("EGL", "libegl1"), "osmesa": ("OSMesa", "libosmesa6")}


def choose_rendering(env: dict) -> str | None:
    """Set MUJOCO_GL before mujoco is imported (it reads it once, at import): with no display and
    none set, the first offscreen backend whose library is installed (EGL, then OSMesa), or
    `disable` when there is none, so the commands that do not render still run (those that do
    stop with INSTALL_GL). A backend asked for whose library is missing: a one-line error."""
    from ctypes.util import find_library

    gl = env.get("MUJOCO_GL")
    if gl is None:
        if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
            return None  # a desktop: mujoco's default (GLFW) opens windows and renders offscreen
        env["MUJOCO_GL"] = next((b for b, (lib, _) in GL_BACKENDS.items() if find_library(lib)), "disable")
        return None
    if gl.lower() in GL_BACKENDS and not find_library(GL_BACKENDS[gl.lower()][0]):
        lib, package = GL_BACKENDS[gl.lower()]
        return (f"MUJOCO_GL={gl}, but lib{lib} is not installed (apt install {package}); unset MUJOCO_GL to let "
                f"robo-rl pick what this machine has, or {INSTALL_GL}")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(__version__)
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"error: unknown verb '{verb}'; verbs are: {', '.join(VERBS)} (robo-rl --help)", file=sys.stderr)
        return 2
    error = choose_rendering(os.environ)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    module = importlib.import_module(VERBS[verb][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
