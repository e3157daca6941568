"""The episode-store schema of a twin env's demos: proprioception, object state, executed
actions and camera frames, at the robot's control rate."""

from __future__ import annotations

from typing import Sequence

from robo_rl.data.schema import Schema


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
