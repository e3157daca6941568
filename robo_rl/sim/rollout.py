"""Evaluate an action-chunk policy in the twin: many episodes, several envs stepped in lockstep
with one batched policy call per tick, success with a Wilson 95% interval, per-stage reach
rates, episode lengths and a few H.264 rollout videos.

The policy is any callable mapping observation windows (store key -> B x To x ... array) to
action chunks (B x H x A); this module never imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.operator import RecoveryCounter

PredictFn = Callable[[Mapping[str, np.ndarray]], np.ndarray]
IMAGE_PREFIX = "obs/images/"


class EpisodeRecorder(Protocol):
    """What `evaluate_policy` tells a recorder (e.g. critic_data.RolloutRecorder) about env i."""

    def begin(self, i: int, env: BimanualEnv, obs: Mapping[str, Any], seed: int) -> None: ...
    def step(self, i: int, obs: Mapping[str, Any], info: Mapping[str, Any]) -> None: ...
    def end(self, i: int, success: bool, max_stage: int, length: int) -> None: ...


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sound at 0 and n, unlike p +- 1.96 se)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EpisodeResult:
    seed: int
    success: bool
    max_stage: int
    length: int
    recoveries: int = 0   # recovery manoeuvres the policy performed (count_recoveries=True)
    disturbed: bool = False  # the task's disturbance struck (PackCube: the cube slipped)


@dataclass
class EvalSummary:
    task: str
    episodes: list[EpisodeResult]
    stage_names: tuple[str, ...]
    wall_s: float
    videos: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.episodes)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        return self.successes / max(1, self.n)

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    def stage_reach(self) -> dict[str, float]:
        """Share of episodes that reached each stage (stage 0 is the start, always reached)."""
        stages = np.array([e.max_stage for e in self.episodes])
        return {name: float((stages >= k).mean()) for k, name in enumerate(self.stage_names) if k > 0}

    def disturbed(self) -> tuple[int, int]:
        """(successes, episodes) among the episodes the task's disturbance struck."""
        hit = [e for e in self.episodes if e.disturbed]
        return sum(e.success for e in hit), len(hit)

    def success_within(self, max_recoveries: int) -> float:
        """Success rate had each episode been cut off at its (max_recoveries + 1)-th recovery
        manoeuvre: RaC's test-time scaling, success vs recoveries the policy may spend."""
        return float(np.mean([e.success and e.recoveries <= max_recoveries for e in self.episodes])) if self.episodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.interval
        lengths = [e.length for e in self.episodes]
        return {"task": self.task, "episodes": self.n, "successes": self.successes, "success_rate": self.success_rate,
                "ci95_low": lo, "ci95_high": hi, "mean_length": float(np.mean(lengths)) if lengths else 0.0,
                "stage_reach": self.stage_reach(), "disturbed": dict(zip(("successes", "episodes"), self.disturbed())),
                "wall_s": self.wall_s, "videos": self.videos,
                "per_episode": [e.__dict__ for e in self.episodes]}


def _env_obs(obs: Mapping[str, Any], keys: Sequence[str]) -> dict[str, np.ndarray]:
    out = {}
    for k in keys:
        if k.startswith(IMAGE_PREFIX):
            out[k] = obs["images"][k[len(IMAGE_PREFIX):]]
        else:
            name = k.split("/", 1)[1] if k.startswith("obs/") else k
            if name not in obs:
                raise ConfigError(f"the policy reads {k!r}, which the twin's observation does not have ({sorted(obs)})")
            out[k] = obs[name]
    return out


def predict_chunks(predict: PredictFn, envs: Sequence[int], windows: Sequence[Sequence[Mapping[str, np.ndarray]]],
                   execs: Sequence[ChunkExecutor], obs_keys: Sequence[str]) -> None:
    """One batched policy call for those of `envs` whose executor needs a new chunk."""
    need = [i for i in envs if execs[i].needs_prediction()]
    if need:
        batch = {k: np.stack([np.stack([w[k] for w in windows[i]]) for i in need]) for k in obs_keys}
        chunks = predict(batch)
        for j, i in enumerate(need):
            execs[i].push(chunks[j])


