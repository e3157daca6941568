"""Running policies at control rate: action-chunk execution (and, with issue 6, the Controller)."""

from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig

__all__ = ["ChunkExecutor", "ChunkingConfig"]
