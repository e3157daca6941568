"""Transitions for offline RL and a replay that lives on the training device.

Three sources feed the same layout:
- an EpisodeStore (our teleop demos, rollouts and RaC interventions): sparse reward from the
  episode's success label or from per-step stages, masks, n-step returns;
- an OGBench-format `.npz` (observations, actions, terminals, optional rewards/masks/qpos);
- a dict already in the layout (e.g. what `ogbench.utils.make_env_and_datasets` returns).

The layout is "compact": one row per recorded step, with `terminals[i]` true on the last step of a
trajectory. Row i's next observation is row i+1 unless i ends its trajectory. Every array of the
replay is a device tensor and sampling draws indices with `torch.randint` on that device, so a
training step never copies data from the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from robo_rl.errors import RoboRLError


def trajectory_bounds(terminals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the index of its trajectory's first and last row."""
    terminals = np.asarray(terminals, dtype=bool).copy()
    if len(terminals) == 0:
        raise RoboRLError("dataset is empty: no steps to build transitions from")
    terminals[-1] = True  # an unterminated tail is still a trajectory
    last = np.flatnonzero(terminals)
    first = np.concatenate([[0], last[:-1] + 1])
    lengths = last - first + 1
    return np.repeat(first, lengths), np.repeat(last, lengths)


def nstep_returns(rewards: np.ndarray, masks: np.ndarray, ends: np.ndarray, n: int, gamma: float):
    """Discounted n-step sums, cut at a terminal step (mask 0) and at the trajectory's end.

    Returns (returns, bootstrap_index, bootstrap_discount): the target for row i is
    `returns[i] + bootstrap_discount[i] * V(obs[bootstrap_index[i]])`. bootstrap_discount is
    gamma^k for the k steps summed, and 0 when a terminal step was reached. A trajectory's last
    row has no next observation, so a sum stops one row before it unless that row is terminal.
    """
    rewards, masks, ends = np.asarray(rewards, np.float64), np.asarray(masks), np.asarray(ends)
    cursor = np.arange(len(rewards))
    returns = np.zeros(len(rewards))
    discount = np.ones(len(rewards))
    alive = np.ones(len(rewards), dtype=bool)
    bootstrap = np.minimum(cursor + 1, ends)
    for _ in range(n):
        returns += np.where(alive, discount * rewards[cursor], 0.0)
        terminal = masks[cursor] == 0
        discount = np.where(alive, np.where(terminal, 0.0, discount * gamma), discount)
        bootstrap = np.where(alive, np.minimum(cursor + 1, ends), bootstrap)
        nxt = np.minimum(cursor + 1, ends)
        can_go_on = (cursor + 1 < ends) | ((cursor + 1 == ends) & (masks[nxt] == 0))
        alive &= ~terminal & can_go_on
        cursor = np.where(alive, cursor + 1, cursor)
    return returns.astype(np.float32), bootstrap.astype(np.int64), discount.astype(np.float32)


REWARDS = ("success", "stage")


def episode_rewards(length: int, success: bool, reward: str, stages: np.ndarray | None = None,
                    n_stages: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, masks) of one recorded episode; the one definition the RL agents, the chunk critic
    and the twin's FlatTwinEnv share.

    success: 1 on the last step of a successful episode. stage: `stages[t]` is the sub-task stage
    reached after action t; each stage newly reached pays 1 / n_stages (on the running maximum, so
    a stage lost and regained pays once and the return never exceeds 1). A successful episode
    terminates on its last step (mask 0).
    """
    r, m = np.zeros(length, np.float32), np.ones(length, np.float32)
    if reward == "success":
        r[-1] = float(success)
    elif reward == "stage":
        if stages is None or len(stages) != length:
            raise RoboRLError(f"reward=stage needs one stage per step ({length}), got "
                              f"{'none' if stages is None else len(stages)}")
        reached = np.maximum.accumulate(np.maximum(np.asarray(stages, np.float64), 0.0))
        r[:] = np.diff(reached, prepend=0.0) / max(n_stages, 1)
    else:
        raise RoboRLError(f"reward={reward!r}; choose one of {', '.join(REWARDS)}")
    if success:
        m[-1] = 0.0
    return r, m


def transitions_from_arrays(
    observations: np.ndarray,
    actions: np.ndarray,
    terminals: np.ndarray,
    rewards: np.ndarray | None = None,
    masks: np.ndarray | None = None,
    extra: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Compact rows -> one-step transitions with explicit next_observations.

    A trajectory's last row has no next observation; it is kept only when it is terminal
    (mask 0, so the bootstrap is unused), as OGBench's loader drops it otherwise.
    """
    T = len(observations)
    for name, arr in (("actions", actions), ("terminals", terminals)):
        if len(arr) != T:
            raise RoboRLError(f"dataset: '{name}' has {len(arr)} rows, observations has {T}")
    starts, ends = trajectory_bounds(terminals)
    rewards = np.zeros(T, np.float32) if rewards is None else np.asarray(rewards, np.float32)
    masks = np.ones(T, np.float32) if masks is None else np.asarray(masks, np.float32)
    idx = np.arange(T)
    keep = (idx < ends) | (masks == 0)
    nxt = np.minimum(idx + 1, ends)
    out = {
        "observations": np.asarray(observations, np.float32)[keep],
        "actions": np.asarray(actions, np.float32)[keep],
        "rewards": rewards[keep],
        "masks": masks[keep],
        "next_observations": np.asarray(observations, np.float32)[nxt[keep]],
        "terminals": (nxt == ends)[keep],  # this transition reaches its trajectory's last row
    }
    for key, arr in (extra or {}).items():
        out[key] = np.asarray(arr)[keep]
    return out


