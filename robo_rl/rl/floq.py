"""floq: flow-matching Q-functions (Agrawalla et al. 2025, arXiv 2509.06863).

The critic is a velocity field v_e(t, z | s, a) over a scalar return z, ensemble E = 2. Q is read
out by integrating the flow for K Euler steps from z0 ~ U[l, h]:
    z_{i+1} = z_i + v(i/K, z_i | s, a) / K,    Q(s, a) = z_K
so the critic gets K times the depth of a monolithic network at the same width.

Per update, with R noise copies per transition (one batched network over E x B x R rows):
1. TD target, detached:  y = mean_j [ r + gamma * m * agg_e Qbar_e(s', a'_j) ],
   a'_j from the one-step actor, Qbar read out from the Polyak *target* field with its own z0_j.
2. Flow matching: z_t = (1 - t) z0_j + t y, loss = sum_j (v(t, z_t | s, a) - (y - z0_j))^2,
   averaged over members and batch.
3. Distillation: a scalar ensemble Q_phi(s, a) regresses onto the online field's read-out
   (mean over members and copies, detached). Critic loss = flow + distill.
4. Actor: FQL's (fql.py), with Q_phi as its critic.

Inputs of the field: s, a, HL-Gauss features of z (50 bins on [(r_min-0.01)/(1-gamma),
(r_max+0.01)/(1-gamma)], sigma = 16 bin widths) and cos(t).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn

from robo_rl.rl.fql import FlowActor, FQLConfig, aggregate, frozen, optimise
from robo_rl.rl.nets import EnsembleMLP, adam, dtype_named, hl_gauss_features, polyak


@dataclass
class FloqConfig(FQLConfig):
    critic_steps: int = 8  # K: Euler steps of the critic read-out
    noise_copies: int = 8  # R: z0 samples (and next actions) per transition
    noise_coverage: float = 0.1  # c: z0 ~ U[c r_min / (1-gamma), c r_max / (1-gamma)]
    bins: int = 50
    sigma_bins: float = 16.0
    r_min: float | None = None  # reward range; None = take it from the dataset
    r_max: float | None = None


class FlowCritic(nn.Module):
    """Velocity field v_e(t, z | s, a) for all E members in one batched MLP."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: FloqConfig, r_min: float, r_max: float):
        super().__init__()
        self.members, self.bins, self.sigma_bins = cfg.ensemble, cfg.bins, cfg.sigma_bins
        self.lo = (r_min - 0.01) / (1 - cfg.gamma)
        self.hi = (r_max + 0.01) / (1 - cfg.gamma)
        self.field = EnsembleMLP(obs_dim + act_dim + cfg.bins + 1, cfg.hidden, 1, members=cfg.ensemble)

    def velocity(self, sa: torch.Tensor, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """sa [N, o+a], z [E, N], t [N] -> [E, N]."""
        return self.field(self.inputs(sa, z, t)).squeeze(-1)

    def inputs(self, sa: torch.Tensor, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        E, N = z.shape
        feats = hl_gauss_features(z, self.lo, self.hi, self.bins, self.sigma_bins)
        return torch.cat([sa.expand(E, N, sa.shape[-1]), feats, torch.cos(t).view(1, N, 1).expand(E, N, 1)], -1)

    def read_out(self, sa: torch.Tensor, z0: torch.Tensor, steps: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Integrate from z0 [N] (shared by members) for `steps` Euler steps -> Q [E, N].

        With dtype=bfloat16 the hidden layers run in bf16 (weights cast once per read-out, inputs
        cast at the first layer); the output layer and z itself stay float32."""
        z = z0.unsqueeze(0).expand(self.members, -1)
        low = self.field.low_precision(dtype) if dtype != torch.float32 else None
        for i in range(steps):
            t = torch.full_like(z0, i / steps)
            if low is None:
                v = self.velocity(sa, z, t)
            else:
                v = self.field.forward_with(self.inputs(sa, z, t), low).squeeze(-1)
            z = z + v / steps
        return z


class Floq(nn.Module):
    name = "floq"

    def __init__(self, obs_dim: int, act_dim: int, config: FloqConfig | None = None, seed: int = 0,
                 reward_range: tuple[float, float] = (-1.0, 0.0)):
        super().__init__()
        self.config = cfg = config or FloqConfig()
        torch.manual_seed(seed)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        r_min = cfg.r_min if cfg.r_min is not None else reward_range[0]
        r_max = cfg.r_max if cfg.r_max is not None else reward_range[1]
        self.z0_lo = cfg.noise_coverage * r_min / (1 - cfg.gamma)
        self.z0_hi = cfg.noise_coverage * r_max / (1 - cfg.gamma)
        self.actor = FlowActor(obs_dim, act_dim, cfg.hidden, cfg.actor_layer_norm, cfg.flow_steps,
                               dtype_named(cfg.nograd_dtype))
        self.floq = FlowCritic(obs_dim, act_dim, cfg, r_min, r_max)
        self.target_floq = copy.deepcopy(self.floq).requires_grad_(False)
        self.distilled = EnsembleMLP(obs_dim + act_dim, cfg.hidden, 1, members=cfg.ensemble)
        params = [*self.actor.parameters(), *self.floq.parameters(), *self.distilled.parameters()]
        self.optimizer = adam(params, cfg.lr)
        self.generator: torch.Generator | None = None
        self.updates = 0

    def sample_z0(self, n: int, device) -> torch.Tensor:
        u = torch.rand(n, device=device, generator=self.generator)
        return self.z0_lo + (self.z0_hi - self.z0_lo) * u

    @property
    def readout_dtype(self) -> torch.dtype:
        return dtype_named(self.config.nograd_dtype)

    def q_distilled(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.distilled(torch.cat([obs, actions], -1)).squeeze(-1)  # [E, B]

    def draw(self, batch_size: int, device) -> dict[str, torch.Tensor]:
        """Every random draw of one update (explicit, so tests can fix them). n = B * R rows."""
        n, g = batch_size * self.config.noise_copies, self.generator
        return {"eps_next": torch.randn(n, self.act_dim, device=device, generator=g),  # a'_j noise
                "z0_next": self.sample_z0(n, device),  # target read-out starts
                "z0": self.sample_z0(n, device),  # flow-matching / online read-out starts
                "t_flow": torch.rand(n, device=device, generator=g),
                **self.actor.draw(batch_size, device, g)}

    @torch.no_grad()
    def td_target(self, batch, eps_next: torch.Tensor, z0_next: torch.Tensor) -> torch.Tensor:
        """y [B]: mean over R copies of r + gamma m agg_e Qbar_e(s', a'_j) (target field)."""
        cfg, (B, R) = self.config, (batch["rewards"].shape[0], self.config.noise_copies)
        next_obs = batch["next_observations"].repeat_interleave(R, 0)
        next_actions = self.actor.one_step_actions(next_obs, eps_next).clamp(-1, 1)
        q_next = self.target_floq.read_out(torch.cat([next_obs, next_actions], -1), z0_next, cfg.critic_steps,
                                           self.readout_dtype)
        q_next = aggregate(q_next, cfg.q_agg).view(B, R)
        return (batch["rewards"].unsqueeze(1) + cfg.gamma * batch["masks"].unsqueeze(1) * q_next).mean(1)

    def critic_loss(self, batch, draws):
        cfg = self.config
        B, R, E = batch["rewards"].shape[0], cfg.noise_copies, cfg.ensemble
        y = self.td_target(batch, draws["eps_next"], draws["z0_next"])  # [B], no gradient
        sa = torch.cat([batch["observations"], batch["actions"]], -1).repeat_interleave(R, 0)  # [B*R, o+a]
        z0, t = draws["z0"], draws["t_flow"]
        with torch.no_grad():  # distillation target: the online field's read-out
            q_online = self.floq.read_out(sa, z0, cfg.critic_steps, self.readout_dtype).view(E, B, R)
        y_rep = y.repeat_interleave(R)
        z_t = (1 - t) * z0 + t * y_rep
        v = self.floq.velocity(sa, z_t.unsqueeze(0).expand(E, -1), t)  # [E, B*R]
        flow = (v - (y_rep - z0)).pow(2).view(E, B, R).sum(-1).mean()

        distill_target = q_online.mean((0, 2))
        q = self.q_distilled(batch["observations"], batch["actions"])  # [E, B]
        distill = (q - distill_target).pow(2).mean()
        info = {"critic/flow": flow.detach(), "critic/distill": distill.detach(), "critic/q": q.mean().detach(),
                "critic/readout_std": q_online.mean(0).std(-1).mean(), "critic/td_error": (distill_target - y).pow(2).mean()}
        return flow + distill, info

    def actor_loss(self, batch, draws):
        with frozen(self.distilled):
            return self.actor.loss(batch["observations"], batch["actions"], self.q_distilled, self.config.alpha,
                                   self.config.normalize_q_loss, draws)

    def update(self, batch) -> dict[str, torch.Tensor]:
        info = optimise(self, batch)
        polyak(self.target_floq, self.floq, self.config.tau)  # the floq field only; Q_phi has no target
        return info

    @torch.no_grad()
    def td_errors(self, batch) -> torch.Tensor:
        draws = self.draw(batch["rewards"].shape[0], batch["rewards"].device)
        sa = torch.cat([batch["observations"], batch["actions"]], -1)
        q = self.floq.read_out(sa, self.sample_z0(sa.shape[0], sa.device), self.config.critic_steps).mean(0)
        return (q - self.td_target(batch, draws["eps_next"], draws["z0_next"])).pow(2)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs, self.generator)

    @torch.no_grad()
    def score(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.q_distilled(obs, actions).mean(0)

    def config_dict(self) -> dict:
        return asdict(self.config)
