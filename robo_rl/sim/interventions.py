"""Intervention rollouts in the twin: the policy drives, an operator takes over, every step is
recorded with its label (POLICY, RECOVERY, CORRECTION) into an EpisodeStore.

The rollouts run through the episode loop (robo_rl/runtime/episodes.py) with the RaC protocol's
`Interventions` source, the code `robo-rl record checkpoint=` runs on real arms: envs in
lockstep with one batched policy call per tick for the envs whose policy needs a new chunk, as
in evaluation. Each env has its own `InterventionController` and operator (the simulated
operator here; a human's keyboard or leader arms plug into the same controller). Under
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
from robo_rl.rac.intervention import UNFINISHED_ENDINGS, InterventionConfig, InterventionController, Operator
from robo_rl.runtime.chunking import ChunkingConfig
from robo_rl.hardware.robot import Outcome
from robo_rl.runtime.episodes import ControllerConfig, Episode, run_episodes, store_step
from robo_rl.runtime.sources import Interventions, LockstepChunks
from robo_rl.sim.envs import BimanualEnv, TaskTwin
from robo_rl.sim.room import RoomRandomizer
from robo_rl.sim.expert import ExpertNoise
from robo_rl.sim.operator import OperatorConfig, SimOperator
from robo_rl.sim.recording import expert_episode, recording_env

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
    unfinished: dict[str, int] = field(default_factory=dict)  # interventions cut short, by how they ended
    unfinished_samples: int = 0          # their operator samples (they do not train: CompositionConfig.finished_only)

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
        for k, v in other.unfinished.items():
            self.unfinished[k] = self.unfinished.get(k, 0) + v
        self.unfinished_samples += other.unfinished_samples
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "successes": self.successes, "steps": dict(self.steps),
                "operator_samples": self.operator_samples, "operator_time_s": self.operator_time_s,
                "interventions": self.interventions, "episodes_with_intervention": self.episodes_with_intervention,
                "reasons": dict(self.reasons), "unfinished": dict(self.unfinished),
                "unfinished_samples": self.unfinished_samples, "wall_s": self.wall_s}


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
    randomize_room: bool = False,
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
    them with the rest of each step; with `randomize_room`, in a new room per episode (light,
    camera poses, colours, a distractor: robo_rl/sim/room.py)."""
    if episodes < 1 or n_envs < 1:
        raise ConfigError(f"interventions: episodes and n_envs must be >= 1 (got {episodes}, {n_envs})")
    cameras = [k[len("obs/images/"):] for k in obs_keys if k.startswith("obs/images/")]
    n_envs = min(n_envs, episodes)
    if randomize_room and not cameras:
        raise ConfigError("interventions: randomize_room changes only what cameras see, and the policy has none")
    rooms = RoomRandomizer() if randomize_room else None
    made = [recording_env(task, cameras, image_size, disturb=disturb, randomize=rooms) for _ in range(n_envs)]
    envs, schema = [env for env, _ in made], made[0][1]
    twins = [TaskTwin(env) for env in envs]
    store = EpisodeStore.open_or_create(out, schema)
    op_cfg = operator or OperatorConfig()
    if mode == "hg_dagger":  # HG-DAgger's operator corrects at once: no recovery manoeuvre first
        op_cfg = replace(op_cfg, recover=False)
    if make_operator is not None:
        ops = [make_operator(env) for env in envs]
    else:
        ops = [SimOperator(env, op_cfg, rng=np.random.default_rng(seed + 7919 * i)) for i, env in enumerate(envs)]
    ctls = [InterventionController(op, InterventionConfig(mode=mode)) for op in ops]
    # the RaC protocol as on real arms (robo-rl record checkpoint=): the same Interventions source
    sources = Interventions(LockstepChunks(predict, chunking, horizon, n_envs, obs_keys, n_obs), ctls,
                            [lambda env=env: env.task.stage(env.robot) for env in envs])
    hooks = _Collection(twins, ops, ctls, store, schema, cameras, task, mode, episodes, seed, max_operator_samples, on_tick,
                        op_cfg.finish_past_limit)
    if progress:
        from tqdm import tqdm

        hooks.bar = tqdm(total=episodes, desc=f"{mode} rollouts {task}", unit="ep", dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        with store:
            # a human watching and steering the twin: the robot's rate, on the real-time clock
            report = run_episodes(twins, sources, ControllerConfig(hz=envs[0].robot.spec.control_hz, n_obs=n_obs),
                                  hooks, lockstep=not realtime)
    finally:
        if hooks.bar is not None:
            hooks.bar.close()
        for env in envs:
            env.close()
    if report.interrupted:  # Ctrl-C: the episodes ended before are in the store, the open ones are not
        raise KeyboardInterrupt
    hooks.stats.wall_s = time.perf_counter() - t0
    return hooks.stats


class _Collection:
    """The episode loop's hooks for intervention collection: seeds in order, each step with its
    label into a buffer, each ended episode into the store with its interventions, and the
    operator-sample budget (no new episode, and no new takeover, once it is spent)."""

    def __init__(self, twins: list[TaskTwin], ops: list[Operator], ctls: list[InterventionController],
                 store: EpisodeStore, schema: Any, cameras: list[str], task: str, mode: str, episodes: int, seed: int,
                 max_operator_samples: int | None, on_tick: Callable[[BimanualEnv, InterventionController], None] | None,
                 finish_past_limit: bool = False):
        self.twins, self.ops, self.ctls, self.store, self.schema = twins, ops, ctls, store, schema
        self.cameras, self.task, self.mode, self.episodes, self.seed = cameras, task, mode, episodes, seed
        self.max_operator_samples, self.on_tick = max_operator_samples, on_tick
        self.fps = twins[0].spec.control_hz
        n = len(twins)
        self.buffers: list[list[dict[str, np.ndarray]]] = [[] for _ in range(n)]
        self.labels: list[list[int]] = [[] for _ in range(n)]
        self.meta: list[dict[str, Any]] = [{} for _ in range(n)]
        self.op_steps = [0] * n  # operator-commanded steps of each running episode
        self.finish_past_limit = finish_past_limit  # OperatorConfig.finish_past_limit
        self.running = [False] * n
        self.stats = CollectStats()
        self.next_episode = 0
        self.bar = None

    def spent(self) -> bool:
        """The operator-sample budget is used up, counting episodes still running."""
        if self.max_operator_samples is None:
            return False
        running = sum(self.op_steps[i] for i in range(len(self.twins)) if self.running[i])
        return self.stats.operator_samples + running >= self.max_operator_samples

    def start(self, i: int) -> Episode | None:
        if self.next_episode >= self.episodes or self.spent():
            return None
        s = self.seed + self.next_episode
        self.next_episode += 1
        self.twins[i].reset(s)
        self.ops[i].reset()
        self.buffers[i], self.labels[i], self.op_steps[i], self.running[i] = [], [], 0, True
        self.meta[i] = {"seed": s, "init_state": self.twins[i].sim_state().tolist(), "max_stage": 0}
        twin, ctl, past_limit = self.twins[i], self.ctls[i], self.finish_past_limit
        # budget reached while the policy drives: stop here, no new takeover. With finish_past_limit
        # the time limit ends the episode only while the policy drives: a correction under way finishes
        return Episode(stop=lambda: not ctl.in_control and (self.spent() or (past_limit and twin.steps >= twin.env.max_steps)),
                       end_on_time_limit=not past_limit)

    def step(self, i: int, obs: Any, executed: np.ndarray, segment: Segment, outcome: Outcome) -> None:
        self.buffers[i].append(store_step(obs, executed, self.cameras))
        self.labels[i].append(int(segment))
        self.op_steps[i] += int(segment) in OPERATOR_LABELS
        self.meta[i]["max_stage"] = outcome.max_stage
        if self.on_tick is not None:
            self.on_tick(self.twins[i].env, self.ctls[i])

    def end(self, i: int, report: Any, outcome: Outcome | None) -> None:
        self.running[i] = False
        if report.interrupted or outcome is None:  # cut short by Ctrl-C: not an episode
            return
        ctl, op, labels = self.ctls[i], self.ops[i], self.labels[i]
        n, success = len(self.buffers[i]), outcome.success
        data = {k: np.stack([b[k] for b in self.buffers[i]]) for k in self.schema.keys}
        recs = [r.to_json() for r in ctl.interventions]
        extra = {**self.meta[i], "mode": self.mode, "interventions": recs, "ignored_events": len(ctl.ignored_events)}
        self.store.add_episode(data, np.arange(n) / self.fps, np.asarray(labels, dtype=np.int64),
                               EpisodeMeta(task=self.task, success=success, source="intervention", operator=op.name,
                                           extra=extra))
        stats = self.stats
        stats.episodes += 1
        stats.successes += success
        for lab in labels:
            stats.steps[Segment(lab).name] += 1
        stats.interventions += len(recs)
        stats.episodes_with_intervention += bool(recs)
        stats.operator_time_s += n / self.fps
        for r in recs:
            kind = _reason_kind(r["reason"])
            stats.reasons[kind] = stats.reasons.get(kind, 0) + 1
            if r["ended"] in UNFINISHED_ENDINGS:
                stats.unfinished[r["ended"]] = stats.unfinished.get(r["ended"], 0) + 1
                stats.unfinished_samples += int(r["recovery_steps"]) + int(r["correction_steps"])
        if self.bar is not None:
            self.bar.update()
            self.bar.set_postfix(interventions=stats.interventions, success=f"{stats.successes}/{stats.episodes}")


def collect_expert_demos(task: str, out: str | Path, seed: int, max_samples: int, max_episodes: int = 10_000,
                         noise: ExpertNoise | None = None, cameras: Sequence[str] = (),
                         image_size: tuple[int, int] | None = None, randomize_room: bool = False) -> CollectStats:
    """The "more expert demos" baseline: successful scripted-expert episodes (human-like noise)
    appended to `out` until they hold `max_samples` steps, all counted as operator samples
    (with `cameras` rendered at `image_size`, for a camera policy; each in a new room with
    `randomize_room`, as the rollouts it is compared with)."""
    cameras = list(cameras)
    env, schema = recording_env(task, cameras, image_size,
                                randomize=RoomRandomizer() if randomize_room and cameras else None)
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