def load_ogbench_npz(path: str | Path) -> dict[str, np.ndarray]:
    """An OGBench-format `.npz` -> compact arrays (observations, actions, terminals, and whatever
    else it holds: rewards, masks, qpos, qvel, button_states)."""
    path = Path(path)
    if not path.is_file():
        raise RoboRLError(f"OGBench dataset {path} does not exist")
    try:
        with np.load(path) as f:
            data = {k: f[k] for k in f.files}
    except Exception as e:  # a truncated or foreign file
        raise RoboRLError(f"OGBench dataset {path} cannot be read: {e}") from None
    for key in ("observations", "actions", "terminals"):
        if key not in data:
            raise RoboRLError(f"OGBench dataset {path} has no '{key}' array (has: {', '.join(sorted(data))})")
    return data


def transitions_from_store(
    store,
    obs_keys: Sequence[str] = ("obs/qpos",),
    action_key: str = "action",
    reward: str = "success",
    stages: Sequence[np.ndarray] | None = None,
    episodes: Sequence[int] | None = None,
    n_stages: int | None = None,
) -> dict[str, np.ndarray]:
    """Transitions from an EpisodeStore (demos, rollouts, RaC interventions).

    Rewards and masks are `episode_rewards`' (success, or stage with `stages[e][t]` the stage
    after step t of episode e, recovered by the twin; `n_stages` is the task's count, by default
    the highest stage in the data). Unlabelled or failed episodes give no terminal.
    The RaC segment of each step is kept as 'segments' so critics can weigh interventions.
    """
    if reward not in REWARDS:
        raise RoboRLError(f"reward={reward!r}: choose one of {', '.join(REWARDS)}")
    if reward == "stage" and stages is None:
        raise RoboRLError("reward=stage needs per-step stages (computed in the twin from obs/env_state)")
    missing = [k for k in (*obs_keys, action_key) if k not in store.data_keys]
    if missing:
        raise RoboRLError(f"{store.location}: no key(s) {', '.join(missing)} (has: {', '.join(store.data_keys)})")
    episodes = list(range(store.n_episodes)) if episodes is None else list(episodes)
    if not episodes:
        raise RoboRLError(f"{store.location}: no episodes to build transitions from")
    rows: dict[str, list[np.ndarray]] = {"obs": [], "act": [], "rew": [], "mask": [], "term": [], "seg": []}
    if n_stages is None:
        n_stages = max(int(np.max(s)) for s in stages) if stages is not None else 1
    for j, e in enumerate(episodes):
        ep = store.episode(e, keys=[*obs_keys, action_key, *(["segment"] if "segment" in store.data_keys else [])])
        T = len(ep[action_key])
        rows["obs"].append(np.concatenate([ep[k].reshape(T, -1).astype(np.float32) for k in obs_keys], axis=1))
        rows["act"].append(ep[action_key].reshape(T, -1).astype(np.float32))
        r, m = episode_rewards(T, bool(store.meta(e).success), reward, stages[j] if stages is not None else None,
                               n_stages)
        term = np.zeros(T, bool)
        term[-1] = True
        rows["rew"].append(r)
        rows["mask"].append(m)
        rows["term"].append(term)
        rows["seg"].append(ep["segment"].astype(np.int8) if "segment" in ep else np.zeros(T, np.int8))
    cat = {k: np.concatenate(v) for k, v in rows.items()}
    return transitions_from_arrays(cat["obs"], cat["act"], cat["term"], cat["rew"], cat["mask"], extra={"segments": cat["seg"]})


class DeviceReplay:
    """All arrays as tensors on one device; `sample` draws a batch without touching the host."""

    def __init__(self, arrays: Mapping[str, np.ndarray], device: str | torch.device = "cpu", seed: int = 0):
        if not arrays:
            raise RoboRLError("replay: no arrays given")
        sizes = {k: len(v) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise RoboRLError(f"replay: arrays disagree on length: {sizes}")
        self.device = torch.device(device)
        self.size = next(iter(sizes.values()))
        if self.size == 0:
            raise RoboRLError("replay: dataset is empty")
        self.data = {k: torch.as_tensor(np.ascontiguousarray(v)).to(self.device) for k, v in arrays.items()}
        for k, v in self.data.items():
            if v.dtype == torch.float64:
                self.data[k] = v.float()
        self.capacity = self.size
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def indices(self, batch_size: int) -> torch.Tensor:
        return torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator)

    def sample(self, batch_size: int, keys: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        idx = self.indices(batch_size)
        return self.gather(idx, keys)

    def gather(self, idx: torch.Tensor, keys: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        return {k: self.data[k][idx] for k in (keys or self.data)}

    def reserve(self, extra_rows: int) -> None:
        """Room for `extra_rows` rows appended by `add` (online fine-tuning), allocated once."""
        self.data = {k: torch.cat([v, v.new_zeros((extra_rows, *v.shape[1:]))]) for k, v in self.data.items()}
        self.capacity = self.size + extra_rows

    def add(self, row: Mapping[str, object]) -> None:
        """Append one transition (after `reserve`); sampling then covers it."""
        if self.size >= self.capacity:
            raise RoboRLError(f"replay: full at {self.size} rows; reserve() more before adding")
        for k, v in self.data.items():
            v[self.size] = torch.as_tensor(np.asarray(row[k]), dtype=v.dtype, device=self.device)
        self.size += 1

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.data.values())
