"""The twin as a flat-vector env for value-based RL (FQL, floq): observation = the chosen obs keys
concatenated, action = one step in [-1, 1]^14 mapped onto a joint-target box (the recorded
actions' range), reward = sparse success (1 and terminate) or stage progress (1/n per stage)."""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from robo_rl.errors import ConfigError
from robo_rl.rl.replay import REWARDS
from robo_rl.sim.envs import BimanualEnv



class FlatTwinEnv(gym.Env):
    def __init__(self, task: str, obs_keys: Sequence[str], action_low: np.ndarray, action_high: np.ndarray,
                 reward: str = "success", max_steps: int | None = None):
        if reward not in REWARDS:
            raise ConfigError(f"reward={reward!r}: choose one of {REWARDS}")
        self.env = BimanualEnv(task, obs_mode="state", max_steps=max_steps)
        self.names = []
        for k in obs_keys:
            name = k.split("/", 1)[1] if k.startswith("obs/") else k
            if name not in self.env.observation_space.spaces or name == "images":
                raise ConfigError(f"obs key {k!r}: the twin's state observation has {sorted(self.env.observation_space.spaces)}")
            self.names.append(name)
        self.low, self.high = np.asarray(action_low, np.float64), np.asarray(action_high, np.float64)
        if self.low.shape != self.env.action_space.shape:
            raise ConfigError(f"action range has {self.low.shape[0]} dims; the twin's actions have {self.env.action_space.shape[0]}")
        self.reward_kind = reward
        self.n_stages = len(self.env.task.stage_names) - 1
        dim = sum(self.env.observation_space[n].shape[0] for n in self.names)
        self.observation_space = spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, self.env.action_space.shape, np.float32)
        self._stage = 0

    def flat(self, obs: dict) -> np.ndarray:
        return np.concatenate([np.asarray(obs[n], np.float32).ravel() for n in self.names])

    def to_joint_targets(self, action: np.ndarray) -> np.ndarray:
        a = np.clip(np.asarray(action, np.float64), -1.0, 1.0)
        return self.low + (a + 1.0) * 0.5 * (self.high - self.low)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._stage = 0
        return self.flat(obs), info

    def step(self, action: np.ndarray):
        obs, _, terminated, truncated, info = self.env.step(self.to_joint_targets(action))
        if self.reward_kind == "success":
            reward = float(info["success"])
        else:
            reward = max(info["max_stage"] - self._stage, 0) / max(self.n_stages, 1)
            self._stage = max(self._stage, info["max_stage"])
        return self.flat(obs), reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()


def evaluate_flat(env: FlatTwinEnv, act, episodes: int, seed: int) -> dict:
    """Success and stage reach of `act(flat_obs) -> action in [-1, 1]` over seeded episodes."""
    successes, stages, lengths = [], [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, info, n = False, {"success": False, "max_stage": 0}, 0
        while not done:
            obs, _, terminated, truncated, info = env.step(act(obs))
            done, n = terminated or truncated, n + 1
        successes.append(bool(info["success"]))
        stages.append(int(info["max_stage"]))
        lengths.append(n)
    names = env.env.task.stage_names
    return {"success_rate": float(np.mean(successes)), "episodes": episodes, "mean_length": float(np.mean(lengths)),
            **{f"reach_{names[k]}": float(np.mean(np.array(stages) >= k)) for k in range(1, len(names))}}
