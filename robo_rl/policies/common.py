"""What diffusion and flow policies share: the Policy protocol, the chunk config, and the body
(normalisers, observation encoder, backbone) that both wrap with their own loss and sampler.

Normalisation statistics live in the module as buffers, so a policy's state dict is all that is
needed to run it: no separate stats file to lose or mismatch.
"""

from __future__ import annotations

import warnings
from functools import partial
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from robo_rl.data.codecs import resize_rgb
from robo_rl.data.stats import Normalizer
from robo_rl.errors import ConfigError
from robo_rl.policies.nets.encoders import CONV_CHANNELS, IMAGE_ENCODERS, ObsEncoder
from robo_rl.policies.nets.transformer import DiT1D
from robo_rl.policies.nets.mlp_chunk import MLPChunk
from robo_rl.policies.nets.unet1d import ConditionalUnet1D


@runtime_checkable
class Policy(Protocol):
    """An action-chunk policy. `predict` maps an observation window (each key B x To x ...,
    raw units) to a chunk of actions (B x H x A, raw units); `loss` is the training objective for
    a sampler batch, weighted per sample."""

    name: str
    config: Any
    shapes: "ObsShapes"

    def predict(self, obs_window: Mapping[str, Any]) -> np.ndarray: ...

    def loss(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass
class ObsShapes:
    """What the policy consumes and emits: low-dim keys and their sizes, cameras and their image
    sizes (H, W), and the action size."""

    lowdim: dict[str, int]
    images: dict[str, tuple[int, int]] = field(default_factory=dict)
    action_dim: int = 14
    action_key: str = "action"

    @classmethod
    def from_schema(cls, schema: Any, obs_keys: list[str], action_key: str = "action",
                    image_size: tuple[int, int] | None = None) -> "ObsShapes":
        """`image_size`: the size cameras are trained at when not the stored frames' (a store's
        training-size copies)."""
        lowdim, images = {}, {}
        for k in obs_keys:
            if k not in schema.keys:
                cameras = sorted(schema.image_keys)
                if k.startswith("obs/images/"):
                    raise ConfigError(f"observation key {k!r}: the dataset has no such camera; its cameras are "
                                      f"{cameras or 'none (state only)'}")
                raise ConfigError(f"observation key {k!r} is not in the dataset; keys are {sorted(schema.keys)}")
            spec = schema.keys[k]
            if len(spec.shape) == 3:
                images[k] = tuple(int(v) for v in image_size) if image_size else (int(spec.shape[0]), int(spec.shape[1]))
            elif len(spec.shape) == 1:
                lowdim[k] = int(spec.shape[0])
            else:
                raise ConfigError(f"observation key {k!r} has shape {spec.shape}; expected (D,) or (H, W, 3)")
        return cls(lowdim, images, int(schema.keys[action_key].shape[0]), action_key)

    def to_dict(self) -> dict[str, Any]:
        return {"lowdim": dict(self.lowdim), "images": {k: list(v) for k, v in self.images.items()},
                "action_dim": self.action_dim, "action_key": self.action_key}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ObsShapes":
        return cls(dict(d["lowdim"]), {k: tuple(v) for k, v in d.get("images", {}).items()}, int(d["action_dim"]),
                   d.get("action_key", "action"))


@dataclass
class ChunkConfig:
    """Sizes shared by both policies. Defaults are chosen to train on a laptop CPU (a 1.5M-parameter
    DiT); the paper's U-Net (backbone unet, down_dims 256/512/1024) and ResNet width 64 are one
    override away."""

    n_obs: int = 2              # To: observation frames per window
    horizon: int = 16           # H: actions predicted per chunk
    n_action_steps: int = 8     # Ta: actions executed before predicting again
    backbone: str = "transformer"  # transformer (DiT) | unet | mlp; the DiT measured better and 6x faster per chunk than the U-Net
    down_dims: tuple[int, ...] = (64, 128, 256)
    kernel: int = 5
    dit_dim: int = 128
    dit_depth: int = 4
    dit_heads: int = 4
    dit_mlp_ratio: float = 4.0  # DiT feed-forward width / dit_dim; the MLP is most of a block's FLOPs
    dit_patch: int = 1          # action steps per DiT token: 2 halves every block's arithmetic
    mlp_width: int = 512        # backbone mlp: residual blocks over the flattened chunk
    mlp_depth: int = 3
    mlp_expansion: int = 2
    obs_dim: int = 256          # conditioning vector size
    image_feature_dim: int = 64
    image_width: int = 32       # ResNet-18 first-stage channels (64 = the original)
    image_encoder: str = "resnet18"  # resnet18 | conv: a 4-layer CNN, about 18x cheaper to train on a CPU
    conv_channels: tuple[int, ...] = CONV_CHANNELS  # image_encoder=conv: channels per layer
    crop_ratio: float = 0.9     # random crop side / image side while training
    # training-only colour jitter per sample and camera: brightness, contrast and saturation factors
    # in [1 - x, 1 + x], the hue turned by up to x of the colour circle, and optionally a fifth value,
    # gamma: each pixel raised to a power in [1 / (1 + x), 1 + x] (zeros: none)
    color_jitter: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)  # brightness, contrast, saturation, hue[, gamma]
    # Training-only remedies for a camera policy that copies its own joints instead of looking
    # (the "copycat" problem): per sample, drop every low-dim key to zero with this probability, or
    # add Gaussian noise of this size (in normalised units, where a key's range is [-1, 1]).
    lowdim_dropout: float = 0.0
    lowdim_noise: float = 0.0
    norm_mode: str = "minmax"   # action and low-dim normalisation (to [-1, 1])
    obs_min_span: float = 0.05  # floor on an observation dim's range (m, rad) before scaling it to [-1, 1]
    # the same floor for action dims. An arm that stays still in every demo (PackCube without its
    # lid: the left arm) commands only the demos' 0.002 rad jitter; scaled to [-1, 1] that noise is
    # most of the loss (0.23 against 0.06) and the policy lifted the cube in 55% of episodes.
    # 0 keeps the normalisation every measured row was trained with (TransferCube's left waist
    # spans 0.033 rad); `robo-rl demo` sets 0.05.
    action_min_span: float = 0.0
    mask_padded_actions: bool = False  # False: learn to hold the last action past an episode's end
    # per action dimension, a weight on its share of the loss (empty: all 1). For an arm whose joints
    # also make the episode's large moves, a few cm of aim are a small part of their normalised range.
    action_weights: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None):
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown option(s) {unknown}; known: {sorted(names)}")
        for key in ("down_dims", "conv_channels"):
            if d.get(key) is not None:
                d[key] = tuple(int(x) for x in d[key])
        for key in ("action_weights", "color_jitter"):
            if d.get(key) is not None:
                d[key] = tuple(float(x) for x in d[key])
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.image_encoder not in IMAGE_ENCODERS:
            raise ConfigError(f"policy.image_encoder={self.image_encoder!r}; choose one of {', '.join(IMAGE_ENCODERS)}")
        if self.image_encoder == "conv" and (not self.conv_channels or min(self.conv_channels) < 1):
            raise ConfigError(f"policy.conv_channels={list(self.conv_channels)} must be one or more positive channel counts")
        if not 0.0 <= self.lowdim_dropout < 1.0 or self.lowdim_noise < 0.0:
            raise ConfigError(f"policy.lowdim_dropout={self.lowdim_dropout} must be in [0, 1) and "
                              f"policy.lowdim_noise={self.lowdim_noise} >= 0")
        jitter = list(self.color_jitter)
        if len(jitter) not in (4, 5) or min(jitter) < 0 or max(jitter[:3]) >= 1 or jitter[3] > 0.5:
            raise ConfigError(f"policy.color_jitter={jitter}: give 4 or 5 values [brightness, contrast, saturation, hue, "
                              f"gamma], the first three in [0, 1), the hue in [0, 0.5] (a share of the colour circle), "
                              f"the gamma >= 0")
        if self.backbone not in ("unet", "transformer", "mlp"):
            raise ConfigError(f"policy.backbone={self.backbone!r}; choose transformer, unet or mlp")
        if not 1 <= self.n_action_steps <= self.horizon:
            raise ConfigError(f"policy.n_action_steps={self.n_action_steps} must be in [1, horizon={self.horizon}]")
        if self.backbone == "transformer" and (self.dit_patch < 1 or self.horizon % self.dit_patch):
            raise ConfigError(f"policy.dit_patch={self.dit_patch} must be >= 1 and divide policy.horizon={self.horizon}")
        if self.backbone == "unet" and self.horizon % (2 ** (len(self.down_dims) - 1)):
            raise ConfigError(f"policy.horizon={self.horizon} must be divisible by 2^{len(self.down_dims) - 1} for the U-Net")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["down_dims"] = list(self.down_dims)
        d["conv_channels"] = list(self.conv_channels)
        d["color_jitter"] = list(self.color_jitter)
        return d


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


