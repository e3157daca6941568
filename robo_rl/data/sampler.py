"""Training windows: To past observations and H future actions around a step t.

    obs      o[t-To+1 .. t]     repeated first frame of the episode where t-To+1 < start (obs_is_pad)
    action   a[t .. t+H-1]      repeated last action of the episode where t+H-1 >= end (action_is_pad)

An episode that ended in success is done: holding its last action is what comes next. One that
was cut short (a RaC intervention ended after its correction, a failure, a time limit) has an
unknown future, so its padded actions are flagged `action_is_cut` and the policies' losses skip
them; learning "hold still" there would teach the policy to stall where the cut happened.

Every step of every selected episode is one window. The selected episodes are read into memory
once (camera frames decoded: a store's training-size copies where it keeps them, so training
never decodes a full camera frame), so drawing a batch is a handful of vectorised gathers rather than
per-sample slicing; low-dimensional data can live on the GPU with indices drawn there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import SEGMENT_KEY, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

# Default weights per segment label; RaC and its baselines replace this table.
DEFAULT_SEGMENT_WEIGHTS = {s.name: 1.0 for s in Segment}


def split_episodes(n_episodes: int, val_ratio: float = 0.1, seed: int = 0) -> tuple[list[int], list[int]]:
    """Split episode indices into train and validation sets (at least one of each when possible)."""
    if not 0.0 <= val_ratio < 1.0:
        raise ConfigError(f"val_ratio must be in [0, 1), got {val_ratio}")
    order = np.random.default_rng(seed).permutation(n_episodes)
    n_val = int(round(val_ratio * n_episodes))
    if val_ratio > 0 and n_episodes >= 2:
        n_val = min(max(n_val, 1), n_episodes - 1)
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def segment_weight_table(weights: Mapping[str | Segment, float] | None) -> np.ndarray:
    """A lookup array weight[segment_label] from a {label: weight} mapping; unnamed labels weigh 1."""
    table = np.ones(len(Segment), dtype=np.float32)
    for name, w in (weights or {}).items():
        if w < 0:
            raise ConfigError(f"segment weight for {name} is {w}; weights must be >= 0")
        table[int(Segment.parse(name))] = float(w)
    return table


@dataclass
class WindowSpec:
    obs_keys: Sequence[str]
    action_key: str = "action"
    n_obs: int = 2  # To
    horizon: int = 16  # H


class WindowSampler:
    """Vectorised window sampling over selected episodes of a store."""

    def __init__(
        self,
        store: EpisodeStore,
        obs_keys: Sequence[str],
        action_key: str = "action",
        n_obs: int = 2,
        horizon: int = 16,
        episodes: Sequence[int] | None = None,
        segment_weights: Mapping[str | Segment, float] | None = None,
        device: str | None = None,
        max_memory_gb: float | None = None,
    ):
        if n_obs < 1 or horizon < 1:
            raise ConfigError(f"n_obs and horizon must be >= 1, got n_obs={n_obs}, horizon={horizon}")
        for k in [*obs_keys, action_key]:
            if k not in store.schema.keys:
                raise ConfigError(f"{store.location}: no key '{k}' to sample; keys are {list(store.schema.keys)}")
        self.spec = WindowSpec(list(obs_keys), action_key, n_obs, horizon)
        self.episodes = list(range(store.n_episodes) if episodes is None else episodes)
        if not self.episodes:
            raise ConfigError(f"{store.location}: no episodes to sample from")
        ranges = [store.episode_range(i) for i in self.episodes]
        lengths = np.array([e - s for s, e in ranges], dtype=np.int64)
        # a camera is read at the store's training size when it keeps copies at that size
        small = store.train_image_size
        self.image_sizes = {k: tuple(small or store.schema.keys[k].shape[:2]) for k in obs_keys
                            if k in store.schema.image_keys}
        row_bytes = {k: store.schema.keys[k].nbytes for k in {*obs_keys, action_key}}
        for k, (h, w) in self.image_sizes.items():
            row_bytes[k] = h * w * store.schema.keys[k].shape[2]
        needed = sum(row_bytes.values()) * int(lengths.sum())
        budget = (max_memory_gb or _available_memory_gb() * 0.7) * 2**30
        if needed > budget:
            raise ConfigError(
                f"{store.location}: the selected keys take {needed / 2**30:.1f} GiB in memory, over the "
                f"{budget / 2**30:.1f} GiB budget; select fewer episodes or keys, or raise max_memory_gb"
            )
        # One contiguous array per key holding just the selected episodes.
        self.data: dict[str, Any] = {}
        for key in {*obs_keys, action_key, SEGMENT_KEY}:
            parts = _read_ranges(store, key, ranges, small=bool(small) and key in self.image_sizes)
            self.data[key] = parts
        ends = np.cumsum(lengths)
        starts = ends - lengths
        n = int(ends[-1])
        episode_of_step = np.repeat(np.arange(len(ranges)), lengths)
        self.t = np.arange(n, dtype=np.int64)
        self.start = starts[episode_of_step]
        self.end = ends[episode_of_step]
        self.episode_id = np.asarray(self.episodes, dtype=np.int64)[episode_of_step]
        # success=None (no label, e.g. an imported dataset) counts as finished, as before labels existed
        finished = np.array([store.meta(i).success is not False for i in self.episodes], dtype=bool)
        self.cut = ~finished[episode_of_step]
        self.weights = segment_weight_table(segment_weights)[self.data[SEGMENT_KEY]]
        self._cdf, self._cdf_of = None, None  # cumulative weights, and the weights array they were summed from
        self.device = device
        # The arrays `get` gathers from: numpy here, or torch tensors on `device`.
        self._xp = np
        self._cols = {
            "t": self.t, "start": self.start, "end": self.end, "episode": self.episode_id, "weight": self.weights,
            "cut": self.cut,
            "obs_offsets": np.arange(-n_obs + 1, 1, dtype=np.int64), "act_offsets": np.arange(horizon, dtype=np.int64),
        }
        self._data = self.data
        if device is not None:
            import torch

            as_t = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=torch.device(device))  # noqa: E731
            self._xp = torch
            self._cols = {k: as_t(v) for k, v in self._cols.items()}
            self._data = {k: as_t(v) for k, v in self.data.items()}

    def __len__(self) -> int:
        return len(self.t)

    def reweight(self, weights: np.ndarray) -> None:
        """Replace the per-window weights (one per step of the selected episodes, in order), e.g.
        with a RaC data composition (robo_rl.rac.mixing)."""
        weights = np.asarray(weights, dtype=np.float32)
        if weights.shape != self.weights.shape or (weights < 0).any() or not np.isfinite(weights).all():
            raise ConfigError(f"reweight: need {self.weights.shape[0]} finite weights >= 0, got shape {weights.shape}")
        self.weights = weights
        if self._xp is not np:
            self._cols["weight"] = self._xp.as_tensor(weights, device=self._cols["weight"].device)

    def get(self, idx: Any) -> dict[str, Any]:
        """The windows at step indices `idx` (1-D): a dict of batched numpy arrays, or torch tensors
        on `device` when the sampler has one."""
        xp, c, data = self._xp, self._cols, self._data
        if xp is np:
            idx = np.asarray(idx, dtype=np.int64)
        else:
            idx = xp.as_tensor(idx, device=c["t"].device, dtype=xp.long)
        t = c["t"][idx]
        start = c["start"][idx][:, None]
        end = c["end"][idx][:, None]
        obs_raw = t[:, None] + c["obs_offsets"]
        act_raw = t[:, None] + c["act_offsets"]
        obs_rows = xp.maximum(obs_raw, start)
        batch = {k: _take(data[k], obs_rows) for k in self.spec.obs_keys}
        batch[self.spec.action_key] = _take(data[self.spec.action_key], xp.minimum(act_raw, end - 1))
        batch["obs_is_pad"] = obs_raw < start
        batch["action_is_pad"] = act_raw >= end
        batch["action_is_cut"] = batch["action_is_pad"] & c["cut"][idx][:, None]
        batch["weight"] = c["weight"][idx]
        batch["segment"] = data[SEGMENT_KEY][idx]
        batch["episode"] = c["episode"][idx]
        batch["index"] = idx
        return batch

    def sample(self, batch_size: int, rng: Any = None, weighted: bool = False) -> dict[str, Any]:
        """A random batch; weighted=True draws windows in proportion to their segment weights.
        `rng`: a numpy Generator, or a torch Generator on the sampler's device."""
        if self._xp is np:
            rng = rng if rng is not None else np.random.default_rng()
            if weighted:  # inverse CDF: the cumulative weights are summed once, not on every draw
                cdf = self._cumulative_weights()
                idx = np.searchsorted(cdf, rng.random(batch_size) * cdf[-1], side="right")
            else:
                idx = rng.integers(0, len(self), size=batch_size)
        else:
            torch, w = self._xp, self._cols["weight"]
            if weighted:  # a zero weight's cumulative sum equals its predecessor's, so it is never drawn
                cdf = self._cumulative_weights()
                u = torch.rand(batch_size, device=w.device, generator=rng, dtype=cdf.dtype) * cdf[-1]
                idx = torch.searchsorted(cdf, u, right=True)
            else:
                idx = torch.randint(0, len(self), (batch_size,), device=w.device, generator=rng)
        return self.get(idx)

    def _cumulative_weights(self) -> Any:
        """Cumulative window weights in float64, cached until `reweight` (multinomial over 10^5
        weights per batch halved the GPU learner's rate)."""
        if self._cdf_of is not self.weights:
            if self.weights.sum() <= 0:
                raise ConfigError("weighted sampling: every window has weight 0")
            cdf = np.cumsum(self.weights, dtype=np.float64)
            self._cdf = cdf if self._xp is np else self._xp.as_tensor(cdf, device=self._cols["weight"].device)
            self._cdf_of = self.weights
        return self._cdf


