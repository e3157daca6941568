"""robo-rl deploy: a trained policy on the twin or on ROS 2 arms through the episode loop
(robo_rl/runtime/episodes.py) on its real-time clock, with the safety filter and watchdog of
robo_rl/hardware/safety.py."""

from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig

from robo_rl.cli.app import run_app
from robo_rl.cli.session import controller_config, policy_inputs_on_robot
from robo_rl.cli.tables import print_episodes, print_table
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("deploy", "deploy", run, argv)


def make_robot(cfg: DictConfig, policy: Any, task: str | None) -> tuple[Any, str]:
    """(the robot, the hardware description its safety limits come from), with the cameras the
    policy sees at its image size."""
    from robo_rl.cli.session import open_robot

    shapes = policy.shapes
    if cfg.robot != "sim":
        policy_inputs_on_robot("deploy", str(cfg.robot), shapes)
    cams = sorted(k.rsplit("/", 1)[-1] for k in shapes.images)
    size = tuple(next(iter(shapes.images.values()), (240, 320)))
    opened = open_robot(cfg, cams, size, task=task)
    return opened.robot, opened.hardware


def watch_estop_key(estop: Any) -> Any:
    """When stdin is a terminal, the space bar trips the e-stop (a thread polls the keys). Returns
    the event that ends the thread, or None without a terminal."""
    import sys
    import threading

    from robo_rl.hardware.teleop import TerminalKeys

    if not sys.stdin.isatty():
        return None
    done = threading.Event()

    def poll() -> None:
        keys = TerminalKeys()
        try:
            while not done.wait(0.02):
                if " " in keys.read():
                    estop.trip("space bar")
        finally:
            keys.close()

    threading.Thread(target=poll, name="estop-key", daemon=True).start()
    return done


class DeploySession:
    """The episode loop's hooks for deploy: `episodes` episodes of up to `duration` s, each with a
    fresh safety filter and watchdog; the twin in this process starts each from its next seed, a
    twin served over DDS (sim-bridge task=...) is asked to reset and says when its task ended;
    each step goes to the live view (view=true; never blocks)."""

    def __init__(self, cfg: DictConfig, robot: Any, client: Any, episodes: int, duration: float,
                 make_safety: Any, live: Any):
        self.cfg, self.robot, self.client, self.episodes, self.duration = cfg, robot, client, episodes, duration
        self.make_safety, self.live = make_safety, live
        self.k, self.served, self.outcomes = 0, None, []

    def start(self, i: int) -> Any:
        from robo_rl.runtime.episodes import Episode

        if self.k >= self.episodes:
            return None
        k, cfg, robot = self.k, self.cfg, self.robot
        limit, stop, self.served = self.duration, None, None
        if cfg.robot == "sim" and k > 0:
            robot.reset(int(cfg.seed) + k)
        elif self.client is not None:
            self.served = self.client.start(k)
            if self.served is not None:  # the twin reset its task: run on its fresh state, up to its time limit
                if not robot.wait_for_fresh(time.monotonic()):
                    raise ConfigError("deploy: the twin reset its task but no fresh joint states or frames "
                                      "followed within 2 s")
                limit = float(self.served["max_s"]) + 1.0
                stop = (lambda: self.client.ended(k) is not None)
        safety, watchdog = self.make_safety()
        # the episode's limits rule (as on a real robot): the twin's own verdict does not end it
        return Episode(max_ticks=int(round(limit * robot.spec.control_hz)), stop=stop, safety=safety,
                       watchdog=watchdog, end_on_success=False, end_on_time_limit=False)

    def step(self, i: int, obs: Any, executed: Any, segment: Any, outcome: Any) -> None:
        if self.live is not None:
            from robo_rl.data.viewer import observation_values

            self.live.step(observation_values(obs, executed), segment)

    def end(self, i: int, report: Any, outcome: Any) -> None:
        if self.cfg.robot == "sim":
            self.outcomes.append({"seed": int(self.cfg.seed) + self.k, "success": self.robot.success,
                                  "stage": self.robot.env.task.stage_names[self.robot.max_stage], "ticks": report.ticks})
        elif self.served is not None:
            ended = self.client.end(self.k)
            if ended is not None:
                self.outcomes.append(ended)
        self.k += 1