class _SampleGraph(nn.Module):
    """encode -> sample -> unnormalise as one module with positional tensor inputs, for tracing."""

    def __init__(self, policy: Any, steps: int | None):
        super().__init__()
        self.policy, self.steps = policy, steps
        self.keys = [*policy.shapes.lowdim, *policy.shapes.images]

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        body = self.policy.body
        cond = body.encode(dict(zip(self.keys, tensors[:-1])))
        return body.action_norm.unnormalize(self.policy.sample(cond, self.steps, tensors[-1]))


class FrozenPredictor:
    """`policy.predict` with the whole sampler (encoder, K network calls, unnormalisation) traced
    into one TorchScript graph and frozen: Python's per-op overhead is what dominates a batch-1
    chunk on a CPU, and the graph removes it. Weights are copied in when it is built, so build a
    new one after further training.

    A graph is traced for the first batch size that no built graph covers; a smaller batch is
    padded up to the smallest graph that covers it. TorchScript never frees a frozen graph's
    constants (about 185 MB for the demo's MLP with its 10 unrolled steps, measured with torch
    2.13), so one graph per batch size leaked 750 MB per 10-env evaluation as the last episodes
    ran out and `robo-rl rac` was killed at 24 GB."""

    def __init__(self, policy: Any, steps: int | None = None):
        self.policy, self.steps = policy.eval(), steps
        self.graph_module = _SampleGraph(policy, steps)
        self.graphs: dict[int, Any] = {}

    def _graph_size(self, b: int, inputs: list[torch.Tensor]) -> int:
        covering = [size for size in self.graphs if size >= b]
        if covering:
            return min(covering)
        # TorchScript is marked deprecated in favour of torch.compile, which needs a compiler
        # toolchain and seconds to minutes of start-up; the traced graph needs neither.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(self.graph_module, tuple(inputs), check_trace=False)
            self.graphs[b] = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
        return b

    def __call__(self, obs_window: Mapping[str, Any]) -> np.ndarray:
        body = self.policy.body
        obs = body.obs_from_window(frames_at_policy_size(obs_window, self.policy.shapes.images))
        inputs = [obs[k] for k in self.graph_module.keys]
        b = inputs[0].shape[0]
        # the noise is drawn for the real rows only, so the chunks do not depend on the padding
        noise = torch.randn(b, self.policy.config.horizon, self.policy.shapes.action_dim, device=body.device)
        inputs = [*inputs, noise]
        size = self._graph_size(b, inputs)
        if size > b:  # rows of zeros: each row is sampled on its own (no batch statistics in eval mode)
            inputs = [torch.cat([x, x.new_zeros(size - b, *x.shape[1:])]) for x in inputs]
        with torch.no_grad():
            return self.graphs[size](*inputs)[:b].float().cpu().numpy()


