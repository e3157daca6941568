"""Intervention rollouts in the twin: the policy drives, an operator takes over, every step is
recorded with its label (POLICY, RECOVERY, CORRECTION) into an EpisodeStore.

Envs run in lockstep with one batched policy call per tick for the envs whose policy needs a new
chunk, as in evaluation. Each env has its own `InterventionController` and operator (the
simulated operator here; a human's keyboard or leader arms plug into the same controller). Under
RaC an episode ends with its intervention (END); under HG-DAgger the policy takes over again with
a fresh chunk and the episode runs to success or the time limit.

What the operator cost is counted two ways, as the RaC paper does: operator samples (steps the
operator commanded) and operator time (the whole episode, since a human watches all of it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import EpisodeMeta, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.rac.intervention import InterventionConfig, InterventionController, Operator
from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.expert import ExpertNoise
from robo_rl.sim.operator import OperatorConfig, SimOperator
from robo_rl.sim.recording import demo_step, expert_episode, recording_env
from robo_rl.sim.rollout import _env_obs, predict_chunks

OPERATOR_LABELS = (int(Segment.RECOVERY), int(Segment.CORRECTION))
PredictFn = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass
class CollectStats:
    episodes: int = 0
    successes: int = 0                   # task completed within the episode (by anyone)
    steps: dict[str, int] = field(default_factory=lambda: {s.name: 0 for s in (Segment.POLICY, Segment.RECOVERY,
                                                                                  Segment.CORRECTION, Segment.TELEOP)})
    interventions: int = 0
    episodes_with_intervention: int = 0
    operator_time_s: float = 0.0         # whole episodes: the operator watches every one
    wall_s: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def operator_samples(self) -> int:
        return self.steps["RECOVERY"] + self.steps["CORRECTION"] + self.steps["TELEOP"]  # what the operator commanded

    def add(self, other: "CollectStats") -> "CollectStats":
        """Accumulate another collection's counts into this one (wall time excluded)."""
        self.episodes += other.episodes
        self.successes += other.successes
        for k, v in other.steps.items():
            self.steps[k] = self.steps.get(k, 0) + v
        self.interventions += other.interventions
        self.episodes_with_intervention += other.episodes_with_intervention
        self.operator_time_s += other.operator_time_s
        for k, v in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + v
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "successes": self.successes, "steps": dict(self.steps),
                "operator_samples": self.operator_samples, "operator_time_s": self.operator_time_s,
                "interventions": self.interventions, "episodes_with_intervention": self.episodes_with_intervention,
                "reasons": dict(self.reasons), "wall_s": self.wall_s}


def _reason_kind(reason: str) -> str:
    for key in ("regressed", "no progress", "misaligned", "left"):
        if key in reason:
            return {"left": "out of time", "misaligned": "misaligned grasp"}.get(key, key)
    return reason or "operator"


