"""Running policies at control rate: action-chunk execution (and the fixed-rate Controller)."""

from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig

__all__ = ["ChunkExecutor", "ChunkingConfig"]
