"""robo-rl sim-bridge: the MuJoCo twin served as a ROS 2 robot (robo_rl.sim.bridge)."""

from __future__ import annotations

from omegaconf import DictConfig

from robo_rl.cli.app import run_app


def main(argv: list[str]) -> int:
    return run_app("sim-bridge", "sim_bridge", run, argv)


def run(cfg: DictConfig) -> int:
    from robo_rl.sim.bridge import SimBridge

    bridge = SimBridge(str(cfg.robot), str(cfg.scene), cfg.domain_id, prefer=str(cfg.transport))
    arms = ", ".join(f"{a.joint_states} -> {a.command}" for a in bridge.config.arms)
    print(f"sim-bridge: serving {cfg.robot} ({cfg.scene}) on ROS domain {bridge.config.domain_id} "
          f"({bridge.transport.name}): {arms}", flush=True)
    try:
        bridge.run(None if cfg.duration is None else float(cfg.duration))
    finally:
        print(f"sim-bridge: {bridge.commands_received} commands received, {bridge.commands_refused} refused", flush=True)
        bridge.close()
    return 0