def collect_interventions(
    predict: PredictFn,
    task: str,
    obs_keys: Sequence[str],
    n_obs: int,
    horizon: int,
    chunking: ChunkingConfig,
    out: str | Path,
    episodes: int,
    seed: int,
    mode: str = "rac",
    n_envs: int = 10,
    operator: OperatorConfig | None = None,
    progress: bool = True,
    max_operator_samples: int | None = None,
    make_operator: Callable[[BimanualEnv], Operator] | None = None,
    realtime: bool = False,
    on_tick: Callable[[BimanualEnv, InterventionController], None] | None = None,
    disturb: bool = True,
    image_size: tuple[int, int] | None = None,
) -> CollectStats:
    """Run `episodes` intervention rollouts (seeds seed, seed+1, ...) and append them to the store
    at `out` (created with the twin's demo schema if missing). With `max_operator_samples`, no new
    episode starts once that many operator samples are in (a budget, to compare methods at equal
    operator effort). Returns what was collected.

    A human operator: `make_operator(env)` builds each env's Operator (e.g. a TeleopOperator on a
    keyboard) instead of the simulated one, `realtime` paces the ticks at the robot's control
    rate, and `on_tick(env, controller)` runs after each tick (a viewer's sync, a status line).
    The rollouts meet the task's disturbances (`disturb`), as evaluation does. A camera policy
    (image keys in `obs_keys`) sees those cameras rendered at `image_size`, and the store records
    them with the rest of each step."""
    if episodes < 1 or n_envs < 1:
        raise ConfigError(f"interventions: episodes and n_envs must be >= 1 (got {episodes}, {n_envs})")
    cameras = [k[len("obs/images/"):] for k in obs_keys if k.startswith("obs/images/")]
    n_envs = min(n_envs, episodes)
    made = [recording_env(task, cameras, image_size, disturb=disturb) for _ in range(n_envs)]
    envs, schema = [env for env, _ in made], made[0][1]
    store = EpisodeStore.open_or_create(out, schema)
    fps = envs[0].robot.spec.control_hz
    icfg = InterventionConfig(mode=mode)
    op_cfg = operator or OperatorConfig()
    if mode == "hg_dagger":  # HG-DAgger's operator corrects at once: no recovery manoeuvre first
        op_cfg = replace(op_cfg, recover=False)
    if make_operator is not None:
        ops = [make_operator(env) for env in envs]
    else:
        ops = [SimOperator(env, op_cfg, rng=np.random.default_rng(seed + 7919 * i)) for i, env in enumerate(envs)]
    ctls = [InterventionController(op, icfg) for op in ops]
    execs = [ChunkExecutor(chunking, horizon) for _ in envs]
    windows: list[list[dict[str, np.ndarray]]] = [[] for _ in envs]
    obs_now: list[Any] = [None] * n_envs
    buffers: list[list[dict[str, np.ndarray]]] = [[] for _ in envs]
    labels: list[list[int]] = [[] for _ in envs]
    meta: list[dict[str, Any]] = [{} for _ in envs]
    active = [False] * n_envs
    op_steps = [0] * n_envs  # operator-commanded steps of each running episode
    stats = CollectStats()
    next_episode = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=episodes, desc=f"{mode} rollouts {task}", unit="ep", dynamic_ncols=True)

    def start(i: int) -> None:
        nonlocal next_episode
        s = seed + next_episode
        obs, _ = envs[i].reset(seed=s)
        ops[i].reset()
        ctls[i].reset()
        execs[i].reset()
        obs_now[i] = obs
        windows[i] = [_env_obs(obs, obs_keys)] * n_obs
        buffers[i], labels[i], op_steps[i] = [], [], 0
        meta[i] = {"seed": s, "init_state": envs[i].sim_state().tolist(), "max_stage": 0}
        active[i] = True
        next_episode += 1

    def finish(i: int, success: bool) -> None:
        ctl = ctls[i]
        ctl.finish()
        n = len(buffers[i])
        data = {k: np.stack([b[k] for b in buffers[i]]) for k in schema.keys}
        recs = [r.to_json() for r in ctl.interventions]
        extra = {**meta[i], "mode": mode, "interventions": recs, "ignored_events": len(ctl.ignored_events)}
        store.add_episode(data, np.arange(n) / fps, np.asarray(labels[i], dtype=np.int64),
                          EpisodeMeta(task=task, success=success, source="intervention", operator=ops[i].name, extra=extra))
        stats.episodes += 1
        stats.successes += success
        for lab in labels[i]:
            stats.steps[Segment(lab).name] += 1
        stats.interventions += len(recs)
        stats.episodes_with_intervention += bool(recs)
        stats.operator_time_s += n / fps
        for r in recs:
            kind = _reason_kind(r["reason"])
            stats.reasons[kind] = stats.reasons.get(kind, 0) + 1
        active[i] = False
        if bar is not None:
            bar.update()
            bar.set_postfix(interventions=stats.interventions, success=f"{stats.successes}/{stats.episodes}")

    def spent() -> bool:
        """The operator-sample budget is used up, counting episodes still running."""
        if max_operator_samples is None:
            return False
        running = sum(op_steps[i] for i in range(n_envs) if active[i])
        return stats.operator_samples + running >= max_operator_samples

    t0 = time.perf_counter()
    next_tick = t0
    for i in range(n_envs):
        start(i)
    try:
        with store:
            while any(active):
                if realtime:  # a human is watching and steering: run at the robot's rate, not faster
                    next_tick = max(next_tick + 1.0 / fps, time.perf_counter())  # after a slow tick: no burst
                    time.sleep(max(0.0, next_tick - time.perf_counter()))
                policy_driven = [i for i in range(n_envs) if active[i] and not ctls[i].in_control]
                predict_chunks(predict, policy_driven, windows, execs, obs_keys)
                for i in range(n_envs):
                    if not active[i]:
                        continue
                    env, ctl = envs[i], ctls[i]
                    was_operator = ctl.in_control
                    policy_action = None if was_operator else execs[i].next().astype(np.float32)
                    action, label = ctl.step(policy_action, env.robot.time, env.task.stage(env.robot))
                    if was_operator and not ctl.in_control and not ctl.done:
                        execs[i].reset()  # HG-DAgger hand-back: the policy plans afresh from here
                    prev = obs_now[i]
                    obs, _, terminated, truncated, info = env.step(action)
                    buffers[i].append(demo_step(prev, info["executed_action"], cameras))
                    labels[i].append(int(label))
                    op_steps[i] += int(label) in OPERATOR_LABELS
                    meta[i]["max_stage"] = max(meta[i]["max_stage"], int(info["max_stage"]))
                    obs_now[i] = obs
                    windows[i] = windows[i][1:] + [_env_obs(obs, obs_keys)]
                    if on_tick is not None:
                        on_tick(env, ctl)
                    if terminated or truncated or ctl.done:
                        finish(i, bool(info["success"]))
                        if next_episode < episodes and not spent():
                            start(i)
                    elif spent() and not ctl.in_control:
                        finish(i, bool(info["success"]))  # budget reached: stop here, no new takeover
    finally:
        if bar is not None:
            bar.close()
        for env in envs:
            env.close()
    stats.wall_s = time.perf_counter() - t0
    return stats


def collect_expert_demos(task: str, out: str | Path, seed: int, max_samples: int, max_episodes: int = 10_000,
                         noise: ExpertNoise | None = None, cameras: Sequence[str] = (),
                         image_size: tuple[int, int] | None = None) -> CollectStats:
    """The "more expert demos" baseline: successful scripted-expert episodes (human-like noise)
    appended to `out` until they hold `max_samples` steps, all counted as operator samples
    (with `cameras` rendered at `image_size`, for a camera policy)."""
    cameras = list(cameras)
    env, schema = recording_env(task, cameras, image_size)
    store = EpisodeStore.open_or_create(out, schema)
    fps = env.robot.spec.control_hz
    stats, t0, tries = CollectStats(), time.perf_counter(), 0
    with store:
        while stats.operator_samples < max_samples and tries < max_episodes:
            data, ok, facts = expert_episode(env, seed + tries, noise or ExpertNoise(), cameras)
            tries += 1
            n = len(data["action"])
            stats.operator_time_s += n / fps  # a failed demo still cost the operator its time
            if not ok:
                continue
            store.add_episode(data, np.arange(n) / fps, "TELEOP",
                              EpisodeMeta(task=task, success=True, source="teleop", operator="scripted_expert", extra=facts))
            stats.episodes += 1
            stats.successes += 1
            stats.steps["TELEOP"] += n
    env.close()
    stats.wall_s = time.perf_counter() - t0
    return stats
