"""What a twin episode looks like in an EpisodeStore: proprioception, object state, the executed
action and camera frames, at the robot's control rate. `collect` and `demo` both record this."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import Schema, Segment
from robo_rl.errors import ConfigError


def recording_env(task: str, cameras: Sequence[str] = (), image_size: Sequence[int] | None = None, **env_options: Any):
    """A twin of `task` that renders `cameras` at `image_size` (none: state only), and the store
    schema its steps fill: what demos, intervention rollouts and `collect` record."""
    from robo_rl.sim.envs import BimanualEnv

    cameras = list(cameras)
    if cameras and image_size is None:
        raise ConfigError(f"recording {task} with cameras {cameras}: needs image_size (the size the policy sees)")
    size = tuple(int(v) for v in image_size) if cameras else (0, 0)
    env = BimanualEnv(task, obs_mode="state+pixels" if cameras else "state", cameras=cameras,
                      image_size=size if cameras else (240, 320), **env_options)
    return env, demo_schema(env, cameras, size)


def demo_schema(env, cameras: Sequence[str], image_size: tuple[int, int]) -> Schema:
    n = env.action_space.shape[0]
    keys = {
        "obs/qpos": ((n,), "float32"),
        "obs/qvel": ((n,), "float32"),
        "obs/env_state": (env.observation_space["env_state"].shape, "float32"),
        "action": ((n,), "float32"),
    }
    keys.update({f"obs/images/{c}": ((*image_size, 3), "uint8") for c in cameras})
    return Schema.build(keys, fps=env.robot.spec.control_hz, robot=env.robot.spec.name)


def demo_step(obs: Mapping[str, Any], executed: np.ndarray, cameras: Sequence[str]) -> dict[str, np.ndarray]:
    """One store step: the observation an action was chosen from, and the action as executed."""
    step = {"obs/qpos": obs["qpos"], "obs/qvel": obs["qvel"], "obs/env_state": obs["env_state"], "action": executed}
    step.update({f"obs/images/{c}": obs["images"][c] for c in cameras})
    return step


class ExpertCommands:
    """The task's scripted expert as an action source for the episode loop: planned from the scene
    as the episode starts, then one command per tick."""

    segment = Segment.TELEOP

    def __init__(self, env: Any, noise: Any = None):
        self.env, self.noise, self.expert = env, noise, None

    def begin(self) -> None:
        self.expert = self.env.expert(self.noise)

    def action(self, deadline: float, history: list[Any], report: Any) -> np.ndarray:
        return self.expert.act()

    def close(self) -> None:
        pass


class _OneExpertEpisode:
    """The episode loop's hooks for one scripted-expert episode from `seed`: each step kept."""

    def __init__(self, twin: Any, seed: int, cameras: Sequence[str]):
        self.twin, self.seed, self.cameras = twin, seed, list(cameras)
        self.steps: list[dict[str, np.ndarray]] = []
        self.facts: dict[str, Any] = {}
        self.success, self.started = False, False

    def start(self, i: int) -> Any:
        from robo_rl.runtime.episodes import Episode

        if self.started:
            return None
        self.started = True
        self.twin.reset(self.seed)
        self.facts = {"seed": self.seed, "init_state": self.twin.sim_state().tolist(), "max_stage": 0}
        return Episode()  # to success or the task's time limit

    def step(self, i: int, obs: Any, executed: np.ndarray, segment: Any, outcome: Any) -> None:
        from robo_rl.runtime.episodes import store_step

        self.steps.append(store_step(obs, executed, self.cameras))

    def end(self, i: int, report: Any, outcome: Any) -> None:
        self.success, self.facts["max_stage"] = bool(outcome.success), int(outcome.max_stage)


def expert_episode(env, seed: int, noise: Any, cameras: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], bool, dict[str, Any]]:
    """One scripted-expert episode from `seed`, run by the episode loop in lockstep: its store
    steps stacked per key (with the demo schema's keys), whether it succeeded, and what replay
    needs (seed, initial physics state, furthest stage)."""
    from robo_rl.runtime.episodes import ControllerConfig, run_episodes
    from robo_rl.runtime.sources import PerRobot
    from robo_rl.sim.envs import TaskTwin

    twin = TaskTwin(env)
    hooks = _OneExpertEpisode(twin, seed, cameras)
    run_episodes([twin], PerRobot([ExpertCommands(env, noise)]), ControllerConfig(hz=env.robot.spec.control_hz, n_obs=1), hooks,
                 lockstep=True)
    steps = hooks.steps
    return {k: np.stack([s[k] for s in steps]) for k in steps[0]}, hooks.success, hooks.facts
