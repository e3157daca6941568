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
from robo_rl.policies.common import ChunkBody, ChunkConfig, ObsShapes, weighted_mean


@dataclass
class FlowConfig(ChunkConfig):
    inference_steps: int = 10       # K Euler steps
    time_sampling: str = "uniform"  # uniform | beta (Beta(a, b) on tau; a > b favours low noise, tau near 1)
    beta_a: float = 1.5
    beta_b: float = 1.0
    time_scale: float = 1000.0      # tau in [0, 1] is embedded as tau * time_scale (same range as DDPM steps)

    def validate(self) -> None:
        super().validate()
        if self.time_sampling not in ("uniform", "beta"):
            raise ConfigError(f"policy.time_sampling={self.time_sampling!r}; choose uniform or beta")
        if self.inference_steps < 1:
            raise ConfigError(f"policy.inference_steps must be >= 1, got {self.inference_steps}")


class FlowPolicy(nn.Module):
    name = "flow"
    config_class = FlowConfig

    def __init__(self, config: FlowConfig, shapes: ObsShapes, stats: Mapping[str, Any] | None = None):
        super().__init__()
        self.config, self.shapes = config, shapes
        self.body = ChunkBody(config, shapes, stats)
        if config.time_sampling == "beta":
            self._beta = torch.distributions.Beta(torch.tensor(config.beta_a), torch.tensor(config.beta_b))

    def sample_time(self, n: int, device: torch.device) -> torch.Tensor:
        if self.config.time_sampling == "beta":
            return self._beta.sample((n,)).to(device)
        return torch.rand(n, device=device)

    def velocity(self, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.body.net(x, tau * self.config.time_scale, cond)

    def loss(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        actions = self.body.action_norm.normalize(batch[self.shapes.action_key].float())
        cond = self.body.encode(batch)
        x0 = torch.randn_like(actions)
        tau = self.sample_time(actions.shape[0], actions.device)
        x_tau = (1 - tau[:, None, None]) * x0 + tau[:, None, None] * actions
        err = self.velocity(x_tau, tau, cond) - (actions - x0)
        return weighted_mean(self.body.per_sample_loss(err, batch), weights)

    def forward(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(batch, weights)  # DDP synchronises gradients of forward()

    @torch.no_grad()
    def sample(self, cond: torch.Tensor, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised action chunks (B H A) by K Euler steps from noise."""
        k = steps or self.config.inference_steps
        b = cond.shape[0]
        x = noise if noise is not None else torch.randn(b, self.config.horizon, self.shapes.action_dim, device=cond.device)
        dt = 1.0 / k
        for velocity in self.body.step_fns([i * dt * self.config.time_scale for i in range(k)], cond):
            x = x + dt * velocity(x)
        return x

    def predict(self, obs_window: Mapping[str, Any], steps: int | None = None) -> np.ndarray:
        return self.body.predict(self.sample, obs_window, steps)
