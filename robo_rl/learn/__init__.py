"""The Learner: training loop, EMA, AMP, torch.compile, DDP, atomic checkpoints, logging."""

from robo_rl.learn.learner import Learner, LearnerConfig, atomic_save, last_checkpoint, warmup_cosine

__all__ = ["Learner", "LearnerConfig", "atomic_save", "last_checkpoint", "warmup_cosine"]
