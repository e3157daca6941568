"""1-D temporal U-Net over an action chunk, conditioned by FiLM (Chi et al. 2023).

Input: a noisy chunk (B, H, A), a time value per sample (diffusion step or flow time, as a float)
and a conditioning vector (B, C) from the observation encoder. Every residual block scales and
shifts its features from [time embedding, conditioning] (FiLM), so the observation steers every
level of the U-Net rather than only its input.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / (half - 1))
        args = t.float()[:, None] * freqs[None]
        return torch.cat([args.sin(), args.cos()], -1)


def time_mlp(dim: int) -> nn.Sequential:
    return nn.Sequential(SinusoidalEmbedding(dim), nn.Linear(dim, dim * 4), nn.Mish(), nn.Linear(dim * 4, dim))


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.GroupNorm(groups, c_out), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class FiLMResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel: int, groups: int):
        super().__init__()
        self.conv1 = ConvBlock(c_in, c_out, kernel, groups)
        self.conv2 = ConvBlock(c_out, c_out, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out))
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(cond)[:, :, None].chunk(2, dim=1)
        y = self.conv1(x) * scale + shift
        return self.conv2(y) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    def __init__(self, action_dim: int, cond_dim: int, down_dims: tuple[int, ...] = (128, 256, 512),
                 kernel: int = 5, groups: int = 8, time_dim: int = 128):
        super().__init__()
        self.time_emb = time_mlp(time_dim)
        c = time_dim + cond_dim
        dims = [action_dim, *down_dims]
        self.down = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == len(down_dims) - 1
            self.down.append(nn.ModuleList([
                FiLMResBlock(a, b, c, kernel, groups), FiLMResBlock(b, b, c, kernel, groups),
                nn.Conv1d(b, b, 3, 2, 1) if not last else nn.Identity()]))
        mid = down_dims[-1]
        self.mid = nn.ModuleList([FiLMResBlock(mid, mid, c, kernel, groups), FiLMResBlock(mid, mid, c, kernel, groups)])
        # Up path, deepest level first: upsample to the next finer level, join that level's skip
        # features, then two FiLM blocks. Every resolution (the chunk's own included) has a path
        # to the output, so the net can pass the noisy input through as well as reshape it.
        self.up = nn.ModuleList()
        for fine, coarse in reversed(list(zip(down_dims[:-1], down_dims[1:]))):
            self.up.append(nn.ModuleList([
                nn.ConvTranspose1d(coarse, fine, 4, 2, 1),
                FiLMResBlock(fine * 2, fine, c, kernel, groups), FiLMResBlock(fine, fine, c, kernel, groups)]))
        self.final = nn.Sequential(ConvBlock(down_dims[0], down_dims[0], kernel, groups), nn.Conv1d(down_dims[0], action_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        g = torch.cat([self.time_emb(t), cond], -1)
        h = x.transpose(1, 2)  # B A H: convolve along the chunk's time axis
        skips = []
        for res1, res2, down in self.down:
            h = res2(res1(h, g), g)
            skips.append(h)
            h = down(h)
        skips.pop()  # the deepest level's output is the mid blocks' input already
        for res in self.mid:
            h = res(h, g)
        for up, res1, res2 in self.up:
            h = torch.cat([up(h), skips.pop()], 1)
            h = res2(res1(h, g), g)
        return self.final(h).transpose(1, 2)
