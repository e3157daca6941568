"""robo-rl record: teleop demos, or a policy's rollouts with a human taking over (RaC), recorded
into a crash-safe EpisodeStore while the Controller keeps its rate.

Episodes are started and ended from the terminal: n starts one, y ends it as a success, f as a
failure, x discards it. The space bar trips the e-stop; Ctrl-C ends the session. An episode also
ends at `episode_s` and, with a policy, at RaC's END (the correction is done). Every ended
episode is committed by the Recorder's writer process; the one open at Ctrl-C (or a crash) is
dropped, and nothing committed before is touched.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from omegaconf import DictConfig

from robo_rl.cli.app import run_app
from robo_rl.cli.session import (SessionKeys, TwinViewer, check_device, check_live_view, close_session, listen_estop,
                                 open_device, open_live_view, open_robot, policy_inputs_on_robot, print_live_summary,
                                 safety_for)
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError

EPISODE_KEYS = "nyfx"


def main(argv: list[str]) -> int:
    return run_app("record", "record", run, argv)


def store_schema(opened: Any, cameras: list[str], image_size: tuple[int, int] | None) -> Any:
    """The store's keys for this robot. `image_size` None: each camera at its full size (the
    robot description's), the store keeping training-size copies beside."""
    from robo_rl.data.schema import Schema

    spec = opened.robot.spec
    described = spec.camera_sizes
    if image_size is None and set(cameras) - set(described):
        raise ConfigError(f"record: camera(s) {sorted(set(cameras) - set(described))} are not in robot={spec.name}'s "
                          f"cameras ({sorted(described) or 'none'})")
    n = spec.action_dim
    keys = {"obs/qpos": ((n,), "float32"), "obs/qvel": ((n,), "float32"), "action": ((n,), "float32")}
    if opened.twin is not None:  # the twin also knows where the objects are
        keys["obs/env_state"] = (opened.twin.observation_space["env_state"].shape, "float32")
    keys.update({f"obs/images/{c}": ((*(image_size or described[c]), 3), "uint8") for c in cameras})
    return Schema.build(keys, fps=spec.control_hz, robot=spec.name)


class Policy:
    """A checkpoint's policy for intervention recording: what it observes and how it runs."""

    def __init__(self, cfg: DictConfig):
        from robo_rl.policies.inference import predictor
        from robo_rl.policies import load_policy, read_checkpoint

        ckpt = read_checkpoint(cfg.checkpoint)
        self.policy = load_policy(ckpt)
        self.task = ckpt.get("task")
        self.chunking = ckpt.get("chunking") or {}
        self.predict = predictor(self.policy, cfg.inference_steps)
        shapes = self.policy.shapes
        self.cameras = [k.rsplit("/", 1)[-1] for k in shapes.images]
        self.image_size = tuple(next(iter(shapes.images.values()), ()))  # empty: a policy with no camera

    def sources(self, operator: Any, ctl_cfg: Any, stage: Any, mode: str) -> Any:
        """The RaC protocol's source, the one the twin's intervention collection runs."""
        from robo_rl.rac.intervention import InterventionConfig, InterventionController
        from robo_rl.runtime.sources import Interventions, PerRobot, PolicyChunks

        return Interventions(PerRobot([PolicyChunks(self.predict, ctl_cfg)]),
                             [InterventionController(operator, InterventionConfig(mode))], [stage])


def wait_for_start(keys: SessionKeys, estop: Any) -> bool:
    """Blocks, reading the terminal, until n is pressed (True) or the e-stop trips (False)."""
    while not estop.tripped:
        keys.pump()
        if "n" in keys.take():
            return True
        time.sleep(0.02)
    return False