def _take(rows: Any, index: Any) -> Any:
    """rows[index] for an index array of any shape. For torch tensors, one index_select over the
    flattened index: advanced indexing of a 96x96x3 frame array took 7x longer (3.0 against 0.4 ms
    for 128 frames, bench/policy.py cameras), a tenth of a camera training step."""
    if isinstance(rows, np.ndarray):
        return rows[index]
    return rows.index_select(0, index.reshape(-1)).view(*index.shape, *rows.shape[1:])


def _read_ranges(store: EpisodeStore, key: str, ranges: list[tuple[int, int]], small: bool = False) -> np.ndarray:
    """Concatenate rows of the given [start, end) ranges, merging touching ranges into one read."""
    merged: list[list[int]] = []
    for s, e in ranges:
        if merged and merged[-1][1] == s:
            merged[-1][1] = e
        else:
            merged.append([s, e])
    parts = [store.read(key, s, e, small=small) for s, e in merged]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _available_memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 8.0


# ---------------------------------------------------------------------- torch Dataset
def window_dataset(sampler: WindowSampler):
    """A torch Dataset over a (CPU) sampler; see `window_loader` for a DataLoader around it."""
    import torch
    from torch.utils.data import Dataset

    class WindowDataset(Dataset):
        def __init__(self, s: WindowSampler):
            if s.device is not None:
                raise ConfigError("window_dataset: use a CPU sampler (device=None) with DataLoader workers")
            self.sampler = s

        def __len__(self) -> int:
            return len(self.sampler)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {k: torch.from_numpy(v[0]) for k, v in self.sampler.get([i]).items()}

        def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
            # DataLoader hands a whole batch of indices here: one vectorised gather per key.
            return {k: torch.from_numpy(v) for k, v in self.sampler.get(indices).items()}

    return WindowDataset(sampler)


