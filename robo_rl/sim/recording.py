"""What a twin episode looks like in an EpisodeStore: proprioception, object state, the executed
action and camera frames, at the robot's control rate. `collect` and `demo` both record this."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import Schema
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


def expert_episode(env, seed: int, noise: Any, cameras: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], bool, dict[str, Any]]:
    """One scripted-expert episode from `seed`: its store steps stacked per key (with the demo
    schema's keys), whether it succeeded, and what replay needs (seed, initial physics state,
    furthest stage)."""
    obs, _ = env.reset(seed=seed)
    facts = {"seed": seed, "init_state": env.sim_state().tolist(), "max_stage": 0}
    expert, steps, info = env.expert(noise), [], {"success": False, "max_stage": 0}
    for _ in range(env.max_steps):
        prev = obs
        obs, _, terminated, truncated, info = env.step(expert.act())
        steps.append(demo_step(prev, info["executed_action"], cameras))
        if terminated or truncated:
            break
    facts["max_stage"] = int(info["max_stage"])
    return {k: np.stack([s[k] for s in steps]) for k in steps[0]}, bool(info["success"]), facts
