"""The MuJoCo twin served as a ROS 2 robot: what `robo-rl sim-bridge` runs.

It reads the robot description's `ros2:` topics (hardware/<robot>.yaml, any of its layouts: per
arm, or one topic for all joints) and, at the control rate in real time: applies the newest
command on each command topic (a JointTrajectory's first point, by joint name, or a
Float64MultiArray's values in the declared order), steps the physics, and publishes
sensor_msgs/JointState on each joint-state topic (grippers in the description's wire unit, like the
real arms). A command of the wrong size or holding NaN or inf is refused and counted, never
applied, as a real controller rejects it. Every ROS 2 path (deploy, teleop, record) thereby runs
without hardware. `follow=False` plays a robot whose controller is not running: commands arrive
and are counted, and the arms stay where they are.

Cameras (none unless asked for): each renders at `camera_hz` onto its `ros2.cameras` topic, as a
sensor_msgs/Image (rgb8) or a CompressedImage (JPEG). Rendering happens in the control loop, on
the thread that owns the GL context, one camera per tick where the rates allow: the cameras' turns
are spread over the ticks so no single tick renders them all.

Serving a task (`task=transfer_cube`): the scene is the task's, and episodes follow the protocol of
robo_rl/hardware/ros2/episodes.py: deploy's `start` resets the task to the next seed (`seed`,
`seed + 1`, ...), and the episode ends at the task's success, at its time limit, or at deploy's
`end`, each reported on the status topic with the furthest stage reached. The task's disturbances
happen as in `robo-rl eval` (`disturb`). After `episodes` episodes the bridge stops.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any, Sequence

import mujoco
import numpy as np

from robo_rl.data.codecs import JpegEncoder
from robo_rl.errors import ConfigError
from robo_rl.hardware.ros2.episodes import EpisodeServer
from robo_rl.hardware.ros2.messages import CompressedImage, Header, Image, JointState, Time
from robo_rl.hardware.robot import RobotSpec
from robo_rl.hardware.ros2.robot import (COMMAND_TYPES, IMAGE_TYPES, CameraTopic, CommandTopic, Ros2Config, from_wire,
                                         to_wire)
from robo_rl.sim.robot import SimRobot, new_renderer


class SimBridge:
    def __init__(self, robot: str = "aloha", scene: str = "aloha.xml", domain_id: int | None = None,
                 transport: Any = None, prefer: str = "auto", cameras: Sequence[str] = (), camera_hz: float = 15.0,
                 image_size: tuple[int, int] = (240, 320), image_type: str | None = None, task: str | None = None,
                 seed: int = 100_000, episodes: int | None = None, disturb: bool = True, max_steps: int | None = None,
                 follow: bool = True):
        self.env = self.twin = None
        if task is not None:  # the task's scene, reset per episode through the episode protocol
            from robo_rl.sim.envs import BimanualEnv, TaskTwin
            from robo_rl.sim.tasks import TASKS

            if task not in TASKS:
                raise ConfigError(f"sim-bridge: task={task!r} unknown; tasks are {sorted(TASKS)}")
            if episodes is not None and int(episodes) < 1:
                raise ConfigError(f"sim-bridge: episodes={episodes}; give a number >= 1, or null to serve on")
            self.env = BimanualEnv(task, obs_mode="state", disturb=disturb, max_steps=max_steps)
            self.twin = TaskTwin(self.env)  # steps, disturbs and tracks the furthest stage
            self.twin.reset(seed)
            self.sim = self.env.robot
        else:
            self.sim = SimRobot(scene, robot=robot, cameras=[])
        self.seed, self.max_episodes = int(seed), None if episodes is None else int(episodes)
        self.episode: dict | None = None   # the episode being served: key (run, number), seed, ticks
        self.results: list[dict] = []       # every ended episode's status, in order
        self.episodes_started = 0
        # the wire speaks the served description (its topics, names and gripper units); the twin
        # underneath is ours, matched to it joint for joint in action order
        self.wire = RobotSpec.from_yaml(robot)
        if self.wire.action_dim != self.sim.spec.action_dim:
            raise ConfigError(f"sim-bridge: robot={robot} has {self.wire.action_dim} joints; the twin has "
                              f"{self.sim.spec.action_dim} ({', '.join(self.sim.spec.joint_names)})")
        self.config = Ros2Config.from_yaml(robot, self.wire)
        self.follow = bool(follow)
        if domain_id is not None:
            self.config = dataclasses.replace(self.config, domain_id=int(domain_id))
        self.cameras = self._check_cameras(cameras, camera_hz, image_size, image_type)
        if transport is None:
            from robo_rl.hardware.ros2.rclpy_transport import make_transport

            transport = make_transport(prefer=prefer, scope=self.config.scope())
        self.transport = transport
        self._lock = threading.Lock()
        self._command = self.sim.spec.home.astype(np.float64).copy()
        self.commands_received = 0
        self.commands_refused = 0
        self.writers_max: dict[str, int] = {}
        self._writers_checked = -np.inf
        self.frames_published = 0
        self.ticks = 0
        self.tick_s: deque[float] = deque(maxlen=30_000)  # the last 10 min of ticks' work (physics, publishing, rendering), not sleep
        self._publish = {t.topic: transport.publisher(t.topic, JointState, qos="sensor") for t in self.config.states}
        for command in self.config.commands:
            transport.subscribe(command.topic, COMMAND_TYPES[command.type],
                                lambda msg, c=command: self._on_command(c, msg))
        self.image_size = (int(image_size[0]), int(image_size[1]))
        # made here, on the thread that will step and render (GL contexts belong to one thread), so
        # the first tick does not pay for it
        self._renderer = new_renderer(self.sim.model, *self.image_size) if self.cameras else None
        for cam in self.cameras:  # the first render of a camera is slow (GL warm-up): not in a tick
            self.render(cam.name)
        self._publish_frame = {c.name: transport.publisher(c.topic, IMAGE_TYPES[c.type], qos="sensor")
                               for c in self.cameras}
        self._jpeg = {c.name: JpegEncoder(*self.image_size) for c in self.cameras if c.type == "compressed"}
        # camera i first renders at tick i * every / n, then every `every` ticks (a float: 50 / 15 Hz)
        self._every = self.sim.spec.control_hz / float(camera_hz) if self.cameras else 0.0
        self._due = [i * self._every / max(1, len(self.cameras)) for i in range(len(self.cameras))]
        self.episodes = EpisodeServer(transport) if self.env is not None else None

    @property
    def done(self) -> bool:
        """Served the episodes asked for (never, without a task or an `episodes` count)."""
        return self.max_episodes is not None and len(self.results) >= self.max_episodes

    # ------------------------------------------------------------------ episodes (task mode)
    def _handle_requests(self) -> list[dict]:
        """Apply deploy's requests on the control thread; returns the statuses to publish once
        this tick's joint states are out (a `started` must not arrive before the new state)."""
        out = []
        for req in self.episodes.take_requests():
            key, ep = (req["run"], req["episode"]), self.episode
            same = ep is not None and ep["key"] == key
            if req["event"] == "start":
                if same:  # a repeated request: answer again
                    out.append(self._started(ep) if ep["active"] else ep["ended"])
                else:  # DDS delivers one writer's messages in order: a new key is a new episode
                    if ep is not None and ep["active"]:
                        out.append(self._end(ep, "ended by deploy"))
                    out.append(self._started(self._start(key)))
            elif same:  # end
                out.append(self._end(ep, "ended by deploy") if ep["active"] else ep["ended"])
        return out

    def _start(self, key: tuple[str, int]) -> dict:
        seed = self.seed + self.episodes_started
        self.episodes_started += 1
        self.twin.reset(seed)
        with self._lock:  # hold the new scene's pose until deploy's first command of this episode
            self._command = self.sim.joint_positions().astype(np.float64)
        self.episode = {"key": key, "seed": seed, "ticks": 0, "active": True, "ended": None}
        return self.episode

    def _started(self, ep: dict) -> dict:
        return {"event": "started", "run": ep["key"][0], "episode": ep["key"][1], "seed": ep["seed"],
                "max_s": self.env.max_steps / self.sim.spec.control_hz}

    def _end(self, ep: dict, reason: str) -> dict:
        stage = self.twin.max_stage
        ep["active"] = False
        ep["ended"] = {"event": "ended", "run": ep["key"][0], "episode": ep["key"][1], "seed": ep["seed"],
                       "success": self.twin.success, "stage": self.env.task.stage_names[stage], "max_stage": stage,
                       "ticks": ep["ticks"], "reason": reason}
        self.results.append(ep["ended"])
        e = ep["ended"]
        print(f"sim-bridge: episode {e['episode']} (seed {e['seed']}): {'success' if e['success'] else 'failure'}, "
              f"stage {e['stage']}, {e['ticks']} ticks ({reason})", flush=True)
        return ep["ended"]

    def _track(self) -> dict | None:
        """After a physics step: the episode's end at success or its time limit."""
        ep = self.episode
        if ep is None or not ep["active"]:
            return None
        ep["ticks"] += 1
        if self.twin.success:
            return self._end(ep, "success")
        if ep["ticks"] >= self.env.max_steps:
            return self._end(ep, "time limit")
        return None

    def _check_cameras(self, names: Sequence[str], camera_hz: float, image_size, image_type) -> tuple[CameraTopic, ...]:
        cams = self.config.camera_topics(list(names), "sim-bridge")
        for c in cams:
            if mujoco.mj_name2id(self.sim.model, mujoco.mjtObj.mjOBJ_CAMERA, c.name) < 0:
                raise ConfigError(f"sim-bridge: the scene has no camera {c.name!r}")
        if cams and not 0 < float(camera_hz) <= self.sim.spec.control_hz:
            raise ConfigError(f"sim-bridge: camera_hz={camera_hz}; give a rate in (0, {self.sim.spec.control_hz:g}] "
                              "(frames render in the control loop)")
        if len(image_size) != 2 or min(int(v) for v in image_size) < 8:
            raise ConfigError(f"sim-bridge: image_size={list(image_size)}; give [height, width], e.g. [240, 320]")
        if image_type is not None:
            if image_type not in IMAGE_TYPES:
                raise ConfigError(f"sim-bridge: image_type={image_type!r}; choose image, compressed, or null "
                                  "(each camera's ros2.cameras type)")
            cams = tuple(dataclasses.replace(c, type=image_type) for c in cams)
        return cams

    def _on_command(self, command: CommandTopic, msg: Any) -> None:
        if command.type == "trajectory":
            if not msg.points:
                return
            by_name = dict(zip(msg.joint_names, msg.points[0].positions))
            values = [by_name.get(j, np.nan) for j in command.joints]  # a joint not named: refused below
        else:
            values = list(msg.data)
        values = np.asarray(values, dtype=np.float64)
        with self._lock:
            self.commands_received += 1
            if values.shape != (len(command.indices),) or not np.isfinite(values).all():
                self.commands_refused += 1
                return
            if not self.follow:
                return
            for i, v in from_wire(self.wire, dict(zip(command.indices, values))).items():
                self._command[i] = v

    def step(self) -> None:
        """One control tick: apply the newest command, step, publish joint states, and render and
        publish the camera frames that are due. Serving a task, deploy's episode requests are
        applied first and the episode's stage is tracked."""
        statuses = self._handle_requests() if self.episodes is not None else []
        with self._lock:
            command = self._command.copy()
        (self.twin or self.sim).act(command)
        if self.twin is not None:
            ended = self._track()
            if ended is not None:
                statuses.append(ended)
        qpos, qvel = self.sim.joint_positions(), self.sim.joint_velocities()
        wire, wire_vel = to_wire(self.wire, qpos), to_wire(self.wire, qvel, velocity=True)
        stamp = Time.now()
        for states in self.config.states:
            self._publish[states.topic](JointState(Header(stamp), list(states.joints),
                                                   [float(wire[i]) for i in states.indices],
                                                   [float(wire_vel[i]) for i in states.indices], []))
        for i, cam in enumerate(self.cameras):
            if self.ticks >= self._due[i]:
                self._due[i] += self._every
                self._publish_frame[cam.name](self._frame_message(cam, self.render(cam.name), stamp))
                self.frames_published += 1
        for status in statuses:
            self.episodes.publish(**status)
        self.ticks += 1

    def render(self, camera: str) -> np.ndarray:
        """The camera's view of the twin now, uint8 HWC RGB at image_size."""
        if self._renderer is None:
            self._renderer = new_renderer(self.sim.model, *self.image_size)
        self._renderer.update_scene(self.sim.data, camera)
        return self._renderer.render()

    def _frame_message(self, cam: CameraTopic, rgb: np.ndarray, stamp: Time) -> Image | CompressedImage:
        header = Header(stamp, cam.name)
        if cam.type == "compressed":  # image_transport's format: an rgb8 image, JPEG-compressed
            return CompressedImage(header, "rgb8; jpeg compressed bgr8", self._jpeg[cam.name].encode(rgb))
        h, w = rgb.shape[:2]
        return Image(header, h, w, "rgb8", 0, 3 * w, rgb.tobytes())

    def run(self, duration_s: float | None = None) -> None:
        """Tick at the control rate in real time until `duration_s` (None: forever)."""
        period = 1.0 / self.sim.spec.control_hz
        start = time.perf_counter()
        next_tick = start
        done_at = None
        while duration_s is None or time.perf_counter() - start < duration_s:
            if self.done:  # serve on for half a second, so the last episode's status reaches deploy
                done_at = done_at or time.perf_counter()
                if time.perf_counter() - done_at > 0.5:
                    break
            t0 = time.perf_counter()
            self.step()
            self.tick_s.append(time.perf_counter() - t0)
            self.count_writers()
            next_tick += period
            delay = next_tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.perf_counter()  # late: start the schedule afresh rather than rush to catch up

    def count_writers(self, always: bool = False) -> None:
        """The most writers seen at once on each command topic (more than one: two drivers fought
        over the arm). Recounted only when DDS discovered a writer appear or go (rclpy: every 0.5 s)."""
        count = getattr(self.transport, "other_writers", None)
        if count is None:
            return
        changed = getattr(self.transport, "publications_changed", None)
        if not always:
            if changed is not None:
                if not changed():
                    return
            elif time.monotonic() - self._writers_checked < 0.5:
                return
        self._writers_checked = time.monotonic()
        for command in self.config.commands:
            self.writers_max[command.topic] = max(self.writers_max.get(command.topic, 0), count(command.topic))

    def writers_summary(self) -> str:
        """Per command topic, the most writers seen at once."""
        self.count_writers(always=True)
        return "; ".join(f"{topic}: {n} writer{'' if n == 1 else 's'} at most" for topic, n in self.writers_max.items()) \
            or "no writer count (the transport has none)"

    def tick_summary(self) -> str:
        """The ticks' work time, for the line the CLI prints at exit."""
        if not self.tick_s:
            return "no ticks"
        ms = np.asarray(self.tick_s) * 1e3
        period = 1e3 / self.sim.spec.control_hz
        return (f"{self.ticks} ticks, work (last {len(ms)}) p50 {np.percentile(ms, 50):.2f} / p99 {np.percentile(ms, 99):.2f} / "
                f"max {ms.max():.2f} ms of a {period:.0f} ms period ({int((ms > period).sum())} over); "
                f"{self.frames_published} camera frames")

    def close(self) -> None:
        self.transport.close()
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.sim.close()
