"""robo-rl view: an episode in the Rerun viewer (robo_rl/data/viewer.py): joint positions and
commands as time series, camera frames, the segment labels (policy / recovery / correction) as a
timeline track, success and the episode's metadata. `--save x.rrd` writes a file instead of
opening a viewer, for machines without a display; `rerun x.rrd` opens it elsewhere.

Also here: `open_live_view`, the `view=true` of teleop, record, deploy and rac.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig

from robo_rl.cli.app import EXIT_USER_ERROR, quote_override_value, run_store_app
from robo_rl.cli.tables import human_bytes
from robo_rl.errors import ConfigError, RoboRLError


def main(argv: list[str]) -> int:
    try:
        argv = save_flag_to_override(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    return run_store_app("view", run, argv)


def save_flag_to_override(argv: Sequence[str]) -> list[str]:
    """`--save X` and `--save=X` become the Hydra override `save=X`."""
    out, args = [], list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--save":
            if not args or args[0].startswith("-"):
                raise ConfigError("--save needs a file name: --save x.rrd")
            out.append(f"save={quote_override_value(args.pop(0))}")
        elif arg.startswith("--save="):
            out.append(f"save={quote_override_value(arg[len('--save='):])}")
        else:
            out.append(arg)
    return out


def joint_names(robot: str) -> list[str] | None:
    """The joint names of hardware/<robot>.yaml, to name the lines of qpos and action; None if
    the store's robot has no description here."""
    from robo_rl.hardware.robot import RobotSpec

    try:
        return list(RobotSpec.from_yaml(robot).joint_names)
    except RoboRLError:
        return None


def check_live_view(cfg: DictConfig) -> None:
    """`view=true` can work here: rerun-sdk is installed, and a viewer can open (a display) or
    `view_save` names a file. A one-line error otherwise, before any robot moves or terminal mode changes."""
    if not cfg.get("view"):
        return
    from robo_rl.data.viewer import has_display, import_rerun

    import_rerun()
    if not cfg.get("view_save") and not has_display():
        raise ConfigError("view=true: no display to open the Rerun viewer on (DISPLAY / WAYLAND_DISPLAY unset); "
                          "pass view_save=x.rrd to write the stream to a file, then `rerun x.rrd` where there is one")


def open_live_view(cfg: DictConfig, verb: str, joint_names: Sequence[str] | None = None, queue_size: int = 64) -> Any:
    """`view=true` in a verb's config: a LiveView (robo_rl/data/viewer.py) writing to `view_save`
    (an .rrd) or to a Rerun viewer it spawns; None when view is off. Its `step()` never blocks
    the control loop: when the viewer falls behind, steps are dropped and counted. It can fail
    (ConfigError: view_save not writable, the viewer does not start), so a verb opens it before
    its robot connects, its device opens or the terminal changes mode, and closes it last."""
    if not cfg.get("view"):
        return None
    from robo_rl.data.viewer import LiveView, RerunLogger

    check_live_view(cfg)
    save = cfg.get("view_save")
    logger = RerunLogger(f"{verb}-live", save=str(save) if save else None, spawn=not save, joint_names=joint_names)
    facts = [(k, cfg.get(k)) for k in ("robot", "task", "teleop", "operator", "checkpoint", "out")
             if isinstance(cfg.get(k), (str, int, float))]  # rac's `teleop` is a mapping of device options: left out
    logger.log_document(f"robo-rl {verb} (live)", facts)
    return LiveView(logger, queue_size=queue_size)


def print_live_summary(live: Any) -> None:
    """After a live view was closed (None: view was off): how many steps reached it, and where."""
    if live is not None:
        print(f"view: {live.summary()}", flush=True)


def run(cfg: DictConfig) -> int:
    from robo_rl.cli.replay import episode_index, open_store
    from robo_rl.data.viewer import RerunLogger

    if isinstance(cfg.episode, str) and cfg.episode.lower() == "all":
        raise ConfigError("view: one episode per recording; give episode=N")
    save = Path(str(cfg.save)) if cfg.save else None
    if save is not None and save.is_dir():
        raise ConfigError(f"save={save}: is a directory; give a file name like save={save / 'episode.rrd'}")
    store = open_store(cfg.dataset)
    with store:
        i = episode_index(store, cfg.episode)
        logger = RerunLogger(f"{Path(store.location).name}-episode{i}", save=save, spawn=save is None,
                             jpeg_quality=cfg.jpeg_quality, joint_names=joint_names(store.schema.robot))
        try:
            counts = logger.log_episode(store, i)
        finally:
            logger.close()
    where = (f"saved to {save} ({human_bytes(save.stat().st_size)}); open it with: rerun {save}" if save is not None
             else "sent to the Rerun viewer")
    print(f"view: episode {i} of {store.location}: {counts['steps']} steps, {counts['entities']} entities, "
          f"{len(store.schema.cameras)} camera(s); {where}")
    return 0