def evaluate_policy(
    predict: PredictFn,
    task: str,
    obs_keys: Sequence[str],
    n_obs: int,
    horizon: int,
    chunking: ChunkingConfig,
    episodes: int = 100,
    n_envs: int = 10,
    seed: int = 100_000,
    image_size: tuple[int, int] | None = None,
    videos: int = 0,
    video_dir: str | Path | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    stop_on_success: bool = True,
    count_recoveries: bool = False,
    recorder: EpisodeRecorder | None = None,
    disturb: bool = True,
) -> EvalSummary:
    """Run `episodes` episodes (seeds seed, seed+1, ...) on `n_envs` envs in lockstep, with the
    task's disturbances (`disturb`)."""
    if episodes < 1 or n_envs < 1:
        raise ConfigError(f"evaluate: episodes and n_envs must be >= 1 (got {episodes}, {n_envs})")
    cameras = [k[len(IMAGE_PREFIX):] for k in obs_keys if k.startswith(IMAGE_PREFIX)]
    obs_mode = "state+pixels" if cameras else "state"
    n_envs = min(n_envs, episodes)
    size = tuple(image_size) if image_size else (240, 320)
    envs = [BimanualEnv(task, obs_mode=obs_mode, cameras=cameras or ("top",), image_size=size,
                        render_mode="rgb_array" if (i == 0 and videos) else None, max_steps=max_steps, disturb=disturb)
            for i in range(n_envs)]
    stage_names = envs[0].task.stage_names
    execs = [ChunkExecutor(chunking, horizon) for _ in envs]
    counters = [RecoveryCounter(env) for env in envs] if count_recoveries else None
    windows: list[list[dict[str, np.ndarray]]] = [[] for _ in envs]
    active = [False] * n_envs
    seeds = [0] * n_envs
    lengths = [0] * n_envs
    max_stage = [0] * n_envs
    disturbed = [False] * n_envs
    frames: list[list[np.ndarray] | None] = [None] * n_envs
    results: list[EpisodeResult] = []
    video_paths: list[str] = []
    next_episode = 0
    videos_started = 0  # env 0 records its first `videos` episodes
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=episodes, desc=f"eval {task}", unit="ep", dynamic_ncols=True)

    def start(i: int) -> None:
        nonlocal next_episode, videos_started
        seeds[i] = seed + next_episode
        obs, _ = envs[i].reset(seed=seeds[i])
        execs[i].reset()
        if counters:
            counters[i].reset()
        windows[i] = [_env_obs(obs, obs_keys)] * n_obs  # pad with the first frame, as the sampler does
        lengths[i], max_stage[i], disturbed[i], active[i] = 0, 0, False, True
        if recorder is not None:
            recorder.begin(i, envs[i], obs, seeds[i])
        frames[i] = None
        if i == 0 and videos_started < videos:
            frames[i] = [envs[i].render()]
            videos_started += 1
        next_episode += 1

    t0 = time.perf_counter()
    for i in range(n_envs):
        start(i)
    try:
        while any(active):
            predict_chunks(predict, [i for i in range(n_envs) if active[i]], windows, execs, obs_keys)
            for i in range(n_envs):
                if not active[i]:
                    continue
                obs, _, terminated, truncated, info = envs[i].step(execs[i].next().astype(np.float32))
                if counters:
                    counters[i].update(info["executed_action"])
                if recorder is not None:
                    recorder.step(i, obs, info)
                lengths[i] += 1
                max_stage[i] = max(max_stage[i], int(info["max_stage"]))
                disturbed[i] = disturbed[i] or info["disturbance"] is not None
                windows[i] = windows[i][1:] + [_env_obs(obs, obs_keys)]
                if frames[i] is not None:
                    frames[i].append(envs[i].render())
                if (terminated and stop_on_success) or truncated:
                    results.append(EpisodeResult(seeds[i], bool(info["success"]), max_stage[i], lengths[i],
                                                 counters[i].count if counters else 0, disturbed[i]))
                    if recorder is not None:
                        recorder.end(i, bool(info["success"]), max_stage[i], lengths[i])
                    if frames[i] is not None and video_dir is not None:
                        video_paths.append(_write_video(frames[i], Path(video_dir), seeds[i], bool(info["success"]),
                                                        envs[i].metadata["render_fps"]))
                    frames[i] = None
                    active[i] = False
                    if bar is not None:
                        bar.update()
                        bar.set_postfix(success=f"{sum(r.success for r in results)}/{len(results)}")
                    if next_episode < episodes:
                        start(i)
    finally:
        if bar is not None:
            bar.close()
        for env in envs:
            env.close()
    results.sort(key=lambda r: r.seed)
    return EvalSummary(task, results, stage_names, time.perf_counter() - t0, video_paths)


def _write_video(frames: list[np.ndarray], out_dir: Path, seed: int, success: bool, fps: float) -> str:
    from robo_rl.data.video import Mp4Writer

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"seed{seed}_{'success' if success else 'fail'}.mp4"
    writer = Mp4Writer(path, fps, crf=23, preset="veryfast")
    try:
        for f in frames:
            if f.shape[0] % 2 or f.shape[1] % 2:  # H.264 4:2:0 needs even sides
                f = f[: f.shape[0] // 2 * 2, : f.shape[1] // 2 * 2]
            writer.write(f)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return str(path)