class RecordSession:
    """The episode loop's hooks for `robo-rl record`: an episode starts on n (or at once with
    auto_start), each recorded tick goes to the Recorder with its label, and each ended episode
    is committed (y / f / the time limit / RaC's END) or discarded (x, Ctrl-C, nothing recorded)."""

    def __init__(self, cfg: DictConfig, opened: Any, keys: SessionKeys, estop: Any, recorder: Any, operator: Any,
                 sources: Any, cameras: list[str], viewer: Any, live: Any, has_policy: bool, device_name: str):
        self.cfg, self.opened, self.keys, self.estop, self.recorder = cfg, opened, keys, estop, recorder
        self.operator, self.sources, self.cameras, self.viewer, self.live = operator, sources, cameras, viewer, live
        self.has_policy, self.device_name = has_policy, device_name
        self.hz = opened.robot.spec.control_hz
        self.index, self.rows, self.stopped = 0, [], ""  # stopped: why the session stopped early, if it did
        self.extra: dict[str, Any] = {}
        self.decision = ""  # the key that ended the open episode: y, f or x
        self.t0 = 0.0

    def start(self, i: int) -> Any:
        from robo_rl.data.schema import EpisodeMeta
        from robo_rl.runtime.episodes import Episode

        cfg, opened = self.cfg, self.opened
        if (cfg.episodes is not None and self.index >= int(cfg.episodes)) or self.estop.tripped or self.stopped:
            return None
        if not cfg.auto_start:
            print(f"episode {self.index}: press n to start", flush=True)
            if not wait_for_start(self.keys, self.estop):
                return None
        safety, watchdog, _ = safety_for(opened)  # per episode: its table counts its own clamps
        seed = int(cfg.seed) + self.index
        self.extra = {}
        if opened.twin is not None:  # a fresh scene, and what replay needs to restore it
            opened.robot.reset(seed)
            self.extra = {"seed": seed, "init_state": opened.twin.sim_state().tolist()}
        self.operator.reset()
        self.recorder.start_episode(EpisodeMeta(task=str(cfg.task or ""), source=str(cfg.mode) if self.has_policy
                                                else "teleop", operator=f"human_{self.device_name}", extra=self.extra))
        self.decision, self.t0 = "", time.monotonic()
        print(f"episode {self.index}: recording", flush=True)
        if self.live is not None:
            self.live.mark(f"episode {self.index}: recording")
        return Episode(max_ticks=int(round(float(cfg.episode_s) * self.hz)), stop=self.decided, safety=safety,
                       watchdog=watchdog, end_on_success=False, end_on_time_limit=False)

    def decided(self) -> bool:
        if not self.decision:  # the keys after the deciding one stay queued for the next episode
            self.decision = next((k for k in self.keys.take(until="yfx") if k in "yfx"), "")
        return bool(self.decision)

    def step(self, i: int, obs: Any, executed: np.ndarray, segment: Any, outcome: Any) -> None:
        from robo_rl.runtime.episodes import store_step

        step = store_step(obs, executed, self.cameras)
        self.recorder.add_step(step, time.monotonic() - self.t0, segment)
        self.viewer.sync()
        if self.live is not None:  # view=true: never blocks (a full queue drops the step)
            self.live.step(step, segment)

    def end(self, i: int, report: Any, outcome: Any) -> None:
        s, index, opened = report.summary(), self.index, self.opened
        if s["stopped_reason"] and report.recorded == 0:
            self.recorder.discard_episode()
            print(f"episode {index}: not started: {s['stopped_reason']}", flush=True)
            self.stopped = s["stopped_reason"]  # a tripped e-stop stays tripped: no episode could start
            return
        if report.interrupted or report.recorded == 0 or self.decision == "x":
            self.recorder.discard_episode()
            print(f"episode {index}: discarded", flush=True)
            return
        marked = {"y": True, "f": False}.get(self.decision)
        ended = self.sources.ended(0)
        why = f"marked {self.decision}" if marked is not None else ("RaC end" if ended else "time limit")
        updates: dict[str, Any] = {"ended": why, "marked_success": marked}
        if opened.twin is not None:  # the twin knows: its verdict is the label, the human's mark is kept beside it
            success = opened.robot.success
            updates["max_stage"] = opened.robot.max_stage
        else:
            success = marked
        if self.has_policy:
            updates["interventions"] = [r.to_json() for r in self.sources.controllers[0].interventions]
        if s["stopped_reason"]:
            updates["stopped"] = s["stopped_reason"]
            success = False
        saved = self.recorder.end_episode(success=success, extra={**self.extra, **updates})
        self.rows.append([str(saved), str(report.recorded), f"{report.recorded / self.hz:.1f}", str(success), why,
                          f"{s['period_p99_ms']:.2f}", str(s.get("step_limit", 0) + s.get("velocity_limit", 0))])
        print(f"episode {index}: saved as {saved} ({report.recorded} steps, success {success}, {why})", flush=True)
        self.index += 1
        self.stopped = s["stopped_reason"]


