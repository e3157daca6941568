"""Online fine-tuning at a chosen UTD ratio σ (gradient updates per environment transition; fractional
σ allowed). This module imports neither `robo_rl.sim` nor `robo_rl.hardware`: the CLI hands it the env.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from robo_rl.errors import RoboRLError


class Env(Protocol):
    """gymnasium-style: reset -> (obs, info), step -> (obs, reward, terminated, truncated, info)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]: ...

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]: ...


class Agent(Protocol):
    def act(self, obs: np.ndarray) -> np.ndarray: ...

    def update(self, batch: Any) -> Mapping[str, float]: ...


class ReplayAdd(Protocol):
    def __call__(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
                 terminated: bool, truncated: bool) -> None: ...


def updates_due(env_steps: int, utd: float) -> int:
    """Updates owed after `env_steps` transitions at ratio σ: floor(σ · steps). The loop pays the
    difference after every step, so σ = 0.5 updates every other step and σ = 4 four times a step.
    Computed from the step count (not a running float sum) so rounding never drifts."""
    return int(math.floor(utd * env_steps + 1e-9))


def online_finetune(agent: Agent, env: Env, replay_add: ReplayAdd, utd: float, env_steps: int, batch_size: int,
                    sample_batch: Callable[[int], Any], eval_fn: Callable[[Agent], Any] | None = None,
                    eval_every: int = 0, on_update: Callable[[int, Mapping[str, float]], None] | None = None,
                    progress: bool = True, learning_starts: int = 0, seed: int | None = None) -> dict[str, Any]:
    """Online fine-tuning at UTD ratio σ = `utd`: act, store the transition, then make the updates owed.

    Each env step: `action = agent.act(obs)`, `env.step(action)`, `replay_add(obs, action, reward,
    next_obs, terminated, truncated)`; then, once `learning_starts` steps have been taken, as many
    `agent.update(sample_batch(batch_size))` calls as bring the count to floor(σ · steps since
    learning_starts) (`updates_due`). An episode that ends is reset. With `eval_fn` and `eval_every`,
    `eval_fn(agent)` (a float score or a dict) runs every `eval_every` env steps. `on_update(i, metrics)`
    is called after update i (1-based).

    Returns {"env_steps", "updates", "utd", "utd_achieved" (updates / steps after learning_starts),
    "episodes" (finished), "returns" (per finished episode), "evaluations" ([{"env_step", "updates",
    "score" or the dict's keys}]), "last_metrics"}.
    """
    from tqdm import tqdm

    if not (math.isfinite(utd) and utd > 0):
        raise RoboRLError(f"online_finetune: utd={utd}; the UTD ratio must be > 0 (0.5 = an update every 2 steps)")
    if int(env_steps) < 1 or int(batch_size) < 1:
        raise RoboRLError(f"online_finetune: env_steps={env_steps} and batch_size={batch_size} must be >= 1")
    if not 0 <= int(learning_starts) < int(env_steps):
        raise RoboRLError(f"online_finetune: learning_starts={learning_starts} must be in [0, env_steps={env_steps})")
    if eval_every < 0:
        raise RoboRLError(f"online_finetune: eval_every={eval_every} must be >= 0 (0: no evaluations)")
    env_steps, batch_size, learning_starts = int(env_steps), int(batch_size), int(learning_starts)

    obs, _ = env.reset(seed=seed)
    updates, ep_return, returns, evaluations = 0, 0.0, [], []
    last_metrics: dict[str, float] = {}
    bar = tqdm(total=env_steps, desc=f"online UTD {utd:g}", unit="step", disable=not progress)
    try:
        for t in range(1, env_steps + 1):
            action = np.asarray(agent.act(np.asarray(obs)))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            replay_add(obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
            ep_return += float(reward)
            if terminated or truncated:
                returns.append(ep_return)
                ep_return = 0.0
                obs, _ = env.reset()
            else:
                obs = next_obs
            if t > learning_starts:
                for _ in range(updates_due(t - learning_starts, utd) - updates):
                    last_metrics = {k: float(v) for k, v in (agent.update(sample_batch(batch_size)) or {}).items()}
                    updates += 1
                    if on_update is not None:
                        on_update(updates, last_metrics)
            if eval_fn is not None and eval_every and t % eval_every == 0:
                result = eval_fn(agent)
                entry = dict(result) if isinstance(result, Mapping) else {"score": float(result)}
                evaluations.append({"env_step": t, "updates": updates, **entry})
            bar.update()
            if returns and t % 100 == 0:
                bar.set_postfix(updates=updates, ret=f"{returns[-1]:.1f}")
    finally:
        bar.close()
    counted = env_steps - learning_starts
    return {"env_steps": env_steps, "updates": updates, "utd": float(utd), "utd_achieved": updates / counted,
            "episodes": len(returns), "returns": returns, "evaluations": evaluations, "last_metrics": last_metrics}
