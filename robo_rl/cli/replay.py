"""robo-rl replay: re-run recorded episodes in the MuJoCo twin and report how far they drift
(the engine is robo_rl.sim.replay), or play one back on a robot over ROS 2 (robot=aloha) through
the fixed-rate Controller with its safety filter, and report how closely the robot follows."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from robo_rl.cli.app import run_store_app
from robo_rl.cli.session import episode_index, open_store
from robo_rl.cli.tables import print_table
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.sim.replay import ReplayResult, check_fits, load_episode, make_env, replay_episode

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    return run_store_app("replay", run, argv)


# ---------------------------------------------------------------------- the verb
def _fmt(x: float) -> str:
    return f"{x:.2e}"


def _stage(res: ReplayResult, stage: int | None) -> str:
    if stage is None:
        return "n/a"
    name = res.stage_names[stage] if 0 <= stage < len(res.stage_names) else "?"
    return f"{stage} ({name})"


def run(cfg: DictConfig) -> int:
    store = open_store(cfg.dataset)
    if cfg.robot != "sim":
        return replay_on_robot(cfg, store)
    with store:
        every = isinstance(cfg.episode, str) and cfg.episode.lower() == "all"
        if every:
            indices = list(range(store.n_episodes))
        else:
            indices = [episode_index(store, cfg.episode)]
        if cfg.tolerance is None or float(cfg.tolerance) < 0:
            raise ConfigError(f"tolerance={cfg.tolerance!r}: give a non-negative joint divergence bound")
        episodes, skipped = [], []
        for i in indices:
            if every and not (isinstance(store.meta(i).extra, dict) and store.meta(i).extra.get("init_state")):
                skipped.append(i)
                continue
            episodes.append(load_episode(store, i, cfg.task))
        if not episodes:
            raise ConfigError(f"{store.location}: no episode has a recorded initial state (meta.extra['init_state']), "
                              f"so none can be replayed in the twin")
        location = store.location

    envs: dict[str, Any] = {}
    results: list[ReplayResult] = []
    try:
        for ep in episodes:  # every problem is reported before the first step runs
            if ep.task not in envs:
                envs[ep.task] = make_env(ep.task)
                envs[ep.task].robot.realtime = bool(cfg.realtime)
            check_fits(envs[ep.task], ep)
        label = f"{len(episodes)} episodes" if every else f"episode {episodes[0].index}"
        with tqdm(total=sum(e.length for e in episodes), desc=f"replay {label}", unit="step") as bar:
            for ep in episodes:
                results.append(replay_episode(envs[ep.task], ep, bar))
    finally:
        for env in envs.values():
            env.close()

    tol = float(cfg.tolerance)
    if every:
        report_many(results, skipped, location, tol)
    else:
        report_one(results[0], location)
    bad = [r for r in results if r.max_joint > tol or not r.outcome_matches]
    if bad:
        print(f"verdict: {len(bad)} of {len(results)} replayed episode(s) diverge (joint divergence above "
              f"tolerance={tol:g} or a different outcome): episodes {', '.join(str(r.index) for r in bad)}")
        return 1
    print(f"verdict: {len(results)} episode(s) replay faithfully (max joint divergence "
          f"{max(r.max_joint for r in results):.2e} <= tolerance {tol:g}, same outcome)")
    return 0


def report_one(res: ReplayResult, location: str) -> None:
    unit = ["gripper (0-1)" if "gripper" in n else "rad" for n in res.joint_names]
    rows = [(n, u, _fmt(res.joint_div[:, j].max()), _fmt(res.joint_div[:, j].mean()), int(res.joint_div[:, j].argmax()))
            for j, (n, u) in enumerate(zip(res.joint_names, unit))]
    rows.append(("all joints", "", _fmt(res.max_joint), _fmt(res.mean_joint), ""))
    print_table(f"replay {location} episode {res.index} ({res.task}, {res.steps} steps): "
                f"joint divergence |replayed - recorded|", ["joint", "unit", "max", "mean", "step of max"], rows)
    if res.object_rows:
        print_table("object state divergence (obs/env_state)", ["object", "measure", "max", "mean"],
                    [(o, m, _fmt(mx), _fmt(mn)) for o, m, mx, mn in res.object_rows])
    print_table("outcome", ["", "recorded", "replayed", "same"], [
        ("success", "n/a" if res.recorded_success is None else res.recorded_success, res.replayed_success,
         "n/a" if res.recorded_success is None else ("yes" if res.recorded_success == res.replayed_success else "NO")),
        ("max stage", _stage(res, res.recorded_stage), _stage(res, res.replayed_stage),
         "n/a" if res.recorded_stage is None else ("yes" if res.recorded_stage == res.replayed_stage else "NO")),
    ])


def report_many(results: list[ReplayResult], skipped: list[int], location: str, tol: float) -> None:
    rows = []
    for r in results:
        succ = f"{'n/a' if r.recorded_success is None else r.recorded_success} / {r.replayed_success}"
        stage = f"{'n/a' if r.recorded_stage is None else r.recorded_stage} / {r.replayed_stage}"
        ok = r.max_joint <= tol and r.outcome_matches
        rows.append((r.index, r.task, r.steps, _fmt(r.max_joint), _fmt(r.mean_joint),
                     "-" if r.object_max_pos is None else _fmt(r.object_max_pos), succ, stage, "yes" if ok else "NO"))
    for i in skipped:
        rows.append((i, "-", "-", "-", "-", "-", "-", "-", "skipped: no initial state"))
    print_table(f"replay {location}: {len(results)} episodes (divergence |replayed - recorded|; rec / rep = "
                f"recorded / replayed)", ["episode", "task", "steps", "max joint", "mean joint", "max object pos (m)",
                                          "success rec / rep", "stage rec / rep", "faithful"], rows)
    names = results[0].joint_names
    if all(r.joint_names == names for r in results):
        div = np.concatenate([r.joint_div for r in results])
        print_table("joint divergence over all replayed steps", ["joint", "max", "mean"],
                    [(n, _fmt(div[:, j].max()), _fmt(div[:, j].mean())) for j, n in enumerate(names)])
    if skipped:
        print(f"warning: {len(skipped)} episode(s) have no recorded initial state and were not replayed: "
              f"{', '.join(map(str, skipped))}")


def replay_on_robot(cfg: DictConfig, store: EpisodeStore) -> int:
    """Play one episode's executed actions on a ROS 2 robot at the store's rate: first a slow
    approach from where the arms are to the first recorded command, then the recording. Reports
    per joint how far the robot now is from where it was then (obs/qpos), and the timing table."""
    from robo_rl.cli.session import SessionKeys, close_session, listen_estop, open_robot, safety_for, timing_rows
    from robo_rl.runtime.controller import Controller
    from robo_rl.runtime.episodes import ControllerConfig
    from robo_rl.runtime.sources import RecordedActions

    with store:
        if isinstance(cfg.episode, str):
            raise ConfigError(f"episode={cfg.episode!r}: on a robot, replay one episode at a time (episode=N)")
        index = episode_index(store, cfg.episode)
        data = store.episode(index, keys=["action", "obs/qpos"])
        fps, location = float(store.schema.fps), store.location
    from robo_rl.hardware.robot import RobotSpec

    spec = RobotSpec.from_yaml(str(cfg.robot))
    if data["action"].shape[1] != spec.action_dim:
        raise ConfigError(f"{location}: episode {index} has {data['action'].shape[1]}-D actions; {spec.name} takes "
                          f"{spec.action_dim}")
    if abs(fps - spec.control_hz) > 1e-6:
        raise ConfigError(f"{location}: recorded at {fps:g} fps; {spec.name} is commanded at {spec.control_hz:g} Hz")
    if float(cfg.approach_s) <= 0:
        raise ConfigError(f"approach_s={cfg.approach_s}: give the seconds to reach the first recorded pose (> 0)")
    opened = open_robot(cfg)
    safety, watchdog, estop = safety_for(opened)
    listen_estop(opened.robot, cfg.estop_topic, estop)
    keys = SessionKeys(estop=estop)
    source = RecordedActions(data["action"], approach_ticks=int(round(float(cfg.approach_s) * spec.control_hz)))
    measured: list[np.ndarray] = []

    def on_tick(obs: Any, command: np.ndarray) -> None:
        keys.pump()
        if source.played is not None:  # `obs` is what the robot was at when that action was sent
            measured.append(np.asarray(obs.qpos, dtype=np.float64))

    try:
        opened.robot.connect()
        print(f"replay {location} episode {index} on {cfg.robot}: {cfg.approach_s:g} s to the first pose, then "
              f"{len(data['action']) / fps:.1f} s (space: e-stop; Ctrl-C stops)", flush=True)
        report = Controller(opened.robot, source, ControllerConfig(hz=spec.control_hz), safety=safety,
                            watchdog=watchdog, estop=estop, on_record=on_tick).run(None, stop=lambda: source.ended)
    finally:
        close_session(keys, opened.robot)
    n = len(measured)
    div = np.abs(np.stack(measured) - data["obs/qpos"][:n]) if n else np.zeros((0, spec.action_dim))
    rows = [(name, _fmt(div[:, j].max()) if n else "-", _fmt(div[:, j].mean()) if n else "-")
            for j, name in enumerate(spec.joint_names)]
    print_table(f"replay {location} episode {index} on {cfg.robot}: |joint positions now - recorded| over {n} of "
                f"{len(data['action'])} steps", ["joint", "max", "mean"], rows)
    s = report.summary()
    print_table("timing and safety", ["measure", "value"], timing_rows(s))
    if s["stopped_reason"] or report.interrupted:
        print(f"stopped: {s['stopped_reason'] or 'Ctrl-C'} after {n} of {len(data['action'])} steps")
        return 1
    print(f"played {n} steps; max joint difference from the recording {div.max() if n else 0:.3f}")
    return 0
