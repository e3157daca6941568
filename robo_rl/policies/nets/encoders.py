"""Observation encoders: a low-dim MLP, and per camera a ResNet-18-style image encoder with
GroupNorm or a small CNN for CPU training, both ending in a spatial softmax.

torchvision's ResNet is not usable with the CPU torch build here, so the network is written out.
BatchNorm is replaced by GroupNorm because EMA weights and tiny per-GPU batches make BatchNorm's
running statistics unreliable (Chi et al. 2023 do the same).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(dims: list[int], act: type[nn.Module] = nn.Mish, final_act: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2 or final_act:
            layers.append(act())
    return nn.Sequential(*layers)


def _group_norm(channels: int) -> nn.GroupNorm:
    # 16 channels per group, as in diffusion_policy's replacement of BatchNorm.
    return nn.GroupNorm(max(1, channels // 16), channels)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = _group_norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = _group_norm(c_out)
        self.skip = None
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), _group_norm(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class SpatialSoftmax(nn.Module):
    """Expected (x, y) image coordinates of each of `n_keypoints` learned feature maps."""

    def __init__(self, channels: int, n_keypoints: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, n_keypoints, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        logits = self.proj(x).flatten(2)  # B K HW
        attn = logits.softmax(-1)
        ys = torch.linspace(-1, 1, h, device=x.device, dtype=attn.dtype)
        xs = torch.linspace(-1, 1, w, device=x.device, dtype=attn.dtype)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack([gx.reshape(-1), gy.reshape(-1)], -1)  # HW 2
        return (attn @ grid).flatten(1)  # B 2K


class ResNet18GN(nn.Module):
    """ResNet-18 layout (stem, 4 stages x 2 basic blocks) with GroupNorm, ending in a spatial
    softmax (keypoints keep *where* things are, which global pooling throws away) and a linear
    projection to `out_dim`. `width` is the first stage's channels (64 in the original)."""

    def __init__(self, out_dim: int = 64, width: int = 64, n_keypoints: int = 32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), _group_norm(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, c = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            c_out = width * mult
            blocks += [BasicBlock(c, c_out, 1 if i == 0 else 2), BasicBlock(c_out, c_out, 1)]
            c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = SpatialSoftmax(c, n_keypoints)
        self.out = nn.Linear(2 * n_keypoints, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.pool(self.blocks(self.stem(x))))


CONV_CHANNELS = (16, 32, 64, 64)  # ConvKeypoints' default layers


class ConvKeypoints(nn.Module):
    """A small CNN for CPU training (robomimic-style): one 3x3 conv per entry of `channels`, the
    first three with stride 2, each with GroupNorm and ReLU, then the spatial softmax and a linear
    projection. On a 2-core Xeon with AVX512-BF16, 86 px crops, forward + backward + AdamW on 128
    images took 69 ms (47 in bf16) against 1.2 s for ResNet18GN width 64, and 2 frames at batch 1
    0.9 ms against 19; a whole flow step with 2 cameras runs 3.9x faster (bench/policy.py b3)."""

    def __init__(self, out_dim: int = 64, channels: tuple[int, ...] = CONV_CHANNELS, n_keypoints: int = 32):
        super().__init__()
        layers, c = [], 3
        for i, c_out in enumerate(channels):
            layers += [nn.Conv2d(c, c_out, 3, 2 if i < 3 else 1, 1), _group_norm(c_out), nn.ReLU()]
            c = c_out
        self.net = nn.Sequential(*layers)
        self.pool = SpatialSoftmax(c, n_keypoints)
        self.out = nn.Linear(2 * n_keypoints, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.pool(self.net(x)))


IMAGE_ENCODERS = ("resnet18", "conv")


def random_crop(frames: torch.Tensor, crop: tuple[int, int], generator: torch.Generator | None = None) -> torch.Tensor:
    """One random crop per frame, on the stored frames themselves (N H W C, uint8): an (N, C, h, w)
    tensor laid out channels-last. Every crop is a window view of its frame (unfold), so picking
    N windows is one copy of the cropped bytes: cropping float images with a gather per axis cost a
    camera step 4x more (bench/policy.py, cameras)."""
    return planar_crops(frames, crop, generator).contiguous(memory_format=torch.channels_last)


def planar_crops(frames: torch.Tensor, crop: tuple[int, int], generator: torch.Generator | None = None) -> torch.Tensor:
    """random_crop's windows (the same draws) as a planar N C h w uint8 tensor."""
    n, h, w, _ = frames.shape
    ch, cw = crop
    top = torch.randint(0, h - ch + 1, (n,), device=frames.device, generator=generator)
    left = torch.randint(0, w - cw + 1, (n,), device=frames.device, generator=generator)
    windows = frames.unfold(1, ch, 1).unfold(2, cw, 1)  # N, h-ch+1, w-cw+1, C, ch, cw: views, no copy
    return windows[torch.arange(n, device=frames.device), top, left]  # N C ch cw, one copy


def center_crop(frames: torch.Tensor, crop: tuple[int, int]) -> torch.Tensor:
    """The middle window of each frame (N H W C) as an (N, C, h, w) channels-last tensor."""
    h, w = frames.shape[-3:-1]
    top, left = (h - crop[0]) // 2, (w - crop[1]) // 2
    return frames[:, top:top + crop[0], left:left + crop[1]].contiguous().permute(0, 3, 1, 2)


LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601: the grey a colour is seen as


def color_jitter(images: torch.Tensor, brightness: float, contrast: float, saturation: float, hue: float,
                 gamma: float = 0.0, per: int = 1) -> torch.Tensor:
    """Photometric augmentation of N C H W images in [0, 1], one draw per group of `per`
    consecutive images (a sample's frames share the room's light). Brightness, contrast and
    saturation factors are drawn uniformly in [1 - x, 1 + x]; the hue turns by up to `hue` of the
    colour circle about the grey axis; contrast blends each image with its mean grey. All four are
    affine in the pixel, so each image gets one 3x3 matrix and one offset, applied in one pass
    (on channels-last images a batched matrix product over the pixels cost 4x more; on planar crops
    it is the faster, see jittered_crops), then clipped to [0, 1] as a camera's pixels are.
    `gamma` (0: none) then raises each pixel to a power drawn log-uniformly in [1 / (1 + gamma),
    1 + gamma]: a tone curve, which moves the dark pixels more than the light ones."""
    matrix, keep = jitter_matrices(images.shape[0], per, images.device, brightness, contrast, saturation, hue)
    # contrast: keep * (M p) + (1 - keep) * mean grey of M p, and that mean is luma . M . (mean p)
    luma = torch.tensor(LUMA, device=images.device)
    mean_grey = (matrix @ images.mean((2, 3))[:, :, None]).squeeze(-1) @ luma  # N
    offset = ((1 - keep.view(-1)) * mean_grey)[:, None, None, None]
    out = torch.einsum("nij,njhw->nihw", keep * matrix, images).add_(offset).clamp_(0, 1)
    if gamma:
        n = images.shape[0] // per
        power = torch.exp((torch.rand(n, device=images.device) * 2 - 1) * math.log1p(gamma)).repeat_interleave(per, 0)
        out = out.pow_(power[:, None, None, None])
    return out.contiguous(memory_format=torch.channels_last)


def jitter_matrices(count: int, per: int, dev: torch.device, brightness: float, contrast: float, saturation: float,
                    hue: float) -> tuple[torch.Tensor, torch.Tensor]:
    """color_jitter's draws for `count` images, one per group of `per`: each image's colour matrix
    (saturation, hue turn, brightness; N 3 3) and its contrast factor (N 1 1)."""
    n = count // per
    eye = torch.eye(3, device=dev)

    def factor(strength: float) -> torch.Tensor:
        return 1 + (torch.rand(n, 1, 1, device=dev) * 2 - 1) * strength

    luma = torch.tensor(LUMA, device=dev)
    grey = torch.ones(3, 1, device=dev) * luma  # every channel set to the pixel's grey
    sat = factor(saturation)
    matrix = sat * eye + (1 - sat) * grey
    if hue:
        angle = (torch.rand(n, 1, 1, device=dev) * 2 - 1) * (hue * 2 * math.pi)
        axis = torch.full((3,), 3 ** -0.5, device=dev)
        cross = torch.tensor([[0.0, -1, 1], [1, 0, -1], [-1, 1, 0]], device=dev) * 3 ** -0.5  # axis x (.)
        turn = torch.cos(angle) * eye + torch.sin(angle) * cross + (1 - torch.cos(angle)) * torch.outer(axis, axis)
        matrix = turn @ matrix
    matrix = (factor(brightness) * matrix).repeat_interleave(per, 0)
    keep = factor(contrast).repeat_interleave(per, 0) if contrast else torch.ones_like(matrix[:, :1, :1])
    return matrix, keep


def jittered_crops(frames: torch.Tensor, crop: tuple[int, int], brightness: float, contrast: float,
                   saturation: float, hue: float, per: int = 1) -> torch.Tensor:
    """random_crop, then color_jitter without gamma, as the encoder's input in [-1, 1]: the same
    draws and values, with the scale to [0, 1] and back folded into each crop's matrix and offset,
    so the pixels pass through one batched 3x3 product on planar crops (1.3x faster on one CPU
    thread than crop, scale, jitter and rescale one after the other)."""
    pixels = planar_crops(frames, crop)
    n, c, h, w = pixels.shape
    matrix, keep = jitter_matrices(n, per, frames.device, brightness, contrast, saturation, hue)
    x = pixels.reshape(n, c, h * w).float()  # 0..255
    luma = torch.tensor(LUMA, device=frames.device)
    mean_grey = (matrix @ x.mean(2)[:, :, None]).squeeze(-1) @ luma  # N, in 0..255
    # 2 * (keep M x / 255 + (1 - keep) mean grey / 255) - 1, clipped where [0, 1] was
    offset = (2 / 255) * (1 - keep.view(-1)) * mean_grey - 1
    out = torch.baddbmm(offset[:, None, None], keep * matrix * (2 / 255), x).clamp_(-1, 1)
    return out.view(n, c, h, w).contiguous(memory_format=torch.channels_last)


class CameraEncoder(nn.Module):
    """uint8 HWC frames -> features. Random crop while training, centre crop when evaluating,
    so train and test see the same scale; while training, also the colour jitter `jitter`
    (brightness, contrast, saturation, hue and optionally gamma; zeros: none). Frames are cropped as uint8 and reach the
    convolutions channels-last (the layout oneDNN's CPU kernels run fastest in), as they are stored."""

    def __init__(self, image_size: tuple[int, int], out_dim: int, width: int, crop_ratio: float, kind: str = "resnet18",
                 conv_channels: tuple[int, ...] = CONV_CHANNELS, jitter: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)):
        super().__init__()
        self.crop = (max(8, int(math.floor(image_size[0] * crop_ratio))), max(8, int(math.floor(image_size[1] * crop_ratio))))
        self.net = ConvKeypoints(out_dim, tuple(conv_channels)) if kind == "conv" else ResNet18GN(out_dim, width)
        self.jitter = tuple(float(v) for v in jitter)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[:-3]
        frames = frames.reshape(-1, *frames.shape[-3:])
        if not self.training:
            x = center_crop(frames, self.crop).float().div_(127.5).sub_(1.0)  # keeps the channels-last layout
        elif any(self.jitter):
            per = int(math.prod(lead[1:])) if len(lead) > 1 else 1  # a sample's frames share one draw
            with torch.autocast(frames.device.type, enabled=False):  # pixels stay fp32 into the first conv, as without jitter
                if len(self.jitter) < 5 or not self.jitter[4]:
                    x = jittered_crops(frames, self.crop, *self.jitter[:4], per=per)
                else:  # a gamma curve needs the pixels in [0, 1]
                    x = color_jitter(random_crop(frames, self.crop).float().div_(255.0), *self.jitter,
                                     per=per).mul(2.0).sub_(1.0)
        else:
            x = random_crop(frames, self.crop).float().div_(127.5).sub_(1.0)
        return self.net(x).reshape(*lead, -1)


