"""robo-rl teleop: a human drives the arms (the twin or ROS 2 arms) from a teleop device through
the fixed-rate Controller, its safety filter and watchdog. No recording: `robo-rl record` adds it.

The pieces here are shared with robo-rl record: the robot (`open_robot`), the device
(`open_device`), and the terminal's keys (`SessionKeys`: the space bar trips the e-stop, record's
episode keys are taken out, the rest go to the keyboard device).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError

from robo_rl.hardware.teleop import TELEOP_KINDS

DEVICES = (*TELEOP_KINDS, "leader")  # leader arms need ROS 2, so they are wired here, not in make_teleop


def main(argv: list[str]) -> int:
    return run_app("teleop", "teleop", run, argv)


@dataclass
class OpenRobot:
    robot: Any              # implements robo_rl.hardware.robot.Robot
    hardware: str           # the robot description its safety limits come from
    twin: Any = None        # robot=sim: the BimanualEnv (task stage, reset, viewer)
    transport: Any = None   # ROS 2: the transport, shared with leader arms and the e-stop topic

    @property
    def kinematics(self) -> Any:
        """A MuJoCo model of the arms for the devices' end-effector moves (IK): the twin itself, or
        for real arms the twin's model, never stepped (built on first use; deploy needs none)."""
        if self.twin is not None:
            return self.twin
        if getattr(self, "_kinematics", None) is None:
            from robo_rl.sim.robot import SimRobot

            self._kinematics = SimRobot("aloha.xml", robot=self.hardware, cameras=[])
        return self._kinematics


def open_robot(cfg: DictConfig, cameras: Sequence[str] = (), image_size: Sequence[int] = (240, 320),
               task: str | None = None) -> OpenRobot:
    """robot=sim: the twin of `task` (default cfg.task) in this process; otherwise
    hardware/<robot>.yaml over ROS 2, reading `cameras` resized to `image_size`."""
    if cfg.robot == "sim":
        from robo_rl.sim.envs import BimanualEnv, TaskTwin
        from robo_rl.sim.tasks import TASKS

        task = task or cfg.task
        if task not in TASKS:
            raise ConfigError(f"task={task!r} unknown; tasks are {sorted(TASKS)}")
        env = BimanualEnv(str(task), obs_mode="state+pixels" if cameras else "state", cameras=list(cameras),
                          image_size=tuple(image_size))
        env.reset(seed=int(cfg.seed))
        return OpenRobot(TaskTwin(env), env.robot.spec.name, twin=env)
    from robo_rl.hardware.ros2.rclpy_transport import make_transport
    from robo_rl.hardware.ros2.robot import Ros2Robot

    robot = Ros2Robot(str(cfg.robot), cameras=list(cameras), image_sizes={c: tuple(image_size) for c in cameras})
    domain = robot.config.domain_id if cfg.domain_id is None else int(cfg.domain_id)
    robot.transport = make_transport(domain, str(cfg.transport))
    return OpenRobot(robot, str(cfg.robot), transport=robot.transport)


@dataclass
class SessionKeys:
    """The terminal's keys, read once per tick: `episode_keys` are queued for the session, the space
    bar trips `estop`, and the rest go to the keyboard device (moves, grippers, RaC events)."""

    estop: Any = None
    episode_keys: str = ""
    keyboard: Any = None         # a KeyboardTeleop fed from here (its own `source` is None)
    pending: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from robo_rl.hardware.teleop import TerminalKeys

        self._lock = threading.Lock()
        self.terminal = TerminalKeys() if sys.stdin.isatty() else None

    def pump(self) -> None:
        if self.terminal is None:
            return
        for key in self.terminal.read():
            if key == " " and self.estop is not None:
                self.estop.trip("space bar")
            elif key.lower() in self.episode_keys:
                with self._lock:
                    self.pending.append(key.lower())
            elif self.keyboard is not None:
                self.keyboard.press(key)

    def take(self) -> list[str]:
        with self._lock:
            out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        if self.terminal is not None:
            self.terminal.close()


class _WithKeys:
    """A device whose `poll` first lets the session read the terminal (so keyboard presses reach
    the keyboard device in the same tick) and adds the keyboard's RaC events to its own input."""

    def __init__(self, device: Any, keys: SessionKeys):
        self.device, self.keys, self.name = device, keys, device.name

    def __getattr__(self, name: str) -> Any:  # the device's own state (e.g. `gripper`) shows through
        return getattr(self.device, name)

    def poll(self) -> Any:
        self.keys.pump()
        out = self.device.poll()
        if self.keys.keyboard is not None and self.keys.keyboard is not self.device:
            out.events += self.keys.keyboard.poll().events
        return out

    def close(self) -> None:
        self.device.close()
        if self.keys.keyboard is not None and self.keys.keyboard is not self.device:
            self.keys.keyboard.close()