def predictor(policy: Any, inference_steps: int | None = None, frozen: bool = True):
    """numpy windows -> numpy chunks, without autograd. On a CPU the sampler is traced and frozen
    into one graph (FrozenPredictor): same chunks, several times less per-call overhead."""
    if frozen and policy.body.device.type == "cpu":
        return FrozenPredictor(policy, inference_steps)

    def predict(batch: Mapping[str, Any]):
        with torch.inference_mode():
            return policy.predict(frames_at_policy_size(batch, policy.shapes.images), steps=inference_steps)

    return predict


def frames_at_policy_size(window: Mapping[str, Any], sizes: Mapping[str, tuple[int, int]]) -> Mapping[str, Any]:
    """Camera frames (B, To, H, W, C) larger than the policy was trained on, downscaled to its
    size with the resize its training-size copies were made with (a robot whose cameras are
    recorded at full size and a policy trained on the store's small copies)."""
    resize = {k: tuple(v) for k, v in sizes.items()
              if k in window and isinstance(window[k], np.ndarray) and tuple(window[k].shape[-3:-1]) != tuple(v)}
    if not resize:
        return window
    out = dict(window)
    for k, size in resize.items():
        frames = window[k]
        flat = frames.reshape(-1, *frames.shape[-3:])
        out[k] = np.stack([resize_rgb(f, size) for f in flat]).reshape(*frames.shape[:-3], *size, frames.shape[-1])
    return out