class ObsEncoder(nn.Module):
    """A window of observations (each key B x To x ...) -> one conditioning vector per sample.

    Low-dim keys are normalised (by the policy) and concatenated per frame; each camera has its
    own encoder; all frames' features are flattened and passed through an MLP."""

    def __init__(self, lowdim_dims: dict[str, int], image_sizes: dict[str, tuple[int, int]], n_obs: int,
                 out_dim: int = 256, image_feature_dim: int = 64, image_width: int = 64, crop_ratio: float = 0.9,
                 image_encoder: str = "resnet18", conv_channels: tuple[int, ...] = CONV_CHANNELS,
                 jitter: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)):
        super().__init__()
        self.lowdim_keys = sorted(lowdim_dims)
        self.camera_keys = sorted(image_sizes)
        self.cameras = nn.ModuleDict({k.replace("/", "__"): CameraEncoder(tuple(image_sizes[k]), image_feature_dim, image_width,
                                                                          crop_ratio, image_encoder, conv_channels, jitter)
                                      for k in self.camera_keys})
        per_frame = sum(lowdim_dims.values()) + image_feature_dim * len(self.camera_keys)
        self.mlp = mlp([per_frame * n_obs, out_dim, out_dim], final_act=True)
        self.out_dim = out_dim

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [obs[k] for k in self.lowdim_keys]
        parts += [self.cameras[k.replace("/", "__")](obs[k]) for k in self.camera_keys]
        x = torch.cat(parts, -1)  # B To F
        return self.mlp(x.flatten(1))
