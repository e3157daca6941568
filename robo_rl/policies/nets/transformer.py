"""DiT-style transformer over an action chunk (Peebles & Xie 2023, adapted to 1-D chunks).

Each token is `patch` consecutive action steps (1 by default; 2 halves the tokens and so the
arithmetic of every block). The conditioning vector (time embedding + observation features)
modulates every block through adaptive LayerNorm with zero-initialised gates ("adaLN-Zero"), so
an untrained block starts as the identity and training is stable without warm-up tricks.
"""

from __future__ import annotations

import torch
from torch import nn

from robo_rl.policies.nets.unet1d import time_mlp


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

    def run(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        """`modulation` (B, 6, 1, dim): shift, 1 + scale, gate for attention, then for the MLP.
        addcmul fuses each multiply-add: at batch 1 a CPU pays per op, not per flop."""
        shift1, scale1, gate1, shift2, scale2, gate2 = modulation.unbind(1)
        h = torch.addcmul(shift1, self.norm1(x), scale1)
        x = torch.addcmul(x, gate1, self.attn(h, h, h, need_weights=False)[0])
        return torch.addcmul(x, gate2, self.mlp(torch.addcmul(shift2, self.norm2(x), scale2)))


class DiT1D(nn.Module):
    def __init__(self, action_dim: int, cond_dim: int, horizon: int, dim: int = 256, depth: int = 4,
                 heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0, patch: int = 1):
        super().__init__()
        self.patch = patch
        self.inp = nn.Linear(action_dim * patch, dim)
        self.pos = nn.Parameter(torch.zeros(1, horizon // patch, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.time_emb = time_mlp(dim)
        self.cond = nn.Linear(cond_dim, dim)
        self.blocks = nn.ModuleList([DiTBlock(dim, heads, mlp_ratio, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.out = nn.Linear(dim, action_dim * patch)
        for layer in (self.final_ada[-1], self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        # Adds the 1 of (1 + scale) to the scale rows of a (N, 6 or 2, 1, dim) modulation.
        self.register_buffer("scale_one", torch.tensor([0.0, 1, 0, 0, 1, 0]).view(6, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.modulations(t, cond))

    def modulations(self, t: torch.Tensor, cond: torch.Tensor) -> list[torch.Tensor]:
        """Everything that depends on (time, observation) only: every block's adaLN shifts, scales
        and gates. A sampler computes them for all its steps in one batched call."""
        c = self.time_emb(t) + self.cond(cond)
        n, d = c.shape
        mods = [block.ada(c).view(n, 6, 1, d) + self.scale_one for block in self.blocks]
        return mods + [self.final_ada(c).view(n, 2, 1, d) + self.scale_one[:2]]

    def run(self, x: torch.Tensor, modulations: list[torch.Tensor]) -> torch.Tensor:
        b, steps, a = x.shape
        h = self.inp(x.reshape(b, steps // self.patch, self.patch * a)) + self.pos[:, : steps // self.patch]
        for block, m in zip(self.blocks, modulations):
            h = block.run(h, m)
        shift, scale = modulations[-1].unbind(1)
        return self.out(torch.addcmul(shift, self.norm(h), scale)).reshape(b, steps, a)
