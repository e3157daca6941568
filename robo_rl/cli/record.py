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


def store_schema(opened: Any, cameras: list[str], image_size: tuple[int, int]) -> Any:
    from robo_rl.data.schema import Schema

    spec = opened.robot.spec
    n = spec.action_dim
    keys = {"obs/qpos": ((n,), "float32"), "obs/qvel": ((n,), "float32"), "action": ((n,), "float32")}
    if opened.twin is not None:  # the twin also knows where the objects are
        keys["obs/env_state"] = (opened.twin.observation_space["env_state"].shape, "float32")
    keys.update({f"obs/images/{c}": ((*image_size, 3), "uint8") for c in cameras})
    return Schema.build(keys, fps=spec.control_hz, robot=spec.name)


def store_step(obs: Any, executed: np.ndarray, cameras: list[str]) -> dict[str, Any]:
    """The robot gives frames at the store's size (the twin renders them so, Ros2Robot resizes)."""
    step = {"obs/qpos": obs.qpos, "obs/qvel": obs.qvel, "action": executed, **obs.extra}
    step.update({f"obs/images/{cam}": obs.images[cam] for cam in cameras})
    return step


class Policy:
    """A checkpoint's policy for intervention recording: what it observes and how it runs."""

    def __init__(self, cfg: DictConfig):
        from robo_rl.policies.common import predictor
        from robo_rl.policies import load_policy, read_checkpoint

        ckpt = read_checkpoint(cfg.checkpoint)
        self.policy = load_policy(ckpt)
        self.task = ckpt.get("task")
        self.chunking = ckpt.get("chunking") or {}
        self.predict = predictor(self.policy, cfg.inference_steps)
        shapes = self.policy.shapes
        self.cameras = [k.rsplit("/", 1)[-1] for k in shapes.images]
        self.image_size = tuple(next(iter(shapes.images.values()), (240, 320)))

    def source(self, operator: Any, ctl_cfg: Any, stage: Any, mode: str) -> Any:
        from robo_rl.rac.intervention import InterventionConfig, InterventionController
        from robo_rl.runtime.controller import PolicyChunks
        from robo_rl.runtime.sources import Interventions

        return Interventions(PolicyChunks(self.predict, ctl_cfg), InterventionController(operator, InterventionConfig(mode)),
                             stage)


def wait_for_start(keys: SessionKeys, estop: Any) -> bool:
    """Blocks, reading the terminal, until n is pressed (True) or the e-stop trips (False)."""
    while not estop.tripped:
        keys.pump()
        if "n" in keys.take():
            return True
        time.sleep(0.02)
    return False


