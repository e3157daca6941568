"""Checkpoints as fast as it can, printing each committed step; the test SIGKILLs it mid-write."""

import sys

import torch
from torch import nn

from robo_rl.learn import Learner, LearnerConfig


class Big(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(1500, 1500)  # ~9 MB of weights (+ EMA + Adam state): writes take a while

    def forward(self, batch, weights=None):
        return self.w(batch["x"]).pow(2).mean()


def main(run_dir: str) -> None:
    learner = Learner(Big(), LearnerConfig(steps=10**9, batch_size=4, keep_checkpoints=0, warmup_steps=1), run_dir,
                      lambda bs, gen, w: {"x": torch.randn(bs, 1500, generator=gen)}, progress=False)
    while True:
        learner.train_step()
        learner.save()
        print(f"saved {learner.step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
