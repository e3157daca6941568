"""Normalisation statistics: computed once over a store's committed steps, saved inside it, and
carried by policies in their checkpoints (as diffusion_policy does: actions to [-1, 1] per dimension)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

STAT_NAMES = ("min", "max", "mean", "std", "p01", "p99")
NORM_MODES = ("minmax", "meanstd", "percentile", "identity")


def compute_stats(store: EpisodeStore, keys: Iterable[str] | None = None) -> dict[str, dict[str, list]]:
    """Per-dimension statistics of every low-dimensional float key (or the keys given)."""
    keys = list(keys) if keys is not None else [
        k for k in store.schema.lowdim_keys if np.dtype(store.schema.keys[k].dtype).kind == "f"
    ]
    out = {}
    for key in keys:
        if key in store.schema.keys and store.schema.keys[key].is_image:
            raise ConfigError(f"stats: key '{key}' is an image; statistics are for low-dimensional keys")
        x = store.read(key).astype(np.float64)
        if len(x) == 0:
            raise ConfigError(f"{store.location}: no committed steps to compute statistics of '{key}' from")
        x = x.reshape(len(x), -1)
        p01, p99 = np.percentile(x, [1, 99], axis=0)
        out[key] = {
            "min": x.min(0).tolist(),
            "max": x.max(0).tolist(),
            "mean": x.mean(0).tolist(),
            "std": x.std(0).tolist(),
            "p01": p01.tolist(),
            "p99": p99.tolist(),
        }
    return out


def get_stats(store: EpisodeStore, keys: Iterable[str] | None = None, save: bool = True) -> dict[str, dict[str, list]]:
    """Saved statistics when they cover the store as it is now; otherwise compute (and save)."""
    keys = list(keys) if keys is not None else None
    saved = store.load_stats()
    if saved is not None and (keys is None or all(k in saved for k in keys)):
        return {k: saved[k] for k in (keys or saved)}
    stats = compute_stats(store, keys)
    if save:
        merged = dict(saved or {})
        merged.update(stats)
        store.save_stats(merged)
    return stats


class Normalizer:
    """Affine per-dimension map x -> (x - offset) * scale, for numpy arrays and torch tensors alike.

    minmax / percentile map [lo, hi] to [-1, 1]; meanstd to zero mean, unit variance. Dimensions
    that never vary (hi == lo, std == 0) pass through centred, never divided by zero.
    """

    def __init__(self, offset: np.ndarray, scale: np.ndarray, mode: str):
        self.offset = np.asarray(offset, dtype=np.float32)
        self.scale = np.asarray(scale, dtype=np.float32)
        self.mode = mode

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], mode: str = "minmax", shape: tuple[int, ...] | None = None,
                   min_span: float = 0.0) -> "Normalizer":
        """`min_span` floors hi - lo (minmax / percentile) or 2 std (meanstd): a dimension that
        barely moved in the demos would otherwise be scaled up so far that a small deviation at
        run time lands far outside anything the network saw."""
        if mode not in NORM_MODES:
            raise ConfigError(f"normalisation mode {mode!r} unknown; choose one of {NORM_MODES}")
        s = {k: np.asarray(v, dtype=np.float64) for k, v in stats.items()}
        if mode == "identity":
            offset, scale = np.zeros_like(s["mean"]), np.ones_like(s["mean"])
        elif mode == "meanstd":
            offset = s["mean"]
            std = np.maximum(s["std"], min_span / 2)
            scale = 1.0 / np.where(std < 1e-6, 1.0, std)
        else:
            lo, hi = (s["min"], s["max"]) if mode == "minmax" else (s["p01"], s["p99"])
            span = np.maximum(hi - lo, min_span)
            constant = span < 1e-6
            offset = (hi + lo) / 2
            scale = np.where(constant, 1.0, 2.0 / np.where(constant, 1.0, span))
        if shape is not None:
            offset, scale = offset.reshape(shape), scale.reshape(shape)
        return cls(offset, scale, mode)

    def normalize(self, x: Any) -> Any:
        off, sc = self._like(x)
        return (x - off) * sc

    def unnormalize(self, x: Any) -> Any:
        off, sc = self._like(x)
        return x / sc + off

    def _like(self, x: Any) -> tuple[Any, Any]:
        if isinstance(x, np.ndarray):
            return self.offset, self.scale
        import torch  # only when asked to work on tensors

        return (torch.as_tensor(self.offset, device=x.device, dtype=x.dtype),
                torch.as_tensor(self.scale, device=x.device, dtype=x.dtype))

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset.tolist(), "scale": self.scale.tolist(), "mode": self.mode}

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> "Normalizer":
        return cls(np.asarray(d["offset"]), np.asarray(d["scale"]), d["mode"])
