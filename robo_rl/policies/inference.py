"""A trained policy at inference: numpy observation windows in, numpy chunks out, without
autograd (`predictor`); on a CPU the whole sampler traced into one frozen graph (`FrozenPredictor`);
camera frames larger than the policy was trained on brought to its size first."""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from robo_rl.data.codecs import resize_rgb


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
