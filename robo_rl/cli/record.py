"""robo-rl record: teleop demos, or a policy's rollouts with a human taking over (RaC), recorded
into a crash-safe EpisodeStore while the Controller keeps its rate.

Episodes are started and ended from the terminal: n starts one, y ends it as a success, f as a
failure, x discards it. The space bar trips the e-stop; Ctrl-C ends the session. An episode also
ends at `episode_s` and, with a policy, at RaC's END (the correction is done). Every ended
episode is committed by the Recorder's writer process; the one open at Ctrl-C (or a crash) is
dropped, and nothing committed before is touched.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from omegaconf import DictConfig

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.cli.teleop import SessionKeys, TwinViewer, open_device, open_robot, safety_for
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
        from robo_rl.cli.eval import predictor
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


def wait_for_start(keys: SessionKeys, auto: bool) -> bool:
    """True when the next episode should start (n pressed, or auto); False if x/q-like keys ask
    nothing. Blocks, reading the terminal; Ctrl-C propagates."""
    if auto:
        return True
    while True:
        keys.pump()
        if "n" in keys.take():
            return True
        time.sleep(0.02)


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
    policy = Policy(cfg) if cfg.checkpoint else None
    cameras = list(cfg.cameras) if cfg.cameras is not None else (policy.cameras if policy else [])
    image_size = tuple(int(x) for x in (cfg.image_size or (policy.image_size if policy else (240, 320))))
    if policy is not None and cfg.robot == "sim" and not cfg.task:
        cfg.task = policy.task
    opened = open_robot(cfg, cameras, image_size)
    safety, watchdog, estop = safety_for(opened)
    keys = SessionKeys(estop=estop, episode_keys=EPISODE_KEYS)
    if keys.terminal is None and not cfg.auto_start:
        raise ConfigError("record: the episode keys need a terminal (stdin is not a TTY); run it in a terminal, "
                          "or pass auto_start=true to start episodes one after another")
    recorder = Recorder(str(cfg.out), store_schema(opened, cameras, image_size))
    device = viewer = None
    rows: list[list[str]] = []
    hz = opened.robot.spec.control_hz
    ctl_cfg = ControllerConfig(hz=hz)
    if policy is not None:
        ch = policy.chunking
        ctl_cfg = ControllerConfig(hz=hz, n_obs=policy.policy.config.n_obs,
                                   n_action_steps=int(ch.get("n_action_steps", policy.policy.config.n_action_steps)),
                                   blend_steps=int(ch.get("blend_steps", 4)))
    try:
        opened.robot.connect()
        device = open_device(cfg, opened, keys)
        operator = TeleopOperator(opened.kinematics, device)
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
        while cfg.episodes is None or index < int(cfg.episodes):
            if not cfg.auto_start:
                print(f"episode {index}: press n to start", flush=True)
            try:
                wait_for_start(keys, bool(cfg.auto_start))
            except KeyboardInterrupt:
                break
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
                recorder.add_step(store_step(obs, executed, cameras), time.monotonic() - t0, source.segment)
                viewer.sync()

            print(f"episode {index}: recording", flush=True)
            report = Controller(opened.robot, source, ctl_cfg, safety=safety, watchdog=watchdog, estop=estop,
                                on_record=on_record).run(float(cfg.episode_s), stop=stop)
            s = report.summary()
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
                print(f"stopped: {s['stopped_reason']}", flush=True)
                break
    finally:
        keys.close()
        if viewer is not None:
            viewer.close()
        if device is not None:
            device.close()
        opened.robot.close()
        recorder.close()  # waits until every ended episode is committed
    print_table(f"record: {cfg.out}", ["episode", "steps", "seconds", "success", "ended by", "tick p99 ms",
                                        "step/velocity clamps"], rows)
    print(f"{len(rows)} episode(s) committed to {cfg.out}")
    return 0
