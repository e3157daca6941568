"""Flow-matching action-chunk policy (conditional flow matching / rectified flow).

Training: draw noise x0 ~ N(0, I) and a time tau, form the straight-line point
x_tau = (1 - tau) x0 + tau A between noise and the (normalised) action chunk A, and regress the
network's velocity v(x_tau, tau | obs) onto A - x0. Inference: start from noise and take K Euler
steps of size 1/K along v; tau = 1 is the data end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from robo_rl.errors import ConfigError
from robo_rl.policies.body import ChunkBody, weighted_mean
from robo_rl.policies.config import ChunkConfig, ObsShapes


@dataclass
class FlowConfig(ChunkConfig):
    inference_steps: int = 10       # K Euler steps
    # Inference only: the starting noise is drawn at this scale (1: the learned distribution; < 1:
    # nearer its most likely chunks). Full-scale draws from a small policy's tails can land in
    # another sub-task's mode (docs/history.md, the CPU demo's row 27).
    sample_temperature: float = 1.0
    time_sampling: str = "uniform"  # uniform | beta (Beta(a, b) on tau; a > b favours low noise, tau near 1)
    beta_a: float = 1.5
    beta_b: float = 1.0
    time_scale: float = 1000.0      # tau in [0, 1] is embedded as tau * time_scale (same range as DDPM steps)
    # Camera policies: the observation encoder is most of a step's cost, and the flow loss gives it a
    # noisy signal. Several (noise, tau) draws per encoded window, and an auxiliary regression of the
    # chunk from the observation alone (a head used only in training), both feed it more per frame.
    noise_samples: int = 1          # flow-loss draws per window (the encoding is shared)
    aux_chunk_weight: float = 0.0   # weight of the chunk-regression loss (0: no head)

    def validate(self) -> None:
        super().validate()
        if self.time_sampling not in ("uniform", "beta"):
            raise ConfigError(f"policy.time_sampling={self.time_sampling!r}; choose uniform or beta")
        if self.inference_steps < 1:
            raise ConfigError(f"policy.inference_steps must be >= 1, got {self.inference_steps}")
        if not 0.0 <= self.sample_temperature <= 1.0:
            raise ConfigError(f"policy.sample_temperature={self.sample_temperature} must be in [0, 1] (the starting noise's scale)")
        if self.noise_samples < 1 or self.aux_chunk_weight < 0:
            raise ConfigError(f"policy.noise_samples={self.noise_samples} must be >= 1 and policy.aux_chunk_weight="
                              f"{self.aux_chunk_weight} >= 0")


def _repeat_masks(batch: Mapping[str, torch.Tensor], k: int) -> Mapping[str, torch.Tensor]:
    """The per-action masks of a batch, for k draws per window stacked along the batch."""
    if k == 1:
        return batch
    return {key: batch[key].repeat(k, 1) for key in ("action_is_pad", "action_is_cut") if key in batch}


class FlowPolicy(nn.Module):
    name = "flow"
    config_class = FlowConfig

    def __init__(self, config: FlowConfig, shapes: ObsShapes, stats: Mapping[str, Any] | None = None):
        super().__init__()
        self.config, self.shapes = config, shapes
        self.body = ChunkBody(config, shapes, stats)
        if config.time_sampling == "beta":
            self._beta = torch.distributions.Beta(torch.tensor(config.beta_a), torch.tensor(config.beta_b))
        self.aux_head = None  # training only: the chunk regressed from the observation conditioning
        if config.aux_chunk_weight > 0:
            self.aux_head = nn.Sequential(nn.Linear(config.obs_dim, 512), nn.Mish(),
                                          nn.Linear(512, config.horizon * shapes.action_dim))

    def sample_time(self, n: int, device: torch.device) -> torch.Tensor:
        if self.config.time_sampling == "beta":
            return self._beta.sample((n,)).to(device)
        return torch.rand(n, device=device)

    def velocity(self, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.body.net(x, tau * self.config.time_scale, cond)

    def loss(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        actions = self.body.action_norm.normalize(batch[self.shapes.action_key].float())
        cond = self.body.encode(batch)
        k = self.config.noise_samples
        target, cond_k = (actions, cond) if k == 1 else (actions.repeat(k, 1, 1), cond.repeat(k, 1))
        x0 = torch.randn_like(target)
        tau = self.sample_time(target.shape[0], target.device)
        x_tau = (1 - tau[:, None, None]) * x0 + tau[:, None, None] * target
        err = self.velocity(x_tau, tau, cond_k) - (target - x0)
        per_sample = self.body.per_sample_loss(err, _repeat_masks(batch, k))
        if k > 1:
            per_sample = per_sample.view(k, -1).mean(0)
        if self.aux_head is not None:
            # cond_k's first copy is cond; taking cond itself here, inductor's compiled backward
            # (torch 2.13, bf16 autocast, 3 cameras) gave NaN gradients to the camera encoders
            guess = self.aux_head(cond_k[: actions.shape[0]]).view_as(actions)
            per_sample = per_sample + self.config.aux_chunk_weight * self.body.per_sample_loss(guess - actions, batch)
        return weighted_mean(per_sample, weights)

    def forward(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(batch, weights)  # DDP synchronises gradients of forward()

    @torch.no_grad()
    def sample(self, cond: torch.Tensor, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised action chunks (B H A) by K Euler steps from noise."""
        k = steps or self.config.inference_steps
        b = cond.shape[0]
        x = noise if noise is not None else torch.randn(b, self.config.horizon, self.shapes.action_dim, device=cond.device)
        if self.config.sample_temperature != 1.0:
            x = x * self.config.sample_temperature
        dt = 1.0 / k
        for velocity in self.body.step_fns([i * dt * self.config.time_scale for i in range(k)], cond):
            x = x + dt * velocity(x)
        return x

    def predict(self, obs_window: Mapping[str, Any], steps: int | None = None) -> np.ndarray:
        return self.body.predict(self.sample, obs_window, steps)
