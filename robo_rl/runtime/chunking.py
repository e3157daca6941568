"""Turning predicted action chunks into one command per control tick.

Two ways to execute chunks:
- `receding`: run the first Ta actions of a chunk, then predict again. When the new chunk takes
  over, the next `blend_steps` commands move linearly from the old chunk's continuation to the
  new chunk, so the commanded joints never jump at the hand-over.
- `ensemble` (ACT's temporal ensembling): predict every `query_every` ticks and average every
  chunk that covers the current tick, weighting the i-th oldest by exp(-decay * i).

Pure numpy, no robot and no network: the twin's evaluator and the real-time Controller share it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from robo_rl.errors import ConfigError

MODES = ("receding", "ensemble")


@dataclass
class ChunkingConfig:
    mode: str = "receding"
    n_action_steps: int = 8     # Ta (receding)
    blend_steps: int = 4        # hand-over ramp length (receding); 0 = switch at once
    query_every: int = 1        # prediction period in ticks (ensemble)
    ensemble_decay: float = 0.01

    def validate(self, horizon: int) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"chunking.mode={self.mode!r}; choose one of {MODES}")
        if self.mode == "receding" and not 1 <= self.n_action_steps <= horizon:
            raise ConfigError(f"chunking.n_action_steps={self.n_action_steps} must be in [1, horizon={horizon}]")
        if self.mode == "ensemble" and not 1 <= self.query_every <= horizon:
            raise ConfigError(f"chunking.query_every={self.query_every} must be in [1, horizon={horizon}]")
        if self.blend_steps < 0:
            raise ConfigError(f"chunking.blend_steps must be >= 0, got {self.blend_steps}")


class ChunkExecutor:
    """One robot's chunk schedule. Each tick: if `needs_prediction()`, `push(chunk)` the chunk
    predicted from the latest observation; then `next()` gives this tick's command."""

    def __init__(self, cfg: ChunkingConfig, horizon: int):
        cfg.validate(horizon)
        self.cfg, self.horizon = cfg, horizon
        self.reset()

    def reset(self) -> None:
        self.t = 0
        self.chunk: np.ndarray | None = None   # receding: the chunk being executed
        self.chunk_start = 0
        self.blend_from: np.ndarray | None = None  # old chunk's continuation, for the ramp
        self.chunks: deque[tuple[int, np.ndarray]] = deque()  # ensemble: (start tick, chunk)
        self.last_command: np.ndarray | None = None

    def needs_prediction(self) -> bool:
        if self.cfg.mode == "ensemble":
            return self.t % self.cfg.query_every == 0 or not self.chunks
        return self.chunk is None or self.t - self.chunk_start >= self.cfg.n_action_steps

    def push(self, chunk: np.ndarray) -> None:
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or chunk.shape[0] != self.horizon:
            raise ConfigError(f"chunk has shape {chunk.shape}; expected ({self.horizon}, action_dim)")
        if self.cfg.mode == "ensemble":
            self.chunks.append((self.t, chunk))
            while self.chunks and self.chunks[0][0] + self.horizon <= self.t:
                self.chunks.popleft()
            return
        b = self.cfg.blend_steps
        if self.chunk is not None and b > 0:
            idx = np.minimum(self.t - self.chunk_start + np.arange(b), self.horizon - 1)
            self.blend_from = self.chunk[idx]
        else:
            self.blend_from = None
        self.chunk, self.chunk_start = chunk, self.t

    def next(self) -> np.ndarray:
        if self.cfg.mode == "ensemble":
            action = self._ensembled()
        else:
            if self.chunk is None:
                raise RuntimeError("ChunkExecutor.next() before any chunk was pushed")
            j = self.t - self.chunk_start
            action = self.chunk[min(j, self.horizon - 1)]
            if self.blend_from is not None and j < len(self.blend_from):
                w = (j + 1) / (len(self.blend_from) + 1)
                action = (1 - w) * self.blend_from[j] + w * action
        self.t += 1
        self.last_command = action
        return action

    def _ensembled(self) -> np.ndarray:
        live = [(s, c) for s, c in self.chunks if s <= self.t < s + self.horizon]
        if not live:
            raise RuntimeError("ChunkExecutor: no chunk covers this tick; push a prediction first")
        return ensemble_mean([c[self.t - s] for s, c in live], self.cfg.ensemble_decay)


def ensemble_mean(actions: list[np.ndarray], decay: float) -> np.ndarray:
    """ACT's temporal ensembling: the mean of the actions several chunks give for one tick, the
    i-th oldest chunk's weighted exp(-decay * i). Shared by ChunkExecutor (ticks) and the real-time
    Controller (absolute time)."""
    w = np.exp(-decay * np.arange(len(actions)))
    return (w[:, None] * np.stack(actions)).sum(0) / w.sum()
