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

from robo_rl.data.schema import IMAGE_PREFIX
from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import Observation
from robo_rl.runtime.chunking import ChunkingConfig
from robo_rl.hardware.robot import Outcome
from robo_rl.runtime.episodes import ControllerConfig, Episode, run_episodes
from robo_rl.runtime.sources import LockstepChunks
from robo_rl.sim.envs import BimanualEnv, TaskTwin
from robo_rl.sim.room import Room
from robo_rl.sim.operator import RecoveryCounter

PredictFn = Callable[[Mapping[str, np.ndarray]], np.ndarray]


class EpisodeRecorder(Protocol):
    """What `evaluate_policy` tells a recorder (e.g. critic_data.RolloutRecorder) about env i."""

    def begin(self, i: int, twin: TaskTwin, seed: int) -> None: ...
    def step(self, i: int, obs: Observation, executed: np.ndarray, outcome: Outcome) -> None: ...
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
    room: Room | None = None,
) -> EvalSummary:
    """Run `episodes` episodes (seeds seed, seed+1, ...) on `n_envs` envs in lockstep, with the
    task's disturbances (`disturb`), through the episode loop (robo_rl/runtime/episodes.py), in
    the twin's nominal room or in `room` (a shift: robo_rl/sim/room.py)."""
    if episodes < 1 or n_envs < 1:
        raise ConfigError(f"evaluate: episodes and n_envs must be >= 1 (got {episodes}, {n_envs})")
    cameras = [k[len(IMAGE_PREFIX):] for k in obs_keys if k.startswith(IMAGE_PREFIX)]
    obs_mode = "state+pixels" if cameras else "state"
    n_envs = min(n_envs, episodes)
    size = tuple(image_size) if image_size else (240, 320)
    envs = [BimanualEnv(task, obs_mode=obs_mode, cameras=cameras or ("top",), image_size=size,
                        render_mode="rgb_array" if (i == 0 and videos) else None, max_steps=max_steps, disturb=disturb,
                        room=room)
            for i in range(n_envs)]
    twins = [TaskTwin(env) for env in envs]
    hooks = _Evaluation(twins, episodes, seed, stop_on_success, recorder, videos, video_dir,
                        [RecoveryCounter(env) for env in envs] if count_recoveries else None)
    if progress:
        from tqdm import tqdm

        hooks.bar = tqdm(total=episodes, desc=f"eval {task}", unit="ep", dynamic_ncols=True)
    sources = LockstepChunks(predict, chunking, horizon, n_envs, obs_keys, n_obs)
    t0 = time.perf_counter()
    try:
        run_episodes(twins, sources, ControllerConfig(hz=envs[0].robot.spec.control_hz, n_obs=n_obs), hooks,
                     lockstep=True)
    finally:
        if hooks.bar is not None:
            hooks.bar.close()
        for env in envs:
            env.close()
    hooks.results.sort(key=lambda r: r.seed)
    return EvalSummary(task, hooks.results, envs[0].task.stage_names, time.perf_counter() - t0, hooks.video_paths)


class _Evaluation:
    """The episode loop's hooks for evaluation: seeds in order, a result per episode, recovery
    counts, a recorder's steps, and env 0's first `videos` episodes as H.264."""

    def __init__(self, twins: list[TaskTwin], episodes: int, seed: int, stop_on_success: bool,
                 recorder: EpisodeRecorder | None, videos: int, video_dir: str | Path | None,
                 counters: list[RecoveryCounter] | None):
        self.twins, self.episodes, self.seed, self.stop_on_success = twins, episodes, seed, stop_on_success
        self.recorder, self.videos, self.video_dir, self.counters = recorder, videos, video_dir, counters
        self.next_episode = self.videos_started = 0
        self.seeds = [0] * len(twins)
        self.frames: list[list[np.ndarray] | None] = [None] * len(twins)
        self.results: list[EpisodeResult] = []
        self.video_paths: list[str] = []
        self.bar = None

    def start(self, i: int) -> Episode | None:
        if self.next_episode >= self.episodes:
            return None
        twin, self.seeds[i] = self.twins[i], self.seed + self.next_episode
        self.next_episode += 1
        twin.reset(self.seeds[i])
        if self.counters:
            self.counters[i].reset()
        if self.recorder is not None:
            self.recorder.begin(i, twin, self.seeds[i])
        self.frames[i] = None
        if i == 0 and self.videos_started < self.videos:  # env 0 records its first `videos` episodes
            self.frames[i] = [twin.env.render()]
            self.videos_started += 1
        return Episode(end_on_success=self.stop_on_success)

    def step(self, i: int, obs: Observation, executed: np.ndarray, segment: Any, outcome: Outcome) -> None:
        if self.counters:
            self.counters[i].update(executed)
        if self.recorder is not None:
            self.recorder.step(i, obs, executed, outcome)
        if self.frames[i] is not None:
            self.frames[i].append(self.twins[i].env.render())

    def end(self, i: int, report: Any, outcome: Outcome) -> None:
        length = report.ticks
        self.results.append(EpisodeResult(self.seeds[i], outcome.success, outcome.max_stage, length,
                                          self.counters[i].count if self.counters else 0, outcome.disturbed))
        if self.recorder is not None:
            self.recorder.end(i, outcome.success, outcome.max_stage, length)
        if self.frames[i] is not None and self.video_dir is not None:
            env = self.twins[i].env
            self.video_paths.append(_write_video(self.frames[i], Path(self.video_dir), self.seeds[i], outcome.success,
                                                 env.metadata["render_fps"]))
        self.frames[i] = None
        if self.bar is not None:
            self.bar.update()
            self.bar.set_postfix(success=f"{sum(r.success for r in self.results)}/{len(self.results)}")


def _write_video(frames: list[np.ndarray], out_dir: Path, seed: int, success: bool, fps: float) -> str:
    from robo_rl.data.codecs import Mp4Writer

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
