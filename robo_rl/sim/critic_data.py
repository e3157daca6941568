"""Twin-side data for the chunk critic (robo_rl/rl/chunk_critic.py): per-step task stages of
recorded episodes, and policy rollouts recorded into an EpisodeStore with their stages.

Stages. A store step is (observation before action t, action t as executed); `stage[t]` is the
stage the twin reports after action t (`info["stage"]` of that env step). The stage predicates
read contacts (a grasp is both fingers touching), which the stored `obs/qpos` / `obs/env_state`
do not determine, so stages cannot be recomputed from a step's observation alone. The twin is
deterministic, though: an episode recorded in it replays from its recorded initial physics state
with zero divergence (robo_rl/sim/replay.py). So stages of an episode without a `stage` key are
computed by that replay, and the replay is checked against the recorded joint positions at every
step: an episode that does not track its recording is refused rather than mislabelled.

Rollouts. `record_rollouts` is `evaluate_policy`'s lockstep loop (same seeds, same chunk
schedule, same stop on success) that also writes every episode to a store: the demo keys
(obs/qpos, obs/qvel, obs/env_state, action as executed, cameras the policy reads), a per-step
`stage` key, segment POLICY, the twin's success label, and seed + initial state in the metadata
so the episode also replays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError, SchemaError
from robo_rl.runtime.chunking import ChunkingConfig
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.room import Room
from robo_rl.runtime.episodes import store_step
from robo_rl.sim.recording import demo_schema
from robo_rl.sim.replay import load_episode, make_env, start_replay
from robo_rl.sim.rollout import IMAGE_PREFIX, EvalSummary, PredictFn, evaluate_policy

STAGE_KEY = "stage"
REPLAY_TOLERANCE = 1e-4  # rad: largest joint divergence from the recording a replay may show


# ---------------------------------------------------------------------- stages of recorded episodes
def replay_stages(store: EpisodeStore, i: int, task: str | None = None, env: BimanualEnv | None = None,
                  tolerance: float = REPLAY_TOLERANCE) -> np.ndarray:
    """Per-step stages (int, length T) of episode `i` by replaying it in the twin from its
    recorded initial state, checking at every step that the replay tracks the recorded joints."""
    ep = load_episode(store, i, task)
    own = env is None
    env = env or make_env(ep.task)
    try:
        start_replay(env, ep)
        stages = np.empty(ep.length, np.int64)
        worst = float(np.abs(env.robot.joint_positions() - ep.qpos[0]).max())
        for t in range(ep.length):
            obs, _, _, _, info = env.step(ep.action[t])
            stages[t] = int(info["stage"])
            if t + 1 < ep.length:
                worst = max(worst, float(np.abs(obs["qpos"] - ep.qpos[t + 1]).max()))
    finally:
        if own:
            env.close()
    if worst > tolerance:
        raise ConfigError(f"{store.location}: episode {i} does not replay in the twin (joints drift {worst:.2g} rad "
                          f"from the recording), so its stages cannot be recomputed; record rollouts with "
                          f"`robo-rl eval record=PATH`, which stores a per-step '{STAGE_KEY}' key")
    return stages


def episode_stages(store: EpisodeStore, episodes: Sequence[int] | None = None, task: str | None = None,
                   progress: bool = False) -> list[np.ndarray]:
    """Per-step stages of each episode: the store's `stage` key where it has one, else a replay
    in the twin (one env per task, reused across episodes)."""
    episodes = list(range(store.n_episodes)) if episodes is None else list(episodes)
    if STAGE_KEY in store.data_keys:
        return [store.episode(e, [STAGE_KEY])[STAGE_KEY].astype(np.int64) for e in episodes]
    envs: dict[str, BimanualEnv] = {}
    out = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(episodes), desc=f"stages {Path(store.location).name}", unit="ep", dynamic_ncols=True)
    try:
        for e in episodes:
            name = task or store.meta(e).task
            if name not in envs:
                envs[name] = make_env(load_episode(store, e, task).task)
            out.append(replay_stages(store, e, task, envs[name]))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
        for env in envs.values():
            env.close()
    return out


# ---------------------------------------------------------------------- rollouts into a store
def rollout_schema(env: BimanualEnv, cameras: Sequence[str], image_size: tuple[int, int]) -> Schema:
    """The demo schema (robo_rl/sim/recording.py) plus the per-step stage."""
    base = demo_schema(env, cameras, image_size)
    keys = {k: (s.shape, s.dtype) for k, s in base.keys.items()}
    keys[STAGE_KEY] = ((), "int8")
    return Schema.build(keys, fps=base.fps, robot=base.robot)


class RolloutRecorder:
    """Appends each finished rollout of `evaluate_policy` to an EpisodeStore: the demo keys, the
    per-step stage, segment POLICY, the success label, and the seed and initial state (replayable)."""

    def __init__(self, out: str | Path, task: str, cameras: Sequence[str], image_size: tuple[int, int],
                 meta_extra: Mapping[str, object] | None = None):
        self.out, self.task, self.cameras, self.image_size = out, task, list(cameras), image_size
        self.meta_extra = dict(meta_extra or {})
        self.store: EpisodeStore | None = None
        self.steps: dict[int, list[dict]] = {}
        self.facts: dict[int, dict] = {}

    def begin(self, i, twin, seed) -> None:
        if self.store is None:  # the schema comes from the first env
            schema = rollout_schema(twin.env, self.cameras, self.image_size)
            try:
                self.store = EpisodeStore.open_or_create(self.out, schema)
            except SchemaError:
                raise ConfigError(f"record={self.out}: that store holds other keys than this policy's rollouts; "
                                  f"pass another path") from None
            self.fps = float(schema.fps)
        self.facts[i] = {"seed": seed, "init_state": twin.sim_state().tolist(), **self.meta_extra}
        self.steps[i] = []

    def step(self, i, obs, executed, outcome) -> None:
        step = store_step(obs, executed, self.cameras)
        step[STAGE_KEY] = np.int8(outcome.stage)
        self.steps[i].append(step)

    def end(self, i, success, max_stage, length) -> None:
        steps = self.steps.pop(i)
        data = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        meta = EpisodeMeta(task=self.task, success=success, source="policy", operator="policy",
                           extra={**self.facts.pop(i), "max_stage": max_stage})
        self.store.add_episode(data, np.arange(length) / self.fps, "POLICY", meta)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def record_rollouts(predict: PredictFn, task: str, obs_keys: Sequence[str], n_obs: int, horizon: int,
                    chunking: ChunkingConfig, out: str | Path, episodes: int = 100, n_envs: int = 10,
                    seed: int = 100_000, image_size: tuple[int, int] | None = None, max_steps: int | None = None,
                    disturb: bool = True, progress: bool = True, meta_extra: Mapping[str, object] | None = None,
                    room: Room | None = None) -> EvalSummary:
    """Roll the policy out with `evaluate_policy` (same seeds, same chunking) and append every
    episode to the store at `out` (created if missing; an existing one must hold the same keys)."""
    cameras = [k[len(IMAGE_PREFIX):] for k in obs_keys if k.startswith(IMAGE_PREFIX)]
    size = tuple(image_size) if image_size else (240, 320)
    if room is not None:  # each episode says which room it was rolled out in
        meta_extra = {**(meta_extra or {}), "room": room.describe()}
    recorder = RolloutRecorder(out, task, cameras, size, meta_extra)
    try:
        return evaluate_policy(predict, task, obs_keys, n_obs, horizon, chunking, episodes=episodes, n_envs=n_envs,
                               seed=seed, image_size=size, max_steps=max_steps, progress=progress, recorder=recorder,
                               disturb=disturb, room=room)
    finally:
        recorder.close()
