"""Real-time chunking (RTC; Black, Galliker & Levine 2025) for our flow and diffusion policies.

The problem: a chunk takes d control ticks to compute. While it is computed the robot keeps
executing the previous chunk, so the first d actions of the new chunk are already decided; and the
new chunk, sampled from scratch, may pick another mode than the old one's remaining actions, so
the commands jump at the hand-over. Receding-horizon execution drops the d late actions and
blends over the jump; RTC makes the new chunk agree with the old one instead.

How: sampling becomes inpainting. The new chunk's action i is aligned with the old chunk's action
(the one due at the same tick) and steered toward it with weight w_i:
- w_i = 1 for i < d: those actions execute during inference anyway (frozen);
- w_i decays exponentially over the rest of the overlap, d <= i < H - s (s: the actions executed
  per chunk), so the new chunk eases from the old plan into its own;
- w_i = 0 past the overlap: the old chunk says nothing there.
At each denoising step the network's guess of the clean chunk is pulled toward the old actions by
a guidance term: the vector-Jacobian product of the weighted error through that guess (one
backward pass per step), its scale clipped at `max_guidance`. The same recipe runs for flow
(added to the velocity, as in the paper) and for DDIM, which is Euler's method in the flow's
coordinates (x / (sqrt(abar) + sqrt(1 - abar))), so the same guidance is added there.

Guidance alone is not enough for a policy trained to convergence: its flow carries nearly every
noise to the same chunk, so the clean guess hardly depends on the sample and the vector-Jacobian
product is small. Measured on a TransferCube state policy (horizon 32) 16 ticks into a chunk with
d = 12: the guided chunk's first 12 actions were 0.02-0.09 rad from the old ones, the unguided
chunk's 0.02-0.14. So the weights are applied once more to the result (soft inpainting): the
frozen actions become exactly the old ones, and the soft part is w_i * old + (1 - w_i) * new.

The delay d comes from measured inference latency (runtime/sources.py, PolicyChunks), not a setting.
This runs in eager mode with autograd: about 2-3x one plain chunk on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from robo_rl.errors import ConfigError


@dataclass
class RtcConfig:
    max_guidance: float = 5.0   # beta: upper bound on the guidance scale (the paper's default)

    def validate(self) -> None:
        if self.max_guidance <= 0:
            raise ConfigError(f"rtc: max_guidance={self.max_guidance} must be > 0")


def prefix_weights(horizon: int, delay: int, overlap: int) -> np.ndarray:
    """(horizon,) guidance weights: 1 for the first `delay` actions, an exponential decay to 0 over
    the rest of the `overlap` actions that the previous chunk still covers, 0 after."""
    delay, overlap = max(0, min(delay, overlap)), max(0, min(overlap, horizon))
    w = np.zeros(horizon, np.float32)
    w[:delay] = 1.0
    n = overlap - delay
    if n > 0:
        c = (overlap - np.arange(delay, overlap)) / (n + 1)  # 1 -> 0 across the soft part
        w[delay:overlap] = c * np.expm1(c) / math.expm1(1.0)
    return w


def _guidance_scale(tau: float, max_guidance: float) -> float:
    """min(beta, (1 - tau) / (tau * r^2)) with r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2): strong
    guidance where the guess of the clean chunk is unreliable, clipped."""
    if tau <= 0.0 or tau >= 1.0:
        return max_guidance
    r2 = (1 - tau) ** 2 / (tau ** 2 + (1 - tau) ** 2)
    return min(max_guidance, (1 - tau) / (tau * r2))


def _pull(guess_of: Any, x: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
          clip: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the network's output at x, J^T (w * (target - clean guess)), that weighted error) with one
    backward pass; `clip`: the guess clipped to [-1, 1] first, as the sampler clips it."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        out, clean = guess_of(x)
        # DDIM clips its guess (normalised actions lie in [-1, 1]): an epsilon network's guess at high
        # noise, far outside, is wrong by no more than the clipped guess is
        guess = clean.detach().clamp(-1, 1) if clip else clean.detach()
        err = (target - guess) * weights
        (grad,) = torch.autograd.grad(clean, x, grad_outputs=err)
    return out.detach(), grad, err


def _bounded(step: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    """A guidance step no larger, per action, than the weighted error it corrects: where the clean
    guess is very sensitive to x (an epsilon-predicting network at high noise amplifies x by
    1 / sqrt(abar), ~2000x at the first step), J^T err would throw the sample far past the target."""
    bound = err.abs()
    return torch.maximum(torch.minimum(step, bound), -bound)


def guided_flow_sample(policy: Any, cond: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                       cfg: RtcConfig, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """FlowPolicy's Euler sampler with the guidance added to each step's velocity. `target`
    (B H A) and the result are normalised chunks; `weights` (H,)."""
    k = steps or policy.config.inference_steps
    b = cond.shape[0]
    x = noise if noise is not None else torch.randn(b, policy.config.horizon, policy.shapes.action_dim, device=cond.device)
    w = weights.to(x)[None, :, None]
    dt = 1.0 / k
    for i in range(k):
        tau = i * dt
        t = torch.full((b,), tau, device=x.device)

        def guess_of(x_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v = policy.velocity(x_, t, cond)
            return v, x_ + (1 - tau) * v  # the clean chunk the velocity leads to

        v, grad, err = _pull(guess_of, x, target, w)
        x = x + dt * v + _bounded(dt * _guidance_scale(tau, cfg.max_guidance) * grad, err)
    return x


def guided_ddim_sample(policy: Any, cond: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                       cfg: RtcConfig, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """DiffusionPolicy's DDIM sampler with the flow guidance added to each step, in flow
    coordinates (see the module docstring)."""
    n = steps or policy.config.inference_steps
    b = cond.shape[0]
    x = noise if noise is not None else torch.randn(b, policy.config.horizon, policy.shapes.action_dim, device=cond.device)
    w = weights.to(x)[None, :, None]
    ts = policy.ddim_timesteps(n)
    for i, k in enumerate(ts):
        abar = policy.abar[k]
        abar_prev = policy.abar[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=cond.device)
        t = torch.full((b,), float(k), device=x.device)

        def guess_of(x_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = policy.body.net(x_, t, cond)
            return out, policy.split(x_, out, abar)[1]

        out, grad, err = _pull(guess_of, x, target, w, clip=policy.config.clip_sample)
        with torch.no_grad():
            eps, x0 = policy.split(x, out, abar)
            if policy.config.clip_sample:
                x0 = x0.clamp(-1, 1)
            # DDIM is Euler in flow coordinates y = x / (s + sigma), tau = s / (s + sigma) (s = sqrt(abar),
            # sigma = sqrt(1 - abar)), where the clean guess is the same x0: add the flow guidance there
            s, sigma = abar.sqrt(), (1 - abar).sqrt()
            s_next, sigma_next = abar_prev.sqrt(), (1 - abar_prev).sqrt()
            tau, tau_next = float(s / (s + sigma)), float(s_next / (s_next + sigma_next))
            pull = _bounded((tau_next - tau) * _guidance_scale(tau, cfg.max_guidance) * (s + sigma) * grad, err)  # in y
            x = s_next * x0 + sigma_next * eps + (s_next + sigma_next) * pull
    return x


class RtcPredictor:
    """`predict(window, previous=None, delay=0)`: raw chunks (B H A) like `policy.predict`, steered
    toward `previous` (B P A raw actions: the old chunk's actions from the tick the new chunk
    starts at) over `overlap = P` actions, the first `delay` frozen. Without `previous` it samples
    as the plain sampler does (the first chunk of an episode)."""

    def __init__(self, policy: Any, cfg: RtcConfig | None = None, steps: int | None = None):
        self.policy, self.cfg, self.steps = policy.eval(), cfg or RtcConfig(), steps
        self.cfg.validate()
        if policy.name not in ("flow", "diffusion"):
            raise ConfigError(f"rtc: works for flow and diffusion policies, not {policy.name}")
        self._sample = guided_flow_sample if policy.name == "flow" else guided_ddim_sample

    def warm_up(self, obs_window: Mapping[str, Any]) -> None:
        """One plain and one guided chunk, so neither path's first call (autograd's set-up) lands
        mid-run: the first guided chunk took 0.4 s against 0.03 after it (a 2-core Xeon with AVX512-BF16)."""
        chunk = self(obs_window)
        self(obs_window, chunk[:, : self.policy.config.n_action_steps], delay=1)

    def __call__(self, obs_window: Mapping[str, Any], previous: np.ndarray | None = None, delay: int = 0) -> np.ndarray:
        body, horizon = self.policy.body, self.policy.config.horizon
        with torch.no_grad():
            cond = body.encode(body.obs_from_window(obs_window))
        if previous is None or len(previous[0]) == 0:
            with torch.no_grad():
                chunk = self.policy.sample(cond, self.steps)
        else:
            prev = torch.as_tensor(np.asarray(previous, np.float32)[:, :horizon], device=body.device)
            overlap = prev.shape[1]
            target = torch.zeros(prev.shape[0], horizon, prev.shape[2], device=body.device)
            target[:, :overlap] = body.action_norm.normalize(prev)
            weights = torch.as_tensor(prefix_weights(horizon, int(delay), overlap))
            chunk = self._sample(self.policy, cond, target, weights, self.cfg, self.steps)
            # the same weights on the result: frozen actions are the old ones exactly, and the soft
            # part eases from the old plan into the new one (see the module docstring: guidance
            # alone leaves a trained policy's chunk most of the way where it was)
            w = weights.to(chunk)[None, :, None]
            chunk = w * target + (1 - w) * chunk
        with torch.no_grad():
            return body.action_norm.unnormalize(chunk).float().cpu().numpy()