def check_device(cfg: DictConfig) -> None:
    """Before anything connects: an unknown device is the user's first error, not a timeout."""
    if str(cfg.teleop) not in DEVICES:
        raise ConfigError(f"teleop={cfg.teleop!r}; choose one of {', '.join(DEVICES)}")


def open_device(cfg: DictConfig, opened: OpenRobot, keys: SessionKeys) -> Any:
    """The teleop device named by cfg.teleop, wired to the session's keys."""
    from robo_rl.hardware.teleop import KeyboardTeleop, make_teleop

    check_device(cfg)
    kind = str(cfg.teleop)
    options = OmegaConf.to_container(cfg.device, resolve=True) if cfg.get("device") else {}
    if kind == "keyboard":
        if keys.terminal is None:
            raise ConfigError("teleop=keyboard needs a terminal (stdin is not a TTY); run it in a terminal")
        keys.keyboard = KeyboardTeleop(step_m=float(options.get("step_m", 0.005)))
        return _WithKeys(keys.keyboard, keys)
    # the keyboard still signals the RaC events (t / r / c) next to any other device
    keys.keyboard = KeyboardTeleop()
    if kind == "leader":
        from robo_rl.hardware.ros2.leader import LeaderArms

        transport, owns = opened.transport, False
        if transport is None:  # the twin in this process, the leader arms on ROS 2
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            transport, owns = make_transport(0 if cfg.domain_id is None else int(cfg.domain_id), str(cfg.transport)), True
        leader = LeaderArms(opened.hardware, transport=transport, owns_transport=owns)
        try:
            leader.connect(timeout_s=float(options.get("timeout_s", 5.0)))
        except BaseException:
            leader.close()  # closes the transport it owns
            raise
        return _WithKeys(leader, keys)
    return _WithKeys(make_teleop(kind, **options), keys)


def timing_rows(s: dict[str, Any]) -> list[list[str]]:
    """The Controller's timing and safety rows (shared by teleop, record and replay)."""
    return [["ticks", str(s["ticks"])],
            ["tick period p50 / p99 / max", f"{s['period_p50_ms']:.2f} / {s['period_p99_ms']:.2f} / {s['period_max_ms']:.2f} ms"],
            ["overruns (a tick > 1 period late)", str(s["overruns"])],
            ["watchdog holds / stops", f"{s['watchdog_holds']} / {s['watchdog_stops']}"],
            ["safety: nonfinite, position, gripper, step, velocity",
             ", ".join(str(s.get(k, 0)) for k in ("nonfinite", "position_limit", "gripper_range", "step_limit",
                                                  "velocity_limit"))]]


class TwinViewer:
    """The MuJoCo viewer on the twin when a display is available (keys typed into it reach the
    keyboard device); a no-op otherwise."""

    def __init__(self, opened: OpenRobot, keys: SessionKeys):
        from robo_rl.sim.teleop import open_viewer

        self.viewer = None if opened.twin is None else open_viewer(opened.twin.robot, keys.keyboard)

    def sync(self) -> None:
        if self.viewer is not None:
            self.viewer.sync()

    def close(self) -> None:
        if self.viewer is not None:
            self.viewer.close()


def listen_estop(robot: Any, topic: str | None, estop: Any) -> None:
    """On a ROS 2 robot, True on `topic` (std_msgs/Bool) trips `estop`; the twin has no topics."""
    transport = getattr(robot, "transport", None)
    if not topic or transport is None:
        return
    from robo_rl.hardware.ros2.messages import Bool

    def on_estop(msg: Bool) -> None:
        if msg.data:
            estop.trip(f"{topic} (ROS 2)")

    transport.subscribe(str(topic), Bool, on_estop)


def close_session(*parts: Any) -> None:
    """Close a session's parts in order (the terminal first); parts never opened are None. A
    part whose close fails does not keep the others open: all are closed, then the first error
    is raised."""
    first: BaseException | None = None
    for part in parts:
        if part is not None:
            try:
                part.close()
            except BaseException as e:
                first = first or e
    if first is not None:
        raise first


def safety_for(opened: OpenRobot) -> tuple[Any, Any, Any]:
    """(SafetyFilter, Watchdog, EStop) from the robot description's `safety:` section."""
    from robo_rl.hardware.safety import EStop, SafetyConfig, SafetyFilter, Watchdog

    cfg = SafetyConfig.from_yaml(opened.hardware)
    return SafetyFilter(opened.robot.spec, cfg), Watchdog(cfg), EStop()


def run(cfg: DictConfig) -> int:
    from robo_rl.cli.view import check_live_view, open_live_view, print_live_summary
    from robo_rl.data.schema import Segment
    from robo_rl.data.viewer import observation_values
    from robo_rl.runtime.controller import Controller, ControllerConfig
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
        operator = TeleopOperator(opened.kinematics, device)
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
