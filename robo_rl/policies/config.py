"""What every action-chunk policy is and is sized by: the Policy protocol, the observation and
action shapes it consumes and emits (`ObsShapes`), and the chunk config both methods share
(`ChunkConfig`; flow.py and diffusion.py extend it with their own settings)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

from robo_rl.errors import ConfigError
from robo_rl.policies.nets.encoders import CONV_CHANNELS, IMAGE_ENCODERS


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
