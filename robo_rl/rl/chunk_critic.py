"""A critic over action chunks, and value-guided chunk selection for any chunk policy.

Q(s, A) scores the part of a chunk that is executed before the policy is asked again: A is
H_c = n_action_steps consecutive actions (8 by default). It is trained offline by SARSA over
chunks on recorded episodes (demos, policy rollouts, RaC interventions), the way SHARSA trains its
subgoal critic:

    y = sum_{k < H_c} gamma^k r_{t+k}  +  gamma^{H_c} m Qbar(s_{t+H_c}, A_{t+H_c})

with the data's own next chunk (no max over chunks), Qbar a Polyak-averaged copy, the n-step sum
and its discount from `nstep_returns` (cut at a terminal step, where m = 0, and at the episode's
end, where the sum stops early and bootstraps from the last row). A chunk that runs past its
episode's end is padded with the episode's last action, as the policies' training windows are.
Rewards are 0/1-scaled so every Q lies in [0, 1]; the network's output is a logit, trained with
binary cross-entropy toward the soft target y (computed without gradient):
- `success`: 1 on the last step of an episode labelled successful, where it terminates (m = 0);
- `stage`: each sub-task stage newly reached pays 1 / n_stages (the running maximum of the
  per-step stage, so a stage lost and regained pays once and the return never exceeds 1); a
  successful episode's last step terminates it.
Two critics form ONE `EnsembleMLP` (one batched matmul per layer); `aggregate` (min or mean over
members) combines them in the target and in `score`. Inputs are standardised with the training
data's mean and std (per observation dim and per action dim), stored as buffers in the weights.

`ValueGuided` wraps a batched `predict(obs_window) -> chunks [B, H, A]`: each window is repeated
N times, ONE policy call draws B*N chunks, ONE critic call scores them, and each row keeps its
best chunk.

Nothing here imports the twin or the hardware: per-step stages come from robo_rl/sim/critic_data.py
through the CLI (robo_rl/cli/critic.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from robo_rl.errors import ConfigError
from robo_rl.rl.nets import EnsembleMLP, adam, bce, polyak
from robo_rl.rl.replay import REWARDS, episode_rewards, nstep_returns, trajectory_bounds

FORMAT = "robo_rl.chunk_critic"


@dataclass
class ChunkCriticConfig:
    horizon: int = 8                        # H_c: actions per scored chunk (the policy's n_action_steps)
    reward: str = "stage"                   # success | stage
    gamma: float = 0.995                    # per control step; a chunk discounts by gamma^H_c
    hidden: tuple[int, ...] = (256, 256, 256)
    ensemble: int = 2
    aggregate: str = "min"                  # min | mean over members, in the target and in score()
    lr: float = 3e-4
    tau: float = 0.005                      # Polyak rate of the target critic
    min_std: float = 0.01                   # floor on a dim's std before standardising it

    def check(self) -> "ChunkCriticConfig":
        if self.horizon < 1:
            raise ConfigError(f"critic: horizon={self.horizon} must be >= 1 (actions per scored chunk)")
        if self.reward not in REWARDS:
            raise ConfigError(f"critic: reward={self.reward!r}; choose one of {', '.join(REWARDS)}")
        if self.aggregate not in ("min", "mean"):
            raise ConfigError(f"critic: aggregate={self.aggregate!r}; choose min or mean")
        if not 0.0 < self.gamma <= 1.0 or self.ensemble < 1 or not self.hidden:
            raise ConfigError(f"critic: need 0 < gamma <= 1, ensemble >= 1 and hidden layers "
                              f"(got gamma={self.gamma}, ensemble={self.ensemble}, hidden={self.hidden})")
        self.hidden = tuple(int(h) for h in self.hidden)
        return self

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ChunkCriticConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"critic: unknown option(s) {unknown}; known: {sorted(names)}")
        return cls(**dict(d)).check()


# ---------------------------------------------------------------------- rewards and the chunk dataset
class ChunkData:
    """Recorded episodes as device tensors for chunk SARSA.

    Rows are steps, episodes concatenated. Per row: its observation features, its action, the
    index of its episode's last row, the H_c-step return, the bootstrap row and its discount.
    A trajectory's last row is trained on only when it is terminal (it has no next observation
    otherwise), but every row can be a bootstrap row. Chunks are gathered on the fly:
    rows t..t+H_c-1, clamped to the episode's last row (the padding).
    """

    def __init__(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, masks: np.ndarray,
                 terminals: np.ndarray, horizon: int, gamma: float, device: str | torch.device = "cpu",
                 seed: int = 0, episode_of_row: np.ndarray | None = None, success_of_row: np.ndarray | None = None):
        n = len(obs)
        for name, arr in (("actions", actions), ("rewards", rewards), ("masks", masks), ("terminals", terminals)):
            if len(arr) != n:
                raise ConfigError(f"critic data: '{name}' has {len(arr)} rows, observations have {n}")
        _, ends = trajectory_bounds(terminals)
        returns, boot, disc = nstep_returns(rewards, masks, ends, horizon, gamma)
        idx = np.arange(n)
        self.train_rows_np = np.flatnonzero((idx < ends) | (np.asarray(masks) == 0))
        self.horizon, self.gamma = horizon, gamma
        self.device = torch.device(device)
        t = lambda a, dt=torch.float32: torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=self.device)  # noqa: E731
        self.obs, self.actions = t(obs), t(actions)
        self.ends, self.boot = t(ends, torch.long), t(boot, torch.long)
        self.returns, self.discount = t(returns), t(disc)
        self.rows = t(self.train_rows_np, torch.long)
        self.mc_returns = monte_carlo_returns(rewards, masks, ends, gamma)
        self.episode_of_row = episode_of_row
        self.success_of_row = success_of_row
        self.offsets = torch.arange(horizon, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def __len__(self) -> int:
        return len(self.rows)

    def chunks(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, H_c, A]: the actions of rows t..t+H_c-1, the episode's last action repeated past its end."""
        idx = torch.minimum(rows[:, None] + self.offsets, self.ends[rows][:, None])
        return self.actions[idx]

    def gather(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        nxt = self.boot[rows]
        return {"obs": self.obs[rows], "chunk": self.chunks(rows), "returns": self.returns[rows],
                "discount": self.discount[rows], "next_obs": self.obs[nxt], "next_chunk": self.chunks(nxt)}

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        pick = torch.randint(0, len(self.rows), (batch_size,), device=self.device, generator=self.generator)
        return self.gather(self.rows[pick])

    def stats(self) -> dict[str, np.ndarray]:
        """Mean and std of observation features and of actions over every row."""
        o, a = self.obs.double(), self.actions.double()
        return {"obs_mean": o.mean(0).float().cpu().numpy(), "obs_std": o.std(0, correction=0).float().cpu().numpy(),
                "act_mean": a.mean(0).float().cpu().numpy(), "act_std": a.std(0, correction=0).float().cpu().numpy()}


def monte_carlo_returns(rewards: np.ndarray, masks: np.ndarray, ends: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return-to-go of every row within its episode (what the data's own chunks earned)."""
    out = np.zeros(len(rewards), np.float64)
    g = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        if i == ends[i]:
            g = 0.0
        g = rewards[i] + gamma * masks[i] * g
        out[i] = g
    return out.astype(np.float32)


def chunk_data_from_episodes(episodes: Sequence[Mapping[str, Any]], cfg: ChunkCriticConfig, n_stages: int,
                             device: str | torch.device = "cpu", seed: int = 0) -> ChunkData:
    """Episodes as dicts {obs [T, D], action [T, A], success bool, stages [T] (reward=stage)}."""
    if not episodes:
        raise ConfigError("critic: no episodes to train on")
    obs, act, rew, msk, term, ep_of, ok_of = [], [], [], [], [], [], []
    for j, ep in enumerate(episodes):
        T = len(ep["action"])
        if T == 0:
            continue
        r, m = episode_rewards(T, bool(ep["success"]), cfg.reward, ep.get("stages"), n_stages)
        obs.append(np.asarray(ep["obs"], np.float32).reshape(T, -1))
        act.append(np.asarray(ep["action"], np.float32).reshape(T, -1))
        rew.append(r)
        msk.append(m)
        tm = np.zeros(T, bool)
        tm[-1] = True
        term.append(tm)
        ep_of.append(np.full(T, j))
        ok_of.append(np.full(T, bool(ep["success"])))
    cat = np.concatenate
    return ChunkData(cat(obs), cat(act), cat(rew), cat(msk), cat(term), cfg.horizon, cfg.gamma, device, seed,
                     episode_of_row=cat(ep_of), success_of_row=cat(ok_of))


# ---------------------------------------------------------------------- the critic
class ChunkCritic(nn.Module):
    name = "chunk_critic"

    def __init__(self, obs_dim: int, act_dim: int, config: ChunkCriticConfig | None = None,
                 obs_keys: Sequence[str] = (), task: str | None = None, stats: Mapping[str, np.ndarray] | None = None,
                 n_stages: int = 1, seed: int = 0):
        super().__init__()
        self.config = cfg = (config or ChunkCriticConfig()).check()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.obs_keys, self.task, self.n_stages = list(obs_keys), task, int(n_stages)
        torch.manual_seed(seed)
        self.critic = EnsembleMLP(obs_dim + cfg.horizon * act_dim, cfg.hidden, 1, members=cfg.ensemble)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        s = stats or {}
        floor = lambda v, d: np.maximum(np.asarray(v if v is not None else np.ones(d), np.float32), cfg.min_std)  # noqa: E731
        self.register_buffer("obs_mean", torch.as_tensor(np.asarray(s.get("obs_mean", np.zeros(obs_dim)), np.float32)))
        self.register_buffer("obs_std", torch.as_tensor(floor(s.get("obs_std"), obs_dim)))
        self.register_buffer("act_mean", torch.as_tensor(np.asarray(s.get("act_mean", np.zeros(act_dim)), np.float32)))
        self.register_buffer("act_std", torch.as_tensor(floor(s.get("act_std"), act_dim)))
        for name, dim in (("obs_mean", obs_dim), ("obs_std", obs_dim), ("act_mean", act_dim), ("act_std", act_dim)):
            if getattr(self, name).shape != (dim,):
                raise ConfigError(f"critic: stats '{name}' has shape {tuple(getattr(self, name).shape)}, expected ({dim},)")
        self.optimizer = adam(self.critic.parameters(), cfg.lr)
        self.updates = 0

    # -- inputs and heads
    def inputs(self, obs: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """Raw [B, D] observations and raw [B, >=H_c, A] chunks -> standardised [B, D + H_c * A]."""
        h = self.config.horizon
        if chunk.dim() != 3 or chunk.shape[1] < h or chunk.shape[2] != self.act_dim:
            raise ConfigError(f"critic: chunks of shape {tuple(chunk.shape)}; need (batch, >= {h}, {self.act_dim})")
        o = (obs.float() - self.obs_mean) / self.obs_std
        a = (chunk[:, :h].float() - self.act_mean) / self.act_std
        return torch.cat([o, a.flatten(1)], -1)

    def logits(self, obs: torch.Tensor, chunk: torch.Tensor, target: bool = False) -> torch.Tensor:
        net = self.target_critic if target else self.critic
        return net(self.inputs(obs, chunk)).squeeze(-1)  # [E, B]

    def combine(self, q: torch.Tensor) -> torch.Tensor:
        return q.min(0).values if self.config.aggregate == "min" else q.mean(0)

    # -- the loss
    @torch.no_grad()
    def target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """y = H_c-step return + gamma^k * m * agg_i Qbar_i(s', A'), no gradient."""
        next_q = self.combine(torch.sigmoid(self.logits(batch["next_obs"], batch["next_chunk"], target=True)))
        return batch["returns"] + batch["discount"] * next_q

    def critic_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        y = self.target(batch)
        logits = self.logits(batch["obs"], batch["chunk"])
        loss = bce(logits, y).mean(-1).sum()  # each member's mean BCE, summed
        return loss, {"critic/loss": loss.detach(), "critic/q": torch.sigmoid(logits).mean().detach(),
                      "critic/target": y.mean()}

    def update(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss, info = self.critic_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        polyak(self.target_critic, self.critic, self.config.tau)
        self.updates += 1
        return info

    @torch.no_grad()
    def td_errors(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(Q - y)^2 per sample (members combined as in `score`), as the other agents' td_errors."""
        return (self.combine(torch.sigmoid(self.logits(batch["obs"], batch["chunk"]))) - self.target(batch)).pow(2)

    # -- acting
    @torch.no_grad()
    def score(self, obs: torch.Tensor | np.ndarray, chunks: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Q of raw observation features [B, D] and raw chunks [B, >=H_c, A] -> [B] in [0, 1]."""
        dev = self.obs_mean.device
        obs, chunks = torch.as_tensor(obs, device=dev), torch.as_tensor(chunks, device=dev)
        return self.combine(torch.sigmoid(self.logits(obs, chunks)))

    def features(self, obs_window: Mapping[str, Any]) -> np.ndarray:
        """The newest frame of each of `obs_keys` in a policy window (key -> [B, To, ...]) -> [B, D]."""
        missing = [k for k in self.obs_keys if k not in obs_window]
        if missing:
            raise ConfigError(f"critic: needs observation(s) {missing}; the window has {sorted(obs_window)}")
        parts = [np.asarray(obs_window[k])[:, -1] for k in self.obs_keys]
        return np.concatenate([p.reshape(len(p), -1) for p in parts], axis=1).astype(np.float32)

    # -- files
    def checkpoint(self, **extra: Any) -> dict:
        """What critic.pt holds: weights (without the target), config, obs keys, task, sizes. The
        caller writes it atomically (learn.learner.atomic_save; rl does not import learn)."""
        net = {k: v for k, v in self.state_dict().items() if not k.startswith("target_critic.")}
        return ({"format": FORMAT, "config": {**asdict(self.config), "hidden": list(self.config.hidden)},
                     "obs_keys": self.obs_keys, "task": self.task, "obs_dim": self.obs_dim, "act_dim": self.act_dim,
                     "n_stages": self.n_stages, "updates": self.updates, "weights": net, **extra})

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "ChunkCritic":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"critic {path} does not exist (train one with `robo-rl critic`)")
        try:
            state = torch.load(path, map_location=device, weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means "not a critic"
            raise ConfigError(f"critic {path} could not be read ({type(e).__name__})") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ConfigError(f"critic {path} is not a chunk critic written by `robo-rl critic`")
        critic = cls(state["obs_dim"], state["act_dim"], ChunkCriticConfig.from_dict(state["config"]),
                     state["obs_keys"], state["task"], n_stages=state.get("n_stages", 1))
        missing, unexpected = critic.load_state_dict(state["weights"], strict=False)
        if unexpected or any(not k.startswith("target_critic.") for k in missing):
            raise ConfigError(f"critic {path}: weights do not fit its own description (written by another version?)")
        critic.target_critic.load_state_dict(critic.critic.state_dict())  # the target is not saved
        critic.updates = int(state.get("updates", 0))
        return critic.to(device).eval()

    def check_matches(self, obs_keys: Sequence[str], n_action_steps: int, task: str | None) -> None:
        """One-line errors for a critic trained for another policy set-up than the one it guides."""
        if sorted(self.obs_keys) != sorted(obs_keys):
            raise ConfigError(f"critic was trained on obs keys {self.obs_keys}, the policy reads {list(obs_keys)}; "
                              f"train the critic with obs_keys=[{','.join(obs_keys)}]")
        if self.config.horizon != int(n_action_steps):
            raise ConfigError(f"critic scores chunks of {self.config.horizon} actions, the policy executes "
                              f"{n_action_steps} per chunk; train the critic with horizon={n_action_steps}")
        if task and self.task and task != self.task:
            raise ConfigError(f"critic was trained on task {self.task!r}, the policy runs {task!r}")


# ---------------------------------------------------------------------- value-guided selection
class ValueGuided:
    """`predict` with best-of-N chunk selection by a critic: windows [B, To, ...] -> chunks
    [B, H, A]. One batched policy call for B*N chunks, one batched critic call, argmax per row.
    Keeps per-call timings (policy, critic) and how far the picked chunk's Q is above the mean."""

    def __init__(self, predict: Callable[[Mapping[str, Any]], Any], critic: ChunkCritic, samples: int = 16):
        if samples < 1:
            raise ConfigError(f"critic_samples={samples} must be >= 1")
        self.predict, self.critic, self.samples = predict, critic, int(samples)
        self.rows = 0
        self.policy_s: list[float] = []  # per call: the one policy call for B*N chunks
        self.critic_s: list[float] = []  # per call: features, the one critic call, the argmax
        self.gain = 0.0  # sum over rows of (best Q - mean Q among the N samples)
        self.chosen_q = 0.0

    def __call__(self, obs_window: Mapping[str, Any]) -> np.ndarray:
        n = self.samples
        first = next(iter(obs_window.values()))
        b = len(first)
        t0 = time.perf_counter()
        repeated = {k: np.repeat(np.asarray(v), n, axis=0) for k, v in obs_window.items()}
        chunks = np.asarray(self.predict(repeated))  # [B*N, H, A]; row b*N + j is window b's j-th sample
        t1 = time.perf_counter()
        obs = np.repeat(self.critic.features(obs_window), n, axis=0)
        q = self.critic.score(obs, chunks).float().cpu().view(b, n)
        best = q.argmax(1).numpy()
        picked = chunks.reshape(b, n, *chunks.shape[1:])[np.arange(b), best]
        t2 = time.perf_counter()
        self.rows += b
        self.policy_s.append(t1 - t0)
        self.critic_s.append(t2 - t1)
        self.gain += float((q.max(1).values - q.mean(1)).sum())
        self.chosen_q += float(q.max(1).values.sum())
        return picked

    def stats(self) -> dict[str, float]:
        """Call count, median milliseconds per call (medians: a call that first traces a batch size
        is an outlier), and the mean Q of the picked chunks and its margin over the samples' mean."""
        r = max(self.rows, 1)
        med = lambda xs: 1e3 * float(np.median(xs)) if xs else 0.0  # noqa: E731
        return {"critic_samples": self.samples, "guided_calls": len(self.policy_s),
                "policy_ms_per_call_p50": med(self.policy_s), "critic_ms_per_call_p50": med(self.critic_s),
                "mean_chosen_q": self.chosen_q / r, "mean_q_gain_over_sample_mean": self.gain / r}

    def describe(self) -> str:
        s = self.stats()
        return (f"value-guided: N={self.samples}, {s['guided_calls']} calls; per call (p50) "
                f"{s['policy_ms_per_call_p50']:.1f} ms policy for B*N chunks + {s['critic_ms_per_call_p50']:.1f} ms "
                f"critic; chosen Q {s['mean_chosen_q']:.3f} (+{s['mean_q_gain_over_sample_mean']:.3f} over the samples' mean)")
