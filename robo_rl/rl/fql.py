"""FQL: flow Q-learning (Park, Li, Levine 2025) — the baseline floq is measured against.

Actor: a flow-matching BC policy (velocity field over actions, `flow_steps` Euler steps from
Gaussian noise) and a one-step policy mu(s, eps) distilled from it while maximising Q:
    L_actor = L_flowBC + alpha * ||mu(s, eps) - flowBC(s, eps)||^2 - mean_e Q_e(s, mu(s, eps))
Critic: an ensemble of E scalar Q networks (one batched network), TD target
    y = r + gamma * m * agg_e Qbar_e(s', mu(s', eps'))   (Polyak target, no gradient)
floq (floq.py) keeps this actor and swaps the critic.

Both losses are computed from the same parameters and stepped together, like the JAX
reference's single total loss: the actor's Q term sees the critic with `requires_grad` off, so
no actor gradient reaches critic parameters.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn

from robo_rl.errors import RoboRLError
from robo_rl.rl.nets import EnsembleMLP, adam, dtype_named, mixed_precision, polyak


@dataclass
class FQLConfig:
    hidden: tuple[int, ...] = (512, 512, 512, 512)
    lr: float = 3e-4
    batch_size: int = 256
    gamma: float = 0.99
    tau: float = 0.005  # Polyak rate of the target critic
    alpha: float = 300.0  # distillation weight: cube/scene 300, puzzle 1000, antmaze 10
    flow_steps: int = 10  # Euler steps of the BC flow
    ensemble: int = 2
    q_agg: str = "mean"  # how target members combine: mean | min
    actor_layer_norm: bool = False  # FQL's actor has no LayerNorm; its critic has
    normalize_q_loss: bool = False  # divide the Q term by mean |Q| (detached)
    # Precision of the no-grad passes (the BC-flow teacher; floq's read-outs): bfloat16 runs their
    # hidden layers 2-4x faster on AVX512-BF16 CPUs and GPUs; outputs stay float32.
    nograd_dtype: str = "float32"
    # Precision of the update step: bfloat16 runs it under autocast (mixed precision: bf16 matmuls,
    # float32 weights, optimiser state and scalar heads). Its no-grad passes then also run in bf16,
    # whatever nograd_dtype says.
    grad_dtype: str = "float32"

    def __post_init__(self):  # a typo fails here, not mid-run
        dtype_named(self.nograd_dtype), dtype_named(self.grad_dtype)
        if self.q_agg not in ("mean", "min"):
            raise RoboRLError(f"q_agg={self.q_agg!r}: choose mean or min")


def aggregate(values: torch.Tensor, how: str) -> torch.Tensor:
    """Combine ensemble members along dim 0."""
    return values.min(0).values if how == "min" else values.mean(0)


class FlowActor(nn.Module):
    """Flow BC velocity field v(s, a_t, t) and the one-step policy mu(s, eps)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden, layer_norm: bool, flow_steps: int,
                 nograd_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.act_dim, self.flow_steps, self.nograd_dtype = act_dim, flow_steps, nograd_dtype
        self.bc_flow = EnsembleMLP(obs_dim + act_dim + 1, hidden, act_dim, layer_norm=layer_norm)
        self.one_step = EnsembleMLP(obs_dim + act_dim, hidden, act_dim, layer_norm=layer_norm)

    def flow_actions(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Integrate the BC flow from `noise` with Euler steps; clipped to the action box."""
        a = noise
        low = self.bc_flow.low_precision(self.nograd_dtype) if self.nograd_dtype != torch.float32 else None
        for i in range(self.flow_steps):
            t = torch.full_like(a[:, :1], i / self.flow_steps)
            x = torch.cat([obs, a, t], -1)
            v = self.bc_flow.single(x) if low is None else self.bc_flow.forward_with(x, low)[0]
            a = a + v / self.flow_steps
        return a.clamp(-1, 1)

    def one_step_actions(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.one_step.single(torch.cat([obs, noise], -1))

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(obs.shape[0], self.act_dim, device=obs.device, generator=generator)
        return self.one_step_actions(obs, noise).clamp(-1, 1)

    def draw(self, batch_size: int, device, generator=None) -> dict[str, torch.Tensor]:
        """The actor loss's random draws, made explicit so a test can fix them."""
        return {"x0": torch.randn(batch_size, self.act_dim, device=device, generator=generator),
                "t": torch.rand(batch_size, 1, device=device, generator=generator),
                "eps": torch.randn(batch_size, self.act_dim, device=device, generator=generator)}

    def loss(self, obs, actions, q_fn, alpha: float, normalize_q: bool, draws: dict[str, torch.Tensor]):
        """FQL actor loss. `q_fn(obs, actions) -> [E, B]` must not carry gradient into the critic."""
        noise, t, eps = draws["x0"], draws["t"], draws["eps"]
        a_t = (1 - t) * noise + t * actions
        bc_flow = (self.bc_flow.single(torch.cat([obs, a_t, t], -1)) - (actions - noise)).pow(2).mean()

        with torch.no_grad():
            teacher = self.flow_actions(obs, eps)
        student = self.one_step_actions(obs, eps)
        distill = (student - teacher).pow(2).mean()

        q = q_fn(obs, student.clamp(-1, 1)).mean(0)
        q_loss = -q.mean()
        if normalize_q:
            q_loss = q_loss / q.abs().mean().detach().clamp_min(1e-6)
        loss = bc_flow + alpha * distill + q_loss
        return loss, {"actor/bc_flow": bc_flow.detach(), "actor/distill": distill.detach(), "actor/q": q.mean().detach()}


@contextlib.contextmanager
def frozen(module: nn.Module):
    """`module`'s parameters record no gradient inside (actions still get one through it)."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(module.parameters(), flags):
            p.requires_grad_(f)


def optimise(agent, batch) -> dict[str, torch.Tensor]:
    """One step of FQL and floq alike: draw, both losses from the same parameters, one optimiser
    step on their sum (the caller then moves its target network)."""
    device = batch["rewards"].device
    draws = agent.draw(batch["rewards"].shape[0], device)
    with mixed_precision(device, agent.config.grad_dtype):
        critic_loss, info = agent.critic_loss(batch, draws)
        actor_loss, actor_info = agent.actor_loss(batch, draws)
    agent.optimizer.zero_grad(set_to_none=True)
    (critic_loss + actor_loss).backward()
    agent.optimizer.step()
    agent.updates += 1
    return {**info, **actor_info}


class FQL(nn.Module):
    name = "fql"

    def __init__(self, obs_dim: int, act_dim: int, config: FQLConfig | None = None, seed: int = 0):
        super().__init__()
        self.config = cfg = config or FQLConfig()
        torch.manual_seed(seed)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.actor = FlowActor(obs_dim, act_dim, cfg.hidden, cfg.actor_layer_norm, cfg.flow_steps,
                               dtype_named(cfg.nograd_dtype))
        self.critic = EnsembleMLP(obs_dim + act_dim, cfg.hidden, 1, members=cfg.ensemble)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.optimizer = adam([*self.actor.parameters(), *self.critic.parameters()], cfg.lr)
        self.generator: torch.Generator | None = None
        self.updates = 0

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor, target: bool = False) -> torch.Tensor:
        net = self.target_critic if target else self.critic
        return net(torch.cat([obs, actions], -1)).squeeze(-1)  # [E, B]

    def draw(self, batch_size: int, device) -> dict[str, torch.Tensor]:
        """Every random draw of one update (explicit, so tests can fix them)."""
        eps_next = torch.randn(batch_size, self.act_dim, device=device, generator=self.generator)
        return {"eps_next": eps_next, **self.actor.draw(batch_size, device, self.generator)}

    @torch.no_grad()
    def td_target(self, batch, eps_next: torch.Tensor) -> torch.Tensor:
        next_actions = self.actor.one_step_actions(batch["next_observations"], eps_next).clamp(-1, 1)
        next_q = aggregate(self.q_values(batch["next_observations"], next_actions, target=True), self.config.q_agg)
        return batch["rewards"] + self.config.gamma * batch["masks"] * next_q

    def critic_loss(self, batch, draws):
        target = self.td_target(batch, draws["eps_next"])  # detached: computed under no_grad
        q = self.q_values(batch["observations"], batch["actions"])
        loss = (q - target).pow(2).mean()
        return loss, {"critic/loss": loss.detach(), "critic/q": q.mean().detach()}

    def actor_loss(self, batch, draws):
        with frozen(self.critic):
            return self.actor.loss(batch["observations"], batch["actions"], self.q_values, self.config.alpha,
                                   self.config.normalize_q_loss, draws)

    def update(self, batch) -> dict[str, torch.Tensor]:
        info = optimise(self, batch)
        polyak(self.target_critic, self.critic, self.config.tau)
        return info

    @torch.no_grad()
    def td_errors(self, batch) -> torch.Tensor:
        """Squared TD error per transition (for held-out TD-overfitting checks)."""
        eps_next = torch.randn_like(batch["actions"])
        return (self.q_values(batch["observations"], batch["actions"]).mean(0) - self.td_target(batch, eps_next)).pow(2)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.act(obs, self.generator)

    @torch.no_grad()
    def score(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q(s, a) used to rank candidate actions (mean over members)."""
        return self.q_values(obs, actions).mean(0)

    def config_dict(self) -> dict:
        return asdict(self.config)

