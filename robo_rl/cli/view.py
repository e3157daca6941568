"""robo-rl view: an episode in the Rerun viewer (robo_rl/data/viewer.py): joint positions and
commands as time series, camera frames, the segment labels (policy / recovery / correction) as a
timeline track, success and the episode's metadata. `--save x.rrd` writes a file instead of
opening a viewer, for machines without a display; `rerun x.rrd` opens it elsewhere.

Also here: `open_live_view`, the `view=true` of teleop, record, deploy and rac.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from robo_rl.cli.app import EXIT_USER_ERROR, quote_override_value, run_store_app
from robo_rl.cli.session import joint_names
from robo_rl.cli.tables import human_bytes
from robo_rl.errors import ConfigError


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


def run(cfg: DictConfig) -> int:
    from robo_rl.cli.session import episode_index, open_store
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
