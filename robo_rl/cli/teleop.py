"""robo-rl teleop: a human drives the arms (the twin or ROS 2 arms) from a teleop device through
the fixed-rate Controller, its safety filter and watchdog. No recording: `robo-rl record` adds it.

The session parts it shares with record, deploy and replay live in robo_rl/cli/session.py: the
robot (`open_robot`), the device (`open_device`), and the terminal's keys (`SessionKeys`: the space
bar trips the e-stop, record's episode keys are taken out, the rest go to the keyboard device).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from robo_rl.cli.app import run_app
from robo_rl.cli.session import (SessionKeys, TwinViewer, check_device, close_session, listen_estop, open_device,
                                 open_robot, safety_for, timing_rows)
from robo_rl.cli.tables import print_table


def main(argv: list[str]) -> int:
    return run_app("teleop", "teleop", run, argv)


def run(cfg: DictConfig) -> int:
    from robo_rl.cli.session import check_live_view, open_live_view, print_live_summary
    from robo_rl.data.schema import Segment
    from robo_rl.data.viewer import observation_values
    from robo_rl.runtime.controller import Controller
    from robo_rl.runtime.episodes import ControllerConfig
    from robo_rl.runtime.sources import OperatorCommands
    from robo_rl.sim.teleop import TeleopOperator

    check_device(cfg)
    check_live_view(cfg)  # view=true
    opened = open_robot(cfg)
    safety, watchdog, estop = safety_for(opened)
    listen_estop(opened.robot, cfg.estop_topic, estop)
    keys = device = viewer = live = None
    try:
        # view=true: the Rerun viewer, first: if it cannot open, nothing was connected and the terminal is as it was
        live = open_live_view(cfg, "teleop", opened.robot.spec.joint_names)
        keys = SessionKeys(estop=estop)
        opened.robot.connect()
        device = open_device(cfg, opened, keys)
        # leader arms give joint positions: no kinematic model (real arms get no twin built)
        operator = TeleopOperator(None if cfg.teleop == "leader" else opened.kinematics, device,
                                  spec=opened.robot.spec)
        viewer = TwinViewer(opened, keys)
        hz = opened.robot.spec.control_hz
        ticks = [0]

        def each_tick(obs: Any, command: Any) -> None:
            viewer.sync()
            if live is not None:  # never blocks (a full queue drops the step)
                live.step(observation_values(obs, command), Segment.TELEOP)
            ticks[0] += 1
            if ticks[0] % int(hz // 2) == 0:
                where = ""
                if opened.twin is not None:
                    env = opened.twin
                    where = f" | stage {env.task.stage_names[env.task.stage(env.robot)]}"
                print(f"\rteleop {device.name} | {ticks[0] / hz:6.1f} s{where}   ", end="", flush=True)

        print(f"teleop {cfg.teleop} on {cfg.robot} at {hz:.0f} Hz (space: e-stop; Ctrl-C ends)", flush=True)
        controller = Controller(opened.robot, OperatorCommands(operator), ControllerConfig(hz=hz), safety=safety,
                                watchdog=watchdog, estop=estop, on_record=each_tick)
        report = controller.run(None if cfg.duration is None else float(cfg.duration))
        print()
    finally:
        close_session(keys, viewer, device, opened.robot, live)  # the live view last: its close waits for its queue
    print_live_summary(live)
    s = report.summary()
    print_table(f"teleop {cfg.teleop} on {cfg.robot}", ["measure", "value"], timing_rows(s))
    if s["stopped_reason"]:
        print(f"stopped: {s['stopped_reason']}")
        return 1
    return 0
