"""SHARSA and double SHARSA: horizon reduction for offline goal-conditioned RL (Park et al. 2025,
arXiv 2506.04168). Rewards are 0/1, so every value lives in [0, 1].

Two levels share one goal space (`rep`: OGBench's `oracle_reps` when the dataset has them, e.g.
cube positions, else full observations):
- high level: a subgoal w = rep(s_{t+k}) about n steps ahead. Its critics Q_i(s, g, w) are trained
  by n-step SARSA (no max over w): BCE on sigmoid outputs toward the soft target
      y = r + gamma^k * m * V(s_{t+k}, g)          r = gamma^k * success, m = 1 - success
  and the value V(s, g) by BCE toward min_i Qbar_i(s, g, w) from the Polyak target critics. Only
  the critic has a target. The subgoal policy is pure flow BC over w given (s, g).
- low level: flow BC over actions given (s, rep(s_{t+n})).
- acting: N subgoals from the high flow (Euler steps from Gaussian noise), keep the argmax of
  min_i Q_i, then one action from the low flow. Double SHARSA also draws N actions and keeps the
  best under a one-step low-level critic (discount 1 - 1/n) trained the same SARSA way.

Network inputs are concatenated in this order: critic [s, g, w], value [s, g], high flow
[s, g, x_t, t], low flow [s, rep(s_{t+n}), x_t, t], low critic [s, g, a], low value [s, g].

All losses are summed and stepped by one Adam, as the JAX reference does. No loss needs `frozen`:
every bootstrap target (V in the critic target, min Qbar in the value target, and their low-level
twins) is computed under `no_grad`, and the flow losses never call a critic.

Batches are drawn on the replay's device with its generator (`sample_batch`); no host round trip.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn

from robo_rl.errors import RoboRLError
from robo_rl.rl.nets import EnsembleMLP, adam, bce, dtype_named, mixed_precision, polyak
from robo_rl.rl.replay import DeviceReplay, trajectory_bounds


@dataclass
class SharsaConfig:
    lr: float = 3e-4
    batch_size: int = 1024
    hidden: tuple[int, ...] = (1024, 1024, 1024, 1024)  # every network: GELU + LayerNorm
    gamma: float = 0.999
    horizon: int = 25  # n: subgoal steps (the paper uses 25-50)
    num_samples: int = 32  # N: candidates per decision (subgoals; and actions in double SHARSA)
    flow_steps: int = 10  # Euler steps of both flows
    ensemble: int = 2  # critics per level, aggregated by min
    tau: float = 0.005  # Polyak rate of the target critic(s)
    # Goals for the critics and the value: current state / future state of the same trajectory /
    # random dataset state. Future goals are uniform over the rest of the trajectory (as the
    # reference's value_geom_sample=False).
    p_cur: float = 0.2
    p_traj: float = 0.5
    p_random: float = 0.3
    value_geom: bool = False
    # Goals for the high-level flow BC (the reference samples these separately: no current-state
    # goals, and future goals at geometric offsets with p = 1 - gamma).
    actor_p_cur: float = 0.0
    actor_p_traj: float = 0.5
    actor_p_random: float = 0.5
    actor_geom: bool = True
    double: bool = False  # double SHARSA: add the one-step low critic and best-of-N actions
    rep: str = "auto"  # subgoal/goal space: auto (oracle_reps if present) | oracle | obs
    # bfloat16: the update step under autocast (mixed precision: bf16 matmuls, float32 weights,
    # optimiser state and network heads); several times faster on AVX512-BF16 CPUs and GPUs.
    grad_dtype: str = "float32"

    @property
    def low_gamma(self) -> float:
        """Discount of the double-SHARSA low critic: 1 - 1/n."""
        return 1.0 - 1.0 / self.horizon

    def check(self) -> "SharsaConfig":
        for name in ("", "actor_"):
            probs = [getattr(self, f"{name}p_{w}") for w in ("cur", "traj", "random")]
            if min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
                raise RoboRLError(f"sharsa: {name}p_cur/p_traj/p_random = {probs} must be >= 0 and sum to 1")
        if self.horizon < 1:
            raise RoboRLError(f"sharsa: horizon={self.horizon} must be >= 1 (the subgoal is n steps ahead)")
        if self.rep not in ("auto", "oracle", "obs"):
            raise RoboRLError(f"sharsa: rep={self.rep!r}: choose auto, oracle or obs")
        dtype_named(self.grad_dtype)
        return self


# ---------------------------------------------------------------------------------------- data
class GoalReplay(DeviceReplay):
    """A DeviceReplay over compact rows plus each row's trajectory bounds ('starts', 'ends').

    A state t is drawn only from rows with t < end (a next observation exists; OGBench's `valids`),
    and random goals from the same rows, as the reference does.
    """

    def __init__(self, arrays, device="cpu", seed: int = 0):
        missing = [k for k in ("observations", "actions", "terminals") if k not in arrays]
        if missing:
            raise RoboRLError(f"goal replay: no {', '.join(missing)} array (has: {', '.join(sorted(arrays))})")
        starts, ends = trajectory_bounds(arrays["terminals"])
        super().__init__({**arrays, "starts": starts, "ends": ends}, device, seed)
        rows = torch.arange(self.size, device=self.device)
        self.valid_rows = rows[rows < self.data["ends"]]
        if len(self.valid_rows) == 0:
            raise RoboRLError("goal replay: every trajectory has one step; SHARSA needs at least two per trajectory")

    def indices(self, batch_size: int) -> torch.Tensor:
        pick = torch.randint(0, len(self.valid_rows), (batch_size,), device=self.device, generator=self.generator)
        return self.valid_rows[pick]



def goal_replay(arrays, device="cpu", seed: int = 0) -> GoalReplay:
    """Compact arrays ('observations', 'actions', 'terminals' on each trajectory's last row, optional
    'oracle_reps') -> a device replay with 'starts'/'ends' per row, ready for `sample_batch`.

    Raw OGBench files mark only the last row. OGBench's `compact_dataset=True` marks the last two;
    here that splits off the last row as a one-row trajectory that is never sampled. That matches the
    reference, whose final state is also the second-to-last row, except that the reference may also
    draw that row as a state t (k = 0, so it counts as a success for any goal). We never do.
    """
    return GoalReplay(arrays, device, seed)


def rep_key(replay: DeviceReplay, cfg: SharsaConfig) -> str:
    """Which array holds goals and subgoals."""
    has_oracle = "oracle_reps" in replay.data
    if cfg.rep == "oracle" and not has_oracle:
        raise RoboRLError("sharsa: rep=oracle but the dataset has no 'oracle_reps' array; use rep=obs or auto")
    return "oracle_reps" if has_oracle and cfg.rep != "obs" else "observations"


def sample_goal_indices(replay: GoalReplay, idx: torch.Tensor, p_cur: float, p_traj: float,
                        geom_p: float | None = None) -> torch.Tensor:
    """Goal rows for states `idx`: the state itself with p_cur, a later row of its trajectory with
    p_traj, else a random valid row.

    Later rows: `geom_p=None` draws uniformly over (t, end] the way the reference does (a continuous
    uniform rounded to a row, so the two end rows get half weight); otherwise the offset is
    Geometric(geom_p) >= 1, clipped to the trajectory's end.
    """
    g, dev, B = replay.generator, idx.device, idx.shape[0]
    ends = replay.data["ends"][idx]
    if geom_p is None:
        first = torch.minimum(idx + 1, ends)
        frac = 1.0 - torch.rand(B, device=dev, generator=g)  # (0, 1]
        future = first + torch.round((ends - first) * frac).long()
    else:
        offsets = torch.empty(B, device=dev).geometric_(geom_p, generator=g).long()
        future = torch.minimum(idx + offsets, ends)
    random = replay.indices(B)
    u = torch.rand(B, device=dev, generator=g)
    return torch.where(u < p_cur, idx, torch.where(u < p_cur + p_traj, future, random))


def subgoal_steps(idx: torch.Tensor, goal_idx: torch.Tensor, ends: torch.Tensor, n: int) -> torch.Tensor:
    """k = min(n, end - t), cut to the goal's offset when the goal lies within those k steps ahead."""
    k = torch.clamp(ends - idx, max=n)
    ahead = goal_idx - idx
    return torch.where((ahead >= 0) & (ahead < k), ahead, k)


def build_batch(replay: GoalReplay, cfg: SharsaConfig, idx: torch.Tensor, value_goal_idx: torch.Tensor,
                actor_goal_idx: torch.Tensor, low_goal_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Everything one update reads, gathered from explicit row indices (tests pass their own).

    success = [k < n], exactly the reference's definition. It is true when the goal was cut
    within the horizon (including the goal being the state itself, k = 0) and ALSO when the
    trajectory ends fewer than n steps after t, whatever the goal: the reference treats the
    end of the data as reaching the goal.
    """
    d, n = replay.data, cfg.horizon
    obs, rep = d["observations"], d[rep_key(replay, cfg)]
    ends = d["ends"][idx]
    k = subgoal_steps(idx, value_goal_idx, ends, n)
    success = (k < n).float()
    steps = k.float()
    k_actor = subgoal_steps(idx, actor_goal_idx, ends, n)
    batch = {
        "observations": obs[idx],
        "actions": d["actions"][idx],
        # high-level critic and value
        "value_goals": rep[value_goal_idx],
        "subgoal_steps": steps,
        "high_actions": rep[idx + k],  # w = rep(s_{t+k})
        "high_next_observations": obs[idx + k],
        "rewards": cfg.gamma ** steps * success,
        "masks": 1.0 - success,
        # high-level flow BC
        "actor_goals": rep[actor_goal_idx],
        "actor_subgoals": rep[idx + k_actor],
        # low-level flow BC: condition on rep(s_{t+n'}), n' = min(n, end - t)
        "low_goals": rep[torch.minimum(idx + n, ends)],
    }
    if low_goal_idx is not None:  # double SHARSA's one-step low critic
        hit = (low_goal_idx == idx).float()
        batch.update(next_observations=obs[torch.minimum(idx + 1, ends)], low_value_goals=rep[low_goal_idx],
                     low_rewards=hit, low_masks=1.0 - hit)
    return batch


def sample_batch(replay: GoalReplay, batch_size: int, cfg: SharsaConfig,
                 idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A training batch drawn on the replay's device with its generator."""
    idx = replay.indices(batch_size) if idx is None else idx
    value_goal = sample_goal_indices(replay, idx, cfg.p_cur, cfg.p_traj, 1.0 - cfg.gamma if cfg.value_geom else None)
    actor_goal = sample_goal_indices(replay, idx, cfg.actor_p_cur, cfg.actor_p_traj,
                                     1.0 - cfg.gamma if cfg.actor_geom else None)
    low_goal = sample_goal_indices(replay, idx, cfg.p_cur, cfg.p_traj, 1.0 - cfg.low_gamma) if cfg.double else None
    return build_batch(replay, cfg, idx, value_goal, actor_goal, low_goal)


# ---------------------------------------------------------------------------------------- agent
class Sharsa(nn.Module):
    name = "sharsa"

    def __init__(self, obs_dim: int, act_dim: int, goal_dim: int, config: SharsaConfig | None = None, seed: int = 0):
        super().__init__()
        self.config = cfg = (config or SharsaConfig()).check()
        torch.manual_seed(seed)
        self.obs_dim, self.act_dim, self.goal_dim = obs_dim, act_dim, goal_dim
        H = cfg.hidden
        self.critic = EnsembleMLP(obs_dim + 2 * goal_dim, H, 1, members=cfg.ensemble)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = EnsembleMLP(obs_dim + goal_dim, H, 1)
        self.high_flow = EnsembleMLP(obs_dim + 2 * goal_dim + 1, H, goal_dim)
        self.low_flow = EnsembleMLP(obs_dim + goal_dim + act_dim + 1, H, act_dim)
        if cfg.double:
            self.low_critic = EnsembleMLP(obs_dim + goal_dim + act_dim, H, 1, members=cfg.ensemble)
            self.target_low_critic = copy.deepcopy(self.low_critic).requires_grad_(False)
            self.low_value = EnsembleMLP(obs_dim + goal_dim, H, 1)
        self.optimizer = adam([p for p in self.parameters() if p.requires_grad], cfg.lr)
        self.generator: torch.Generator | None = None
        self.updates = 0

    # ------------------------------------------------------------------ heads (logits)
    def q_logits(self, obs, goals, subgoals, target: bool = False) -> torch.Tensor:
        net = self.target_critic if target else self.critic
        return net(torch.cat([obs, goals, subgoals], -1)).squeeze(-1)  # [E, B]

    def v_logits(self, obs, goals) -> torch.Tensor:
        return self.value.single(torch.cat([obs, goals], -1)).squeeze(-1)  # [B]

    def low_q_logits(self, obs, goals, actions, target: bool = False) -> torch.Tensor:
        net = self.target_low_critic if target else self.low_critic
        return net(torch.cat([obs, goals, actions], -1)).squeeze(-1)

    # ------------------------------------------------------------------ high level
    @torch.no_grad()
    def critic_target(self, batch) -> torch.Tensor:
        """r + gamma^k * m * V(s_{t+k}, g), no gradient."""
        next_v = torch.sigmoid(self.v_logits(batch["high_next_observations"], batch["value_goals"]))
        return batch["rewards"] + self.config.gamma ** batch["subgoal_steps"] * batch["masks"] * next_v

    def critic_loss(self, batch):
        target = self.critic_target(batch)
        logits = self.q_logits(batch["observations"], batch["value_goals"], batch["high_actions"])
        loss = bce(logits, target).mean(-1).sum()  # each member's mean BCE, summed (as the reference)
        return loss, {"critic/loss": loss.detach(), "critic/q": torch.sigmoid(logits).mean().detach(),
                      "critic/target": target.mean()}

    def value_loss(self, batch):
        with torch.no_grad():
            target = torch.sigmoid(self.q_logits(batch["observations"], batch["value_goals"], batch["high_actions"],
                                                 target=True)).min(0).values
        logits = self.v_logits(batch["observations"], batch["value_goals"])
        loss = bce(logits, target).mean()
        return loss, {"value/loss": loss.detach(), "value/v": torch.sigmoid(logits).mean().detach()}

    def flow_loss(self, net: EnsembleMLP, context, x1, noise=None, times=None) -> torch.Tensor:
        """Flow-matching BC: regress v(context, x_t, t) onto x1 - x0 along x_t = (1 - t) x0 + t x1."""
        if noise is None:
            noise = torch.randn(x1.shape, device=x1.device, generator=self.generator)
        if times is None:
            times = torch.rand(x1.shape[0], 1, device=x1.device, generator=self.generator)
        x_t = (1 - times) * noise + times * x1
        return (net.single(torch.cat([context, x_t, times], -1)) - (x1 - noise)).pow(2).mean()

    def high_actor_loss(self, batch, noise=None, times=None):
        context = torch.cat([batch["observations"], batch["actor_goals"]], -1)
        loss = self.flow_loss(self.high_flow, context, batch["actor_subgoals"], noise, times)
        return loss, {"high_actor/loss": loss.detach()}

    def low_actor_loss(self, batch, noise=None, times=None):
        context = torch.cat([batch["observations"], batch["low_goals"]], -1)
        loss = self.flow_loss(self.low_flow, context, batch["actions"], noise, times)
        return loss, {"low_actor/loss": loss.detach()}

    # ------------------------------------------------------------------ low level (double SHARSA)
    def low_critic_loss(self, batch):
        with torch.no_grad():
            next_v = torch.sigmoid(self.low_value.single(torch.cat([batch["next_observations"],
                                                                    batch["low_value_goals"]], -1)).squeeze(-1))
            target = batch["low_rewards"] + self.config.low_gamma * batch["low_masks"] * next_v
        logits = self.low_q_logits(batch["observations"], batch["low_value_goals"], batch["actions"])
        loss = bce(logits, target).mean(-1).sum()
        return loss, {"low_critic/loss": loss.detach(), "low_critic/q": torch.sigmoid(logits).mean().detach()}

    def low_value_loss(self, batch):
        with torch.no_grad():
            target = torch.sigmoid(self.low_q_logits(batch["observations"], batch["low_value_goals"],
                                                     batch["actions"], target=True)).min(0).values
        logits = self.low_value.single(torch.cat([batch["observations"], batch["low_value_goals"]], -1)).squeeze(-1)
        loss = bce(logits, target).mean()
        return loss, {"low_value/loss": loss.detach()}

    # ------------------------------------------------------------------ training
    def update(self, batch) -> dict[str, torch.Tensor]:
        parts = [self.critic_loss, self.value_loss, self.high_actor_loss, self.low_actor_loss]
        if self.config.double:
            parts += [self.low_critic_loss, self.low_value_loss]
        total, info = 0.0, {}
        with mixed_precision(batch["observations"].device, self.config.grad_dtype):
            for part in parts:
                loss, part_info = part(batch)
                total = total + loss
                info.update(part_info)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        polyak(self.target_critic, self.critic, self.config.tau)
        if self.config.double:
            polyak(self.target_low_critic, self.low_critic, self.config.tau)
        self.updates += 1
        info["loss"] = total.detach()
        return info

    @torch.no_grad()
    def td_errors(self, batch) -> torch.Tensor:
        """Per row: squared error of the high critic (sigmoid, mean over members) vs its target."""
        q = torch.sigmoid(self.q_logits(batch["observations"], batch["value_goals"], batch["high_actions"]))
        return (q - self.critic_target(batch)).pow(2).mean(0)

    # ------------------------------------------------------------------ acting
    def integrate(self, net: EnsembleMLP, context: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Euler-integrate a flow from noise `x` over t in [0, 1)."""
        for i in range(self.config.flow_steps):
            t = torch.full_like(x[:, :1], i / self.config.flow_steps)
            x = x + net.single(torch.cat([context, x, t], -1)) / self.config.flow_steps
        return x

    @torch.no_grad()
    def plan(self, obs: torch.Tensor, goals: torch.Tensor) -> dict[str, torch.Tensor]:
        """N subgoal candidates per row (one forward over B*N rows), scored by min_i Q_i; the best kept."""
        B, N = obs.shape[0], self.config.num_samples
        obs_n, goals_n = obs.repeat_interleave(N, 0), goals.repeat_interleave(N, 0)  # row b*N + j
        noise = torch.randn(B * N, self.goal_dim, device=obs.device, generator=self.generator)
        cands = self.integrate(self.high_flow, torch.cat([obs_n, goals_n], -1), noise)
        scores = torch.sigmoid(self.q_logits(obs_n, goals_n, cands)).min(0).values.view(B, N)
        best = scores.argmax(1)
        cands = cands.view(B, N, -1)
        return {"candidates": cands, "scores": scores, "subgoals": cands[torch.arange(B, device=obs.device), best]}

    @torch.no_grad()
    def low_actions(self, obs: torch.Tensor, subgoals: torch.Tensor) -> dict[str, torch.Tensor]:
        """Low-level actions toward `subgoals`: one flow sample, or (double) best-of-N by min_i Q_low_i."""
        B = obs.shape[0]
        if not self.config.double:
            noise = torch.randn(B, self.act_dim, device=obs.device, generator=self.generator)
            return {"actions": self.integrate(self.low_flow, torch.cat([obs, subgoals], -1), noise).clamp(-1, 1)}
        N = self.config.num_samples
        obs_n, sub_n = obs.repeat_interleave(N, 0), subgoals.repeat_interleave(N, 0)
        noise = torch.randn(B * N, self.act_dim, device=obs.device, generator=self.generator)
        cands = self.integrate(self.low_flow, torch.cat([obs_n, sub_n], -1), noise).clamp(-1, 1)
        scores = torch.sigmoid(self.low_q_logits(obs_n, sub_n, cands)).min(0).values.view(B, N)
        cands = cands.view(B, N, -1)
        return {"candidates": cands, "scores": scores,
                "actions": cands[torch.arange(B, device=obs.device), scores.argmax(1)]}

    @torch.no_grad()
    def act(self, obs: torch.Tensor, goals: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1] for observations [B, obs_dim] (or one [obs_dim]) and goals in rep space."""
        single = obs.dim() == 1
        if single:
            obs, goals = obs.unsqueeze(0), goals.unsqueeze(0)
        actions = self.low_actions(obs, self.plan(obs, goals)["subgoals"])["actions"]
        return actions[0] if single else actions

    def config_dict(self) -> dict:
        return {**asdict(self.config), "low_gamma": self.config.low_gamma}
