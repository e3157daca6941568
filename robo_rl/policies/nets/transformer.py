"""DiT-style transformer over an action chunk (Peebles & Xie 2023, adapted to 1-D chunks).

Each action step is a token. The conditioning vector (time embedding + observation features)
modulates every block through adaptive LayerNorm with zero-initialised gates ("adaLN-Zero"), so
an untrained block starts as the identity and training is stable without warm-up tricks.
"""

from __future__ import annotations

import torch
from torch import nn

from robo_rl.policies.nets.unet1d import time_mlp


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.ada[-1].weight)
        nn.init.zeros_(self.ada[-1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.ada(c))

    def run(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation.chunk(6, -1)
        h = _modulate(self.norm1(x), shift1, scale1)
        x = x + gate1[:, None] * self.attn(h, h, h, need_weights=False)[0]
        return x + gate2[:, None] * self.mlp(_modulate(self.norm2(x), shift2, scale2))


class DiT1D(nn.Module):
    def __init__(self, action_dim: int, cond_dim: int, horizon: int, dim: int = 256, depth: int = 4,
                 heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.inp = nn.Linear(action_dim, dim)
        self.pos = nn.Parameter(torch.zeros(1, horizon, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.time_emb = time_mlp(dim)
        self.cond = nn.Linear(cond_dim, dim)
        self.blocks = nn.ModuleList([DiTBlock(dim, heads, mlp_ratio, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.out = nn.Linear(dim, action_dim)
        for layer in (self.final_ada[-1], self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.modulations(t, cond))

    def modulations(self, t: torch.Tensor, cond: torch.Tensor) -> list[torch.Tensor]:
        """Everything that depends on (time, observation) only: every block's adaLN shifts, scales
        and gates. A sampler computes them for all its steps in one batched call."""
        c = self.time_emb(t) + self.cond(cond)
        return [block.ada(c) for block in self.blocks] + [self.final_ada(c)]

    def run(self, x: torch.Tensor, modulations: list[torch.Tensor]) -> torch.Tensor:
        h = self.inp(x) + self.pos[:, : x.shape[1]]
        for block, m in zip(self.blocks, modulations):
            h = block.run(h, m)
        shift, scale = modulations[-1].chunk(2, -1)
        return self.out(_modulate(self.norm(h), shift, scale))