def run(cfg: DictConfig) -> int:
    from robo_rl.data.recorder import Recorder
    from robo_rl.data.store import DEFAULT_IMAGE_CODEC
    from robo_rl.runtime.episodes import ControllerConfig, run_episodes
    from robo_rl.runtime.sources import OperatorCommands, PerRobot, observation_window
    from robo_rl.sim.teleop import TeleopOperator

    if not cfg.out:
        raise ConfigError("record: pass out=PATH (the episode store to create or append to)")
    if cfg.mode not in ("rac", "hg_dagger"):
        raise ConfigError(f"record: mode={cfg.mode!r}; choose rac or hg_dagger")
    if cfg.episode_s is None or float(cfg.episode_s) <= 0:
        raise ConfigError(f"record: episode_s={cfg.episode_s!r}; give an episode's time limit in seconds (> 0)")
    check_device(cfg)
    check_live_view(cfg)  # view=true
    if not cfg.auto_start and not sys.stdin.isatty():  # SessionKeys reads the terminal only when stdin is one
        raise ConfigError("record: the episode keys need a terminal (stdin is not a TTY); run it in a terminal, "
                          "or pass auto_start=true to start episodes one after another")
    policy = Policy(cfg) if cfg.checkpoint else None
    cameras = list(cfg.cameras) if cfg.cameras is not None else (policy.cameras if policy else [])
    from robo_rl.learn.recipes import CAMERA_MIN_FRAME  # the size the camera recipe trains on

    image_size = tuple(int(x) for x in (cfg.image_size or ((policy and policy.image_size) or CAMERA_MIN_FRAME)))
    if policy is not None:
        if cfg.task and policy.task and cfg.task != policy.task and cfg.robot == "sim":
            raise ConfigError(f"record: task={cfg.task} but the policy was trained on {policy.task}; drop task= to use "
                              "the policy's")
        cfg.task = cfg.task or policy.task
        if sorted(cameras) != sorted(policy.cameras) or (policy.cameras and image_size != policy.image_size):
            raise ConfigError(f"record: the policy sees cameras {policy.cameras} at {list(policy.image_size)}; "
                              f"cameras={cameras} image_size={list(image_size)} differ (leave both unset)")
        if cfg.robot != "sim":
            policy_inputs_on_robot("record", str(cfg.robot), policy.policy.shapes)
    elif cfg.robot == "sim" and not cfg.task:
        cfg.task = "transfer_cube"
    # real cameras: full frames, JPEG by default (bench/lossy_codecs.py), with copies at image_size
    # for training; the twin renders at image_size and stores losslessly unless asked
    real = cfg.robot != "sim"
    opened = open_robot(cfg, cameras, None if real else image_size)
    _, _, estop = safety_for(opened)
    listen_estop(opened.robot, cfg.estop_topic, estop)
    keys = live = recorder = device = viewer = session = None
    hz = opened.robot.spec.control_hz
    ctl_cfg = ControllerConfig(hz=hz)
    if policy is not None:
        from robo_rl.cli.session import controller_config

        ctl_cfg = controller_config(policy.policy, policy.chunking, hz)
    try:
        # view=true: the Rerun viewer (robo_rl/cli/view.py), first: if it cannot open, the terminal is as it was
        live = open_live_view(cfg, "record", opened.robot.spec.joint_names)
        keys = SessionKeys(estop=estop, episode_keys=EPISODE_KEYS)
        recorder = Recorder(str(cfg.out), store_schema(opened, cameras, None if real else image_size),
                            image_codec=cfg.image_codec or ("jpeg" if real else DEFAULT_IMAGE_CODEC),
                            image_quality=int(cfg.image_quality), train_image_size=image_size if real else None)
        opened.robot.connect()
        device = open_device(cfg, opened, keys)
        # HG-DAgger's human corrects at once: no RECOVERY steps (as in robo-rl rac)
        operator = TeleopOperator(None if cfg.teleop == "leader" else opened.kinematics, device,
                                  recover=cfg.mode == "rac" or policy is None, spec=opened.robot.spec)
        viewer = TwinViewer(opened, keys)
        if policy is not None:  # warm up: the first call traces the sampler, which must not happen mid-episode
            policy.predict(observation_window([opened.robot.observe()] * ctl_cfg.n_obs))
            stage = (lambda: opened.twin.task.stage(opened.twin.robot)) if opened.twin is not None else None
            sources = policy.sources(operator, ctl_cfg, stage, str(cfg.mode))
        else:
            sources = PerRobot([OperatorCommands(operator)])
        what = "teleop demos" if policy is None else f"{cfg.mode} interventions on {policy.policy.name}"
        print(f"record {what} with {cfg.teleop} on {cfg.robot} into {cfg.out} at {hz:.0f} Hz, cameras {cameras or 'none'}",
              flush=True)
        print("keys: n start an episode · y end, success · f end, failure · x discard · space e-stop · Ctrl-C quit"
              + (" · t / r / c take over, recovery done, correction done" if policy is not None else ""), flush=True)
        session = RecordSession(cfg, opened, keys, estop, recorder, operator, sources, cameras, viewer, live,
                                policy is not None, device.name)
        run_episodes([opened.robot], sources, ctl_cfg, session, estop=estop)
    except KeyboardInterrupt:  # outside the control loop (at a reset): ended episodes are kept
        print("interrupted", flush=True)
    finally:
        # the recorder waits for every commit; the live view last (its close waits for its queue)
        close_session(keys, viewer, device, opened.robot, recorder, live)
    rows = session.rows if session is not None else []
    stopped = session.stopped if session is not None else ""
    print_live_summary(live)
    print_table(f"record: {cfg.out}", ["episode", "steps", "seconds", "success", "ended by", "tick p99 ms",
                                        "step/velocity clamps"], rows)
    print(f"{len(rows)} episode(s) committed to {cfg.out}")
    stopped = stopped or (f"e-stop: {estop.reason}" if estop.tripped else "")
    if stopped:
        print(f"stopped: {stopped}")
        return 1
    return 0
