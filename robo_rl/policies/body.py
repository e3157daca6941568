"""The network body diffusion and flow policies share: normalisers, observation encoder and
backbone, which both wrap with their own loss and sampler.

Normalisation statistics live in the module as buffers, so a policy's state dict is all that is
needed to run it: no separate stats file to lose or mismatch.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from robo_rl.data.stats import Normalizer
from robo_rl.errors import ConfigError
from robo_rl.policies.config import ChunkConfig, ObsShapes
from robo_rl.policies.nets.encoders import ObsEncoder
from robo_rl.policies.nets.mlp_chunk import MLPChunk
from robo_rl.policies.nets.transformer import DiT1D
from robo_rl.policies.nets.unet1d import ConditionalUnet1D


class TensorNormalizer(nn.Module):
    """A Normalizer whose offset and scale are buffers (saved in the state dict, moved with .to)."""

    def __init__(self, dim: int, stats: Mapping[str, Any] | None, mode: str, min_span: float = 0.0):
        super().__init__()
        if stats is None:
            offset, scale = np.zeros(dim, np.float32), np.ones(dim, np.float32)
        else:
            n = Normalizer.from_stats(stats, mode, min_span=min_span)
            offset, scale = n.offset.reshape(-1), n.scale.reshape(-1)
            if offset.shape[0] != dim:
                raise ConfigError(f"normalisation stats have {offset.shape[0]} dims, the key has {dim}")
        self.register_buffer("offset", torch.as_tensor(offset, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.offset) * self.scale

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.scale + self.offset


class ChunkBody(nn.Module):
    """Normalisers + observation encoder + backbone: maps (noisy chunk, time, observations) to
    the backbone's output. The policy files decide what that output means (noise or velocity)."""

    def __init__(self, cfg: ChunkConfig, shapes: ObsShapes, stats: Mapping[str, Any] | None):
        super().__init__()
        self.cfg, self.shapes = cfg, shapes
        get = (lambda k: stats[k]) if stats is not None else (lambda k: None)
        self.norms = nn.ModuleDict({k.replace("/", "__"): TensorNormalizer(d, get(k), cfg.norm_mode, cfg.obs_min_span)
                                    for k, d in shapes.lowdim.items()})
        self.action_norm = TensorNormalizer(shapes.action_dim, get(shapes.action_key), cfg.norm_mode, cfg.action_min_span)
        self.encoder = ObsEncoder(shapes.lowdim, shapes.images, cfg.n_obs, cfg.obs_dim, cfg.image_feature_dim,
                                  cfg.image_width, cfg.crop_ratio, cfg.image_encoder, cfg.conv_channels,
                                  tuple(cfg.color_jitter))
        weights = cfg.action_weights or (1.0,) * shapes.action_dim
        if len(weights) != shapes.action_dim or min(weights) < 0:
            raise ConfigError(f"policy.action_weights has {len(weights)} values {list(weights)}; give {shapes.action_dim} "
                              f"non-negative weights, one per action dimension of {shapes.action_key}")
        # not saved in checkpoints: the config is, and a checkpoint from before this option loads as it was
        self.register_buffer("action_weights", torch.tensor(weights, dtype=torch.float32), persistent=False)
        if cfg.backbone == "unet":
            self.net = ConditionalUnet1D(shapes.action_dim, cfg.obs_dim, cfg.down_dims, cfg.kernel)
        elif cfg.backbone == "mlp":
            self.net = MLPChunk(shapes.action_dim, cfg.obs_dim, cfg.horizon, cfg.mlp_width, cfg.mlp_depth, cfg.mlp_expansion)
        else:
            self.net = DiT1D(shapes.action_dim, cfg.obs_dim, cfg.horizon, cfg.dit_dim, cfg.dit_depth, cfg.dit_heads,
                              cfg.dit_mlp_ratio, patch=cfg.dit_patch)

    @property
    def device(self) -> torch.device:
        return self.action_norm.offset.device

    def encode(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        x = {k: self.norms[k.replace("/", "__")].normalize(obs[k].float()) for k in self.shapes.lowdim}
        if self.training and x and (self.cfg.lowdim_dropout > 0 or self.cfg.lowdim_noise > 0):
            x = self._perturb_lowdim(x)
        x.update({k: obs[k] for k in self.shapes.images})
        return self.encoder(x)

    def _perturb_lowdim(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Training only: noise on, or per-sample dropout of, the normalised low-dim keys, so the
        action loss cannot be met from the joints alone and keeps teaching the image encoder."""
        first = next(iter(x.values()))
        keep = None
        if self.cfg.lowdim_dropout > 0:
            shape = (first.shape[0],) + (1,) * (first.ndim - 1)
            keep = (torch.rand(shape, device=first.device) >= self.cfg.lowdim_dropout).to(first.dtype)
        out = {}
        for k, v in x.items():
            if self.cfg.lowdim_noise > 0:
                v = v + self.cfg.lowdim_noise * torch.randn_like(v)
            out[k] = v if keep is None else v * keep
        return out

    def obs_from_window(self, obs_window: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Raw observation arrays (B x To x ... numpy or tensors) -> tensors on the policy's device,
        checked against what the policy was trained on."""
        out = {}
        for k in [*self.shapes.lowdim, *self.shapes.images]:
            if k not in obs_window:
                raise ConfigError(f"policy needs observation {k!r}; got {sorted(obs_window)}")
            v = torch.as_tensor(np.asarray(obs_window[k]) if not torch.is_tensor(obs_window[k]) else obs_window[k], device=self.device)
            if v.ndim < 2 or v.shape[1] != self.cfg.n_obs:
                raise ConfigError(f"observation {k!r} has shape {tuple(v.shape)}; expected (batch, {self.cfg.n_obs}, ...)")
            out[k] = v
        return out

    def step_fns(self, times: list[float], cond: torch.Tensor) -> list[Any]:
        """The network as one function of the noisy chunk per sampler step. What depends only on
        (time, observation), the DiT's adaLN modulations or the MLP's FiLMs, is computed for all steps
        in one batched call: at batch 1 a CPU spends its time on op count and on streaming weights,
        not on arithmetic."""
        b, k = cond.shape[0], len(times)
        t = torch.tensor(times, dtype=torch.float32, device=cond.device).repeat_interleave(b)
        if hasattr(self.net, "modulations"):
            # One view per (block, step) from one unbind per block, instead of K slices each.
            per_block = [m.view(k, b, *m.shape[1:]).unbind(0) for m in self.net.modulations(t, cond.repeat(k, 1))]
            return [partial(self.net.run, modulations=[steps[i] for steps in per_block]) for i in range(k)]
        return [partial(self.net, t=t[i * b:(i + 1) * b], cond=cond) for i in range(k)]

    @torch.no_grad()
    def predict(self, sample: Any, obs_window: Mapping[str, Any], steps: int | None) -> np.ndarray:
        """Raw observation windows -> raw action chunks (B H A), with the policy's own sampler
        (`sample(cond, steps)` returns normalised chunks)."""
        chunk = sample(self.encode(self.obs_from_window(obs_window)), steps)
        return self.action_norm.unnormalize(chunk).float().cpu().numpy()

    def per_sample_loss(self, err: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared error per sample (B). Padded actions past the end of an episode that was cut
        short never count (its future is unknown); past a finished episode's end they count unless
        `mask_padded_actions`."""
        sq = (err.pow(2) * self.action_weights).mean(-1)  # B H
        skip = batch.get("action_is_cut")
        if self.cfg.mask_padded_actions and "action_is_pad" in batch:
            skip = batch["action_is_pad"]
        if skip is None:
            return sq.mean(-1)
        keep = (~skip.bool()).float()
        return (sq * keep).sum(-1) / keep.sum(-1).clamp_min(1.0)


def weighted_mean(per_sample: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    if weights is None:
        return per_sample.mean()
    w = weights.to(per_sample.dtype)
    return (per_sample * w).sum() / w.sum().clamp_min(1e-8)
