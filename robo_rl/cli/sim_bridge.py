"""robo-rl sim-bridge: the MuJoCo twin served as a ROS 2 robot (robo_rl.sim.bridge)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_episodes
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("sim-bridge", "sim_bridge", run, argv)


def run(cfg: DictConfig) -> int:
    from robo_rl.sim.bridge import SimBridge

    cameras = cfg.cameras if cfg.cameras is not None else []
    if isinstance(cameras, str):  # `cameras=top`: one camera
        cameras = [cameras]
    elif not OmegaConf.is_list(cameras):
        raise ConfigError(f"sim-bridge: cameras={cameras!r}; give a list, e.g. cameras=[top,left_wrist]")
    size = cfg.image_size
    if not OmegaConf.is_list(size) or len(size) != 2:
        raise ConfigError(f"sim-bridge: image_size={size!r}; give [height, width], e.g. image_size=[240,320]")
    bridge = SimBridge(str(cfg.robot), str(cfg.scene), cfg.domain_id, prefer=str(cfg.transport),
                       cameras=[str(c) for c in cameras], camera_hz=float(cfg.camera_hz),
                       image_size=(int(size[0]), int(size[1])),
                       image_type=None if cfg.image_type is None else str(cfg.image_type),
                       task=None if cfg.task is None else str(cfg.task), seed=int(cfg.seed),
                       episodes=None if cfg.episodes is None else int(cfg.episodes), disturb=bool(cfg.disturb),
                       max_steps=None if cfg.max_steps is None else int(cfg.max_steps), follow=bool(cfg.follow))
    topics = bridge.config.describe() + ("" if bridge.follow else " (follow=false: commands are not executed)")
    cams = "".join(f", {c.name} -> {c.topic} ({c.type})" for c in bridge.cameras)
    if cams:
        cams += f" at {cfg.camera_hz:g} Hz, {bridge.image_size[1]}x{bridge.image_size[0]}"
    what = f"task {cfg.task} (seeds from {cfg.seed})" if cfg.task is not None else cfg.scene
    scope = getattr(bridge.transport, "scope", None)
    where = scope.describe() if scope is not None else f"ROS domain {bridge.transport.domain_id}"
    print(f"sim-bridge: serving {cfg.robot} ({what}) on {where} ({bridge.transport.name}): {topics}{cams}", flush=True)
    try:
        bridge.run(None if cfg.duration is None else float(cfg.duration))
    finally:
        print(f"sim-bridge: {bridge.tick_summary()}", flush=True)
        print(f"sim-bridge: command writers: {bridge.writers_summary()}", flush=True)
        print(f"sim-bridge: {bridge.commands_received} commands received, {bridge.commands_refused} refused", flush=True)
        bridge.close()
        if bridge.results:
            print_episodes("sim-bridge", bridge.results)
    return 0

