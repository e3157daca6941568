"""What several verbs share: opening a robot session (robot, teleop device, session keys, e-stop,
clean close), the live viewer, value-guided chunk selection, a policy's inputs on a robot, and
picking an episode from a store. A verb imports from here, never from another verb."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.hardware.teleop import TELEOP_KINDS


DEVICES = (*TELEOP_KINDS, "leader")  # leader arms need ROS 2, so they are wired here, not in make_teleop


@dataclass
class OpenRobot:
    robot: Any              # implements robo_rl.hardware.robot.Robot
    hardware: str           # the robot description its safety limits come from
    twin: Any = None        # robot=sim: the BimanualEnv (task stage, reset, viewer)
    transport: Any = None   # ROS 2: the transport, shared with leader arms and the e-stop topic

    @property
    def kinematics(self) -> Any:
        """A MuJoCo model of the arms for the devices' end-effector moves (IK): the twin itself; for
        real arms the model the description's `kinematics:` names (MJCF or URDF), or else the
        twin's model, never stepped (built on first use; deploy and leader arms need none)."""
        if self.twin is not None:
            return self.twin
        if getattr(self, "_kinematics", None) is None:
            from robo_rl.sim.kinematics import load_kinematics
            from robo_rl.sim.robot import SimRobot

            self._kinematics = load_kinematics(self.hardware) or SimRobot("aloha.xml", robot=self.hardware, cameras=[])
        return self._kinematics


def open_robot(cfg: DictConfig, cameras: Sequence[str] = (), image_size: Sequence[int] | None = (240, 320),
               task: str | None = None) -> OpenRobot:
    """robot=sim: the twin of `task` (default cfg.task) in this process, rendering `cameras` at
    `image_size`; otherwise hardware/<robot>.yaml over ROS 2, reading `cameras` resized to
    `image_size` (None: at the size the description gives them, the full frames)."""
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

    if image_size is None:
        from robo_rl.hardware.robot import RobotSpec

        sizes = RobotSpec.from_yaml(str(cfg.robot)).camera_sizes
    else:
        sizes = {c: tuple(image_size) for c in cameras}
    robot = Ros2Robot(str(cfg.robot), cameras=list(cameras), image_sizes=sizes,
                      allow_other_writers=bool(cfg.get("allow_other_writers", False)))
    scope = robot.config.scope(None if cfg.domain_id is None else int(cfg.domain_id))
    robot.transport = make_transport(prefer=str(cfg.transport), scope=scope)
    print(f"ROS 2 ({robot.transport.name}): {scope.describe()}; "
          + ("other writers on the command topics allowed" if robot.allow_other_writers else
             "one writer per command topic (allow_other_writers=true turns the check off)"), flush=True)
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

    def take(self, until: str = "") -> list[str]:
        """The queued episode keys, oldest first. With `until`, only up to and including the first
        of those keys: what was typed after it (a quick "fn": end, then start the next episode)
        stays queued for later, even when one terminal read held them all."""
        with self._lock:
            n = next((i + 1 for i, key in enumerate(self.pending) if key in until), len(self.pending))
            out, self.pending = self.pending[:n], self.pending[n:]
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

            transport, owns = make_transport(None if cfg.domain_id is None else int(cfg.domain_id), str(cfg.transport)), True
            print(f"ROS 2 leader arms ({transport.name}): {transport.scope.describe()}", flush=True)
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


def value_guided(predict: Any, path: str | Path, samples: int, policy: Any, task: str | None,
                 chunking: Mapping[str, Any] | None) -> Any:
    """`predict` wrapped with best-of-`samples` selection by the critic at `path`, after checking
    the critic fits the policy (obs keys, executed chunk length, task)."""
    from robo_rl.rl.chunk_critic import ChunkCritic, ValueGuided

    critic = ChunkCritic.load(path, device=str(policy.body.device))
    keys = [*policy.shapes.lowdim, *policy.shapes.images]
    n_exec = int((chunking or {}).get("n_action_steps") or policy.config.n_action_steps)
    critic.check_matches(keys, n_exec, task)
    return ValueGuided(predict, critic, samples)


def controller_config(policy: Any, chunking: dict, hz: float) -> Any:
    """The Controller's settings for a checkpoint's policy: its window and its chunk schedule
    (receding with a blend, or temporal ensembling as the checkpoint's `chunking.mode` says)."""
    from robo_rl.runtime.episodes import ControllerConfig

    return ControllerConfig(hz=hz, n_obs=policy.config.n_obs,
                            n_action_steps=int(chunking.get("n_action_steps", policy.config.n_action_steps)),
                            blend_steps=int(chunking.get("blend_steps", 4)),
                            ensemble=chunking.get("mode") == "ensemble", query_every=int(chunking.get("query_every", 1)),
                            ensemble_decay=float(chunking.get("ensemble_decay", 0.01)))


def policy_inputs_on_robot(verb: str, robot: str, shapes: Any) -> tuple[Any, dict[str, tuple[int, int]]]:
    """(the robot's Ros2Config, camera -> the policy's image size) if the ROS 2 robot gives every
    observation the policy needs; a one-line error naming what is missing otherwise."""
    from robo_rl.hardware.robot import RobotSpec
    from robo_rl.hardware.ros2.robot import Ros2Config

    unsupported = [k for k in shapes.lowdim if k != "obs/qpos"]
    if unsupported:
        raise ConfigError(f"{verb}: the policy needs {unsupported}, which robot={robot} does not provide over ROS 2 "
                          "(obs/env_state exists only in the twin); train on obs_keys=[obs/qpos] for real arms")
    # camera keys obs/images/<cam>: read from the robot's ros2.cameras, resized to what the policy saw in training
    sizes = {k.rsplit("/", 1)[-1]: tuple(v) for k, v in shapes.images.items()}
    ros = Ros2Config.from_yaml(robot, RobotSpec.from_yaml(robot))
    missing = sorted(set(sizes) - {c.name for c in ros.cameras})
    if missing:
        raise ConfigError(f"{verb}: the policy needs camera(s) {missing}, which robot={robot} has no ros2.cameras "
                          f"topic for (it has {sorted(c.name for c in ros.cameras) or 'none'}); add them to "
                          f"hardware/{robot}.yaml or train without those image keys")
    return ros, sizes


# ---------------------------------------------------------------------- input checks shared with robo-rl video
def open_store(path: Any) -> EpisodeStore:
    if path is None or str(path).strip() == "":
        raise ConfigError("give the store to read: dataset=PATH (e.g. dataset=data/demos/transfer_cube)")
    store = EpisodeStore.open(str(path))
    if store.n_episodes == 0:
        store.close()
        raise ConfigError(f"{store.location}: holds no committed episodes")
    return store


def episode_index(store: EpisodeStore, value: Any) -> int:
    """A single episode index (negative counts from the end); out of range is a StoreError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"episode={value!r}: give an episode index (0..{store.n_episodes - 1})")
    store.meta(value)  # raises "episode i out of range (n committed episodes)"
    return value % store.n_episodes