def run(cfg: DictConfig) -> int:
    from robo_rl.policies.inference import predictor
    from robo_rl.cli.session import close_session, listen_estop
    from robo_rl.cli.session import check_live_view, open_live_view, print_live_summary
    from robo_rl.hardware.safety import EStop, SafetyConfig, SafetyFilter, Watchdog
    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.runtime.episodes import run_episodes
    from robo_rl.runtime.sources import as_sources, observation_window

    if not cfg.checkpoint:
        raise ConfigError("deploy: pass checkpoint=PATH (a policy trained with robo-rl train)")
    check_live_view(cfg)  # view=true
    ckpt = read_checkpoint(cfg.checkpoint)
    policy = load_policy(ckpt)
    if cfg.rtc:  # eager sampling with a guidance pass per step: no frozen graph
        from robo_rl.policies.rtc import RtcPredictor

        if cfg.critic:
            raise ConfigError("deploy: rtc=true and critic= do not combine (the critic picks among free chunks)")
        predict = RtcPredictor(policy, steps=cfg.inference_steps)
    else:
        predict = predictor(policy, cfg.inference_steps)
    if cfg.critic:  # value-guided chunk selection (best of critic_samples), checked before the robot opens
        from robo_rl.cli.session import value_guided

        predict = value_guided(predict, cfg.critic, int(cfg.critic_samples), policy, cfg.task or ckpt.get("task"),
                               ckpt.get("chunking") or {})
    episodes = cfg.episodes
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise ConfigError(f"deploy: episodes={episodes!r}; give a number >= 1")
    robot, hardware = make_robot(cfg, policy, cfg.task or ckpt.get("task"))
    safety_cfg = SafetyConfig.from_yaml(hardware)
    ctl_cfg = controller_config(policy, ckpt.get("chunking") or {}, robot.spec.control_hz)
    ctl_cfg.rtc = bool(cfg.rtc)
    if cfg.rtc or cfg.n_action_steps is not None:  # both are ways of running a chunk for a while: receding
        ctl_cfg.ensemble = False
    if cfg.n_action_steps is not None:
        if not 1 <= int(cfg.n_action_steps) <= policy.config.horizon:
            raise ConfigError(f"deploy: n_action_steps={cfg.n_action_steps}; give 1..{policy.config.horizon} "
                              "(the policy's horizon)")
        ctl_cfg.n_action_steps = int(cfg.n_action_steps)
    duration = cfg.duration
    if duration is None:
        duration = robot.env.max_steps / robot.spec.control_hz if cfg.robot == "sim" else 30.0
    live = keys = None
    report, outcomes = None, []
    try:
        # view=true: the Rerun viewer (robo_rl/cli/view.py), first: if it cannot open, nothing was connected
        live = open_live_view(cfg, "deploy", robot.spec.joint_names)
        robot.connect()
        first = robot.observe()  # warm-up: the first call traces the sampler, which must not happen mid-run
        if cfg.rtc:  # a plain and a guided chunk
            predict.warm_up(observation_window([first] * ctl_cfg.n_obs))
        else:
            predict(observation_window([first] * ctl_cfg.n_obs))
        estop = EStop()
        listen_estop(robot, cfg.estop_topic, estop)
        keys = watch_estop_key(estop)
        client = None
        if cfg.robot != "sim":  # a twin serving a task (sim-bridge task=...) answers; a real robot does not
            from robo_rl.hardware.ros2.episodes import EpisodeClient

            client = EpisodeClient(robot.transport)
        print(f"deploy {policy.name} on {cfg.robot} at {ctl_cfg.hz:.0f} Hz, {episodes} episode(s) of up to "
              f"{float(duration):g} s (space: e-stop{'' if cfg.robot == 'sim' else f', or True on {cfg.estop_topic}'}; "
              "Ctrl-C stops)", flush=True)
        session = DeploySession(cfg, robot, client, episodes, float(duration),
                                lambda: (SafetyFilter(robot.spec, safety_cfg), Watchdog(safety_cfg)), live)
        report = run_episodes([robot], as_sources(predict, ctl_cfg), ctl_cfg, session, estop=estop)
        outcomes = session.outcomes
    finally:
        if keys is not None:
            keys.set()
        close_session(robot, live)  # the live view last: its close waits for its queue
    print_live_summary(live)
    s = report.summary()
    rows = [["ticks", str(s["ticks"])],
            ["tick period p50 / p99 / max", f"{s['period_p50_ms']:.2f} / {s['period_p99_ms']:.2f} / {s['period_max_ms']:.2f} ms"],
            ["overruns (a tick > 1 period late)", str(s["overruns"])],
            ["inference p50 / p99", f"{s['inference_p50_ms']:.1f} / {s['inference_p99_ms']:.1f} ms"],
            ["chunks; late (missed the next tick); actions dropped late; ticks held",
             f"{s['chunks']}; {s['late_chunks']}; {s['dropped_actions']}; {s['missing_actions']}"],
            ["largest joint jump at a chunk hand-over", f"{s['handover_jump_max']:.3f} rad"
             + (" (rtc)" if cfg.rtc else " (ensemble)" if ctl_cfg.ensemble else f" (blend {ctl_cfg.blend_steps})")],
            ["watchdog holds / stops", f"{s['watchdog_holds']} / {s['watchdog_stops']}"],
            ["safety: nonfinite, position, gripper, step, velocity",
             ", ".join(str(s.get(k, 0)) for k in ("nonfinite", "position_limit", "gripper_range", "step_limit",
                                                  "velocity_limit"))]]
    if len(outcomes) == 1:
        o = outcomes[0]
        rows.append(["task stage reached", f"{o['stage']} (success: {o['success']})"])
    print_table(f"deploy: {cfg.checkpoint}", ["measure", "value"], rows)
    if len(outcomes) > 1:
        print_episodes("deploy", outcomes)
    if cfg.critic:  # value-guided chunk selection
        print(predict.describe())
    if s["stopped_reason"]:
        print(f"stopped: {s['stopped_reason']}")
        return 1
    return 0