def run(cfg: DictConfig) -> int:
    from robo_rl.data.recorder import Recorder
    from robo_rl.data.schema import EpisodeMeta
    from robo_rl.runtime.controller import Controller, ControllerConfig
    from robo_rl.runtime.sources import OperatorCommands
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
    image_size = tuple(int(x) for x in (cfg.image_size or (policy.image_size if policy else (240, 320))))
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
    opened = open_robot(cfg, cameras, image_size)
    _, _, estop = safety_for(opened)
    listen_estop(opened.robot, cfg.estop_topic, estop)
    keys = live = recorder = device = viewer = None
    rows: list[list[str]] = []
    stopped = ""  # why the session stopped early (e-stop, watchdog), if it did
    hz = opened.robot.spec.control_hz
    ctl_cfg = ControllerConfig(hz=hz)
    if policy is not None:
        from robo_rl.cli.session import controller_config

        ctl_cfg = controller_config(policy.policy, policy.chunking, hz)
    try:
        # view=true: the Rerun viewer (robo_rl/cli/view.py), first: if it cannot open, the terminal is as it was
        live = open_live_view(cfg, "record", opened.robot.spec.joint_names)
        keys = SessionKeys(estop=estop, episode_keys=EPISODE_KEYS)
        recorder = Recorder(str(cfg.out), store_schema(opened, cameras, image_size))
        opened.robot.connect()
        device = open_device(cfg, opened, keys)
        # HG-DAgger's human corrects at once: no RECOVERY steps (as in robo-rl rac)
        operator = TeleopOperator(None if cfg.teleop == "leader" else opened.kinematics, device,
                                  recover=cfg.mode == "rac" or policy is None, spec=opened.robot.spec)
        viewer = TwinViewer(opened, keys)
        if policy is not None:  # warm up: the first call traces the sampler, which must not happen mid-episode
            from robo_rl.runtime.controller import observation_window

            policy.predict(observation_window([opened.robot.observe()] * ctl_cfg.n_obs))
        what = "teleop demos" if policy is None else f"{cfg.mode} interventions on {policy.policy.name}"
        print(f"record {what} with {cfg.teleop} on {cfg.robot} into {cfg.out} at {hz:.0f} Hz, cameras {cameras or 'none'}",
              flush=True)
        print("keys: n start an episode · y end, success · f end, failure · x discard · space e-stop · Ctrl-C quit"
              + (" · t / r / c take over, recovery done, correction done" if policy is not None else ""), flush=True)
        index = 0
        while (cfg.episodes is None or index < int(cfg.episodes)) and not estop.tripped:
            if not cfg.auto_start:
                print(f"episode {index}: press n to start", flush=True)
            try:
                if not cfg.auto_start and not wait_for_start(keys, estop):
                    break
            except KeyboardInterrupt:
                break
            safety, watchdog, _ = safety_for(opened)  # per episode: its table counts its own clamps
            seed = int(cfg.seed) + index
            extra: dict[str, Any] = {}
            if opened.twin is not None:  # a fresh scene, and what replay needs to restore it
                opened.robot.reset(seed)
                extra = {"seed": seed, "init_state": opened.twin.sim_state().tolist()}
            operator.reset()
            stage = (lambda: opened.twin.task.stage(opened.twin.robot)) if opened.twin is not None else None
            source = OperatorCommands(operator) if policy is None else policy.source(operator, ctl_cfg, stage, str(cfg.mode))
            recorder.start_episode(EpisodeMeta(task=str(cfg.task or ""), source="teleop" if policy is None else str(cfg.mode),
                                               operator=f"human_{device.name}", extra=extra))
            t0 = time.monotonic()
            decision: list[str] = []

            def stop() -> bool:
                decision.extend(k for k in keys.take() if k in "yfx")
                return bool(decision) or getattr(source, "ended", False)

            def on_record(obs: Any, executed: np.ndarray) -> None:
                step = store_step(obs, executed, cameras)
                recorder.add_step(step, time.monotonic() - t0, source.segment)
                viewer.sync()
                if live is not None:  # view=true: never blocks (a full queue drops the step)
                    live.step(step, source.segment)

            print(f"episode {index}: recording", flush=True)
            if live is not None:
                live.mark(f"episode {index}: recording")
            report = Controller(opened.robot, source, ctl_cfg, safety=safety, watchdog=watchdog, estop=estop,
                                on_record=on_record).run(float(cfg.episode_s), stop=stop)
            s = report.summary()
            if s["stopped_reason"] and report.recorded == 0:
                recorder.discard_episode()
                print(f"episode {index}: not started: {s['stopped_reason']}", flush=True)
                stopped = s["stopped_reason"]
                break  # a tripped e-stop stays tripped: no episode could start
            if report.interrupted or report.recorded == 0 or (decision and decision[0] == "x"):
                recorder.discard_episode()
                print(f"episode {index}: discarded", flush=True)
                if report.interrupted:
                    break
                continue
            key = decision[0] if decision else ""
            marked = {"y": True, "f": False}.get(key)
            why = f"marked {key}" if marked is not None else ("RaC end" if getattr(source, "ended", False) else "time limit")
            updates: dict[str, Any] = {"ended": why, "marked_success": marked}
            if opened.twin is not None:  # the twin knows: its verdict is the label, the human's mark is kept beside it
                success = opened.robot.success
                updates["max_stage"] = opened.robot.max_stage
            else:
                success = marked
            if policy is not None:
                updates["interventions"] = [i.to_json() for i in source.interventions.interventions]
            if s["stopped_reason"]:
                updates["stopped"] = s["stopped_reason"]
                success = False
            saved = recorder.end_episode(success=success, extra={**extra, **updates})
            rows.append([str(saved), str(report.recorded), f"{report.recorded / hz:.1f}", str(success), why,
                         f"{s['period_p99_ms']:.2f}", str(s.get("step_limit", 0) + s.get("velocity_limit", 0))])
            print(f"episode {index}: saved as {saved} ({report.recorded} steps, success {success}, {why})", flush=True)
            index += 1
            if s["stopped_reason"]:
                stopped = s["stopped_reason"]
                break
    except KeyboardInterrupt:  # outside the control loop (between episodes, at a reset): ended episodes are kept
        print("interrupted", flush=True)
    finally:
        # the recorder waits for every commit; the live view last (its close waits for its queue)
        close_session(keys, viewer, device, opened.robot, recorder, live)
    print_live_summary(live)
    print_table(f"record: {cfg.out}", ["episode", "steps", "seconds", "success", "ended by", "tick p99 ms",
                                        "step/velocity clamps"], rows)
    print(f"{len(rows)} episode(s) committed to {cfg.out}")
    stopped = stopped or (f"e-stop: {estop.reason}" if estop.tripped else "")
    if stopped:
        print(f"stopped: {stopped}")
        return 1
    return 0