def collate_batch(batch: Any) -> Any:
    """Collate for `window_dataset`: `__getitems__` already returns a batched dict."""
    return batch


def window_loader(
    sampler: WindowSampler,
    batch_size: int = 64,
    num_workers: int = 0,
    weighted: bool = False,
    seed: int = 0,
    num_batches: int | None = None,
    pin_memory: bool = False,
):
    """A DataLoader of random windows (uniform, or by segment weight).

    Keep num_workers=0 unless per-batch work is added on top: a batch is one vectorised gather
    per key, and workers only add inter-process copies (bench/data.py: 290 k low-dim windows/s
    with 0 workers, ~6 k with 1-2; AMD EPYC, AVX2).
    """
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, WeightedRandomSampler

    ds = window_dataset(sampler)
    g = torch.Generator().manual_seed(seed)
    n = (num_batches or max(1, len(ds) // batch_size)) * batch_size
    if weighted:
        base = WeightedRandomSampler(torch.as_tensor(sampler.weights, dtype=torch.double), n, replacement=True, generator=g)
    else:
        base = RandomSampler(ds, replacement=True, num_samples=n, generator=g)
    return DataLoader(
        ds,
        batch_sampler=BatchSampler(base, batch_size, drop_last=True),
        num_workers=num_workers,
        collate_fn=collate_batch,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
