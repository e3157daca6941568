"""Diffusion action-chunk policy (Chi et al. 2023): DDPM training, DDIM inference.

Training: pick a diffusion step k of T (default 100) under the squared-cosine schedule, noise
the normalised chunk A to x_k = sqrt(abar_k) A + sqrt(1 - abar_k) eps, and regress the target:
eps (Chi et al.'s choice, `prediction=epsilon`) or v = sqrt(abar_k) eps - sqrt(1 - abar_k) A
(`prediction=v`, Salimans & Ho 2022). Inference: deterministic DDIM (eta = 0) over a configurable
number of evenly spaced steps, clipping the predicted clean chunk to [-1, 1] as the
normalisation guarantees actions lie there.

Why v is offered: in terms of the clean chunk, the epsilon loss at step k weighs the error by
SNR_k = abar_k / (1 - abar_k), which is ~0 at high noise, the steps that decide the chunk's
coarse shape (when a gripper closes); and at k = T-1 (abar ~ 2e-7) the clean chunk implied by an
eps prediction is the network's error amplified ~2000x. The v loss weighs it by SNR_k + 1, like
flow matching's, and is well conditioned at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from robo_rl.errors import ConfigError
from robo_rl.policies.body import ChunkBody, weighted_mean
from robo_rl.policies.config import ChunkConfig, ObsShapes


@dataclass
class DiffusionConfig(ChunkConfig):
    train_steps: int = 100        # T: DDPM steps
    inference_steps: int = 10     # DDIM steps
    clip_sample: bool = True
    prediction: str = "v"   # v | epsilon: what the network regresses (see the module docstring)

    def validate(self) -> None:
        super().validate()
        if self.prediction not in ("epsilon", "v"):
            raise ConfigError(f"policy.prediction={self.prediction!r}; choose epsilon or v")
        if not 1 <= self.inference_steps <= self.train_steps:
            raise ConfigError(f"policy.inference_steps={self.inference_steps} must be in [1, train_steps={self.train_steps}]")


def squared_cosine_alphas_cumprod(steps: int, s: float = 0.008, max_beta: float = 0.999) -> torch.Tensor:
    """abar_k for k = 0..T-1 (Nichol & Dhariwal 2021), betas capped at `max_beta`."""
    f = lambda t: math.cos((t / steps + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    betas = torch.tensor([min(1 - f(i + 1) / f(i), max_beta) for i in range(steps)], dtype=torch.float64)
    return torch.cumprod(1 - betas, 0).float()


class DiffusionPolicy(nn.Module):
    name = "diffusion"
    config_class = DiffusionConfig

    def __init__(self, config: DiffusionConfig, shapes: ObsShapes, stats: Mapping[str, Any] | None = None):
        super().__init__()
        self.config, self.shapes = config, shapes
        self.body = ChunkBody(config, shapes, stats)
        # Derived from the config, so not saved: persistent=False.
        self.register_buffer("abar", squared_cosine_alphas_cumprod(config.train_steps), persistent=False)

    def loss(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        actions = self.body.action_norm.normalize(batch[self.shapes.action_key].float())
        cond = self.body.encode(batch)
        eps = torch.randn_like(actions)
        k = torch.randint(0, self.config.train_steps, (actions.shape[0],), device=actions.device)
        abar = self.abar[k][:, None, None]
        noisy = abar.sqrt() * actions + (1 - abar).sqrt() * eps
        target = eps if self.config.prediction == "epsilon" else abar.sqrt() * eps - (1 - abar).sqrt() * actions
        err = self.body.net(noisy, k.float(), cond) - target
        return weighted_mean(self.body.per_sample_loss(err, batch), weights)

    def forward(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(batch, weights)

    def ddim_timesteps(self, steps: int) -> list[int]:
        """Evenly spaced steps ending at the last one ("trailing", Lin et al. 2024): T=100, 10
        steps gives 99, 89, ..., 9, so the first step sees pure noise, which is what sampling
        starts from (starting at 90 would treat noise as if it still held 14% of the signal)."""
        stride = self.config.train_steps / steps
        return [int(round(self.config.train_steps - i * stride)) - 1 for i in range(steps)]

    def split(self, x: torch.Tensor, out: torch.Tensor, abar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(noise, clean chunk) implied by the network's output `out` at x_k with abar_k, for
        either prediction target (unclipped)."""
        if self.config.prediction == "epsilon":
            return out, (x - (1 - abar).sqrt() * out) / abar.sqrt()
        return (1 - abar).sqrt() * x + abar.sqrt() * out, abar.sqrt() * x - (1 - abar).sqrt() * out

    @torch.no_grad()
    def sample(self, cond: torch.Tensor, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        n = steps or self.config.inference_steps
        b = cond.shape[0]
        x = noise if noise is not None else torch.randn(b, self.config.horizon, self.shapes.action_dim, device=cond.device)
        ts = self.ddim_timesteps(n)
        for i, (k, net_at_k) in enumerate(zip(ts, self.body.step_fns([float(k) for k in ts], cond))):
            abar = self.abar[k]
            abar_prev = self.abar[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=cond.device)
            eps, x0 = self.split(x, net_at_k(x), abar)
            if self.config.clip_sample:
                x0 = x0.clamp(-1, 1)
            x = abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps
        return x

    def predict(self, obs_window: Mapping[str, Any], steps: int | None = None) -> np.ndarray:
        return self.body.predict(self.sample, obs_window, steps)
