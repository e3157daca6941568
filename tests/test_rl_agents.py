"""floq and FQL: each loss against a computation written out here in numpy (float64) on fixed tiny
batches with fixed random draws; gradients only where they belong; a toy MDP whose Q is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from robo_rl.rl.floq import Floq, FloqConfig
from robo_rl.rl.fql import FQL, FQLConfig
from robo_rl.rl.nets import EnsembleMLP, hl_gauss_features, polyak


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny networks: one thread avoids OpenMP barrier costs (20x slower on a busy 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- numpy reference
def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_mlp(net: EnsembleMLP, x: np.ndarray, member: int = 0) -> np.ndarray:
    """The network's forward for one member, from its weights, in float64."""
    n_hidden = len(net.linears) - 1
    for i, lin in enumerate(net.linears):
        x = x @ lin.weight[member].detach().double().numpy() + lin.bias[member, 0].detach().double().numpy()
        if i < n_hidden:
            x = gelu_tanh(x)
            norm = net.norms[i]
            if hasattr(norm, "scale"):
                x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
                x = x * norm.scale[member, 0].detach().double().numpy() + norm.offset[member, 0].detach().double().numpy()
    return x


def np_hl_gauss(z: float, lo: float, hi: float, bins: int, sigma_bins: float) -> np.ndarray:
    z = min(max(z, lo), hi)  # returns outside the support are encoded as its edge
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    sigma = sigma_bins * (hi - lo) / bins
    cdf = [0.5 * (1 + math.erf((e - z) / (sigma * math.sqrt(2)))) for e in edges]
    mass = [cdf[i + 1] - cdf[i] for i in range(bins)]
    return np.array(mass) / (cdf[-1] - cdf[0])


def n(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def tiny_batch(B=4, obs_dim=3, act_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"observations": torch.randn(B, obs_dim, generator=g), "actions": torch.rand(B, act_dim, generator=g) * 2 - 1,
            "next_observations": torch.randn(B, obs_dim, generator=g),
            "rewards": -torch.tensor([1.0, 0.0, 1.0, 0.0])[:B], "masks": torch.tensor([1.0, 1.0, 0.0, 1.0])[:B]}


# ----------------------------------------------------------------------------- networks
def test_ensemble_mlp_matches_numpy_members_independent_and_flax_init():
    torch.manual_seed(0)
    net = EnsembleMLP(5, (7, 6), 2, members=3)
    x = torch.randn(4, 5)
    out = net(x)
    assert out.shape == (3, 4, 2)
    for e in range(3):
        np.testing.assert_allclose(n(out[e]), np_mlp(net, n(x), e), rtol=1e-5, atol=1e-6)
    w = net.linears[0].weight
    assert not torch.equal(w[0], w[1])  # members initialised independently
    assert w.abs().max() <= math.sqrt(6 / (5 + 7))  # Glorot-uniform, fan_avg
    assert all(float(lin.bias.detach().abs().sum()) == 0 for lin in net.linears)
    # per-member inputs [E, B, in] go to their own member
    xe = torch.randn(3, 4, 5)
    np.testing.assert_allclose(n(net(xe)[2]), np_mlp(net, n(xe[2]), 2), rtol=1e-5, atol=1e-6)
    # forward_with folds each LayerNorm's scale and offset into the next layer: exact in float32
    with torch.no_grad():
        for norm in net.norms:
            norm.scale.uniform_(0.5, 1.5)
            norm.offset.normal_(0.0, 0.3)
    np.testing.assert_allclose(n(net.forward_with(xe, net.low_precision(torch.float32))), n(net(xe)), rtol=1e-5, atol=1e-5)
    # the bf16 path stays close to float32 (hidden layers in bf16, output layer in float32)
    low = net.forward_with(xe, net.low_precision(torch.bfloat16))
    assert low.dtype == torch.float32
    np.testing.assert_allclose(n(low), n(net(xe)), atol=0.1)


def test_hl_gauss_features_by_hand():
    lo, hi = -10.1, 0.1
    z = torch.tensor([-10.1, -5.0, -0.3, 0.1], dtype=torch.float64)
    feats = hl_gauss_features(z, lo, hi, bins=50, sigma_bins=16.0)
    for i, zi in enumerate(z.tolist()):
        np.testing.assert_allclose(feats[i].numpy(), np_hl_gauss(zi, lo, hi, 50, 16.0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(feats.sum(-1).numpy(), 1.0, rtol=1e-12)
    assert int(feats[1].argmax()) == int((-5.0 - lo) / ((hi - lo) / 50))  # mass centred on z's bin


def test_polyak_by_hand():
    torch.manual_seed(0)
    online, target = EnsembleMLP(2, (3,), 1, members=2), EnsembleMLP(2, (3,), 1, members=2)
    before = [p.clone() for p in target.parameters()]
    polyak(target, online, 0.25)
    for b, o, t in zip(before, online.parameters(), target.parameters()):
        torch.testing.assert_close(t, 0.75 * b + 0.25 * o)


# ----------------------------------------------------------------------------- FQL
def fql_agent(seed=0):
    return FQL(3, 2, FQLConfig(hidden=(8, 8), gamma=0.9, alpha=3.0, flow_steps=4), seed=seed)


def test_fql_critic_loss_by_hand():
    agent, batch = fql_agent(), tiny_batch()
    with torch.no_grad():  # targets differ from online weights after a few Polyak-free perturbations
        for p in agent.target_critic.parameters():
            p.add_(0.05 * torch.randn_like(p))
    draws = agent.draw(4, "cpu")
    loss, _ = agent.critic_loss(batch, draws)

    s, a, s2 = n(batch["observations"]), n(batch["actions"]), n(batch["next_observations"])
    r, m = n(batch["rewards"]), n(batch["masks"])
    a2 = np.clip(np_mlp(agent.actor.one_step, np.concatenate([s2, n(draws["eps_next"])], 1)), -1, 1)
    q_next = np.mean([np_mlp(agent.target_critic, np.concatenate([s2, a2], 1), e)[:, 0] for e in range(2)], 0)
    y = r + 0.9 * m * q_next
    q = np.stack([np_mlp(agent.critic, np.concatenate([s, a], 1), e)[:, 0] for e in range(2)])
    np.testing.assert_allclose(float(loss), np.mean((q - y) ** 2), rtol=1e-5)


def test_fql_actor_loss_by_hand():
    agent, batch = fql_agent(1), tiny_batch()
    draws = agent.draw(4, "cpu")
    loss, info = agent.actor_loss(batch, draws)

    s, a = n(batch["observations"]), n(batch["actions"])
    x0, t, eps = n(draws["x0"]), n(draws["t"]), n(draws["eps"])
    a_t = (1 - t) * x0 + t * a
    bc = np.mean((np_mlp(agent.actor.bc_flow, np.concatenate([s, a_t, t], 1)) - (a - x0)) ** 2)
    teacher = eps.copy()
    for i in range(4):  # Euler steps of the BC flow
        teacher = teacher + np_mlp(agent.actor.bc_flow, np.concatenate([s, teacher, np.full((4, 1), i / 4)], 1)) / 4
    teacher = np.clip(teacher, -1, 1)
    student = np_mlp(agent.actor.one_step, np.concatenate([s, eps], 1))
    distill = np.mean((student - teacher) ** 2)
    sa = np.concatenate([s, np.clip(student, -1, 1)], 1)
    q = np.mean([np_mlp(agent.critic, sa, e)[:, 0] for e in range(2)], 0)
    np.testing.assert_allclose(float(info["actor/bc_flow"]), bc, rtol=1e-5)
    np.testing.assert_allclose(float(info["actor/distill"]), distill, rtol=1e-5)
    np.testing.assert_allclose(float(loss), bc + 3.0 * distill - q.mean(), rtol=1e-5)


def test_fql_gradients_stay_in_their_networks():
    agent, batch = fql_agent(), tiny_batch()
    draws = agent.draw(4, "cpu")
    agent.actor_loss(batch, draws)[0].backward()
    assert all(p.grad is None for p in agent.critic.parameters()), "actor step moved the critic"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.actor.one_step.parameters())
    agent.zero_grad(set_to_none=True)
    agent.critic_loss(batch, draws)[0].backward()
    assert all(p.grad is None for p in agent.actor.parameters()), "TD target not detached from the actor"
    assert all(p.grad is None for p in agent.target_critic.parameters())
    assert all(p.requires_grad for p in agent.critic.parameters())  # frozen() restored them


# ----------------------------------------------------------------------------- floq
def floq_agent(**kw):
    cfg = FloqConfig(hidden=(8, 8), gamma=0.9, alpha=3.0, flow_steps=3, critic_steps=3, noise_copies=2, bins=6,
                     sigma_bins=2.0, **kw)
    return Floq(3, 2, cfg, seed=0, reward_range=(-1.0, 0.0))


def np_floq_readout(field_mlp, sa, z0, lo, hi, K, member, bins=6, sigma_bins=2.0):
    z = z0.copy()
    for i in range(K):
        feats = np.stack([np_hl_gauss(zi, lo, hi, bins, sigma_bins) for zi in z])
        x = np.concatenate([sa, feats, np.full((len(z), 1), math.cos(i / K))], 1)
        z = z + np_mlp(field_mlp, x, member)[:, 0] / K
    return z


def test_floq_critic_loss_by_hand():
    agent, batch = floq_agent(), tiny_batch()
    with torch.no_grad():
        for p in agent.target_floq.parameters():
            p.add_(0.05 * torch.randn_like(p))
    B, R, K = 4, 2, 3
    draws = agent.draw(B, "cpu")
    assert float(draws["z0"].min()) >= agent.z0_lo and float(draws["z0"].max()) <= agent.z0_hi
    assert agent.z0_lo == pytest.approx(0.1 * -1.0 / 0.1) and agent.z0_hi == 0.0  # c r / (1 - gamma)
    lo, hi = agent.floq.lo, agent.floq.hi
    assert (lo, hi) == (pytest.approx(-1.01 / 0.1), pytest.approx(0.01 / 0.1))
    loss, info = agent.critic_loss(batch, draws)

    s, a, s2 = n(batch["observations"]), n(batch["actions"]), n(batch["next_observations"])
    r, m = n(batch["rewards"]), n(batch["masks"])
    s2_rep = np.repeat(s2, R, 0)
    a2 = np.clip(np_mlp(agent.actor.one_step, np.concatenate([s2_rep, n(draws["eps_next"])], 1)), -1, 1)
    sa2 = np.concatenate([s2_rep, a2], 1)
    q_next = np.mean([np_floq_readout(agent.target_floq.field, sa2, n(draws["z0_next"]), lo, hi, K, e) for e in range(2)], 0)
    y = (r[:, None] + 0.9 * m[:, None] * q_next.reshape(B, R)).mean(1)

    sa = np.repeat(np.concatenate([s, a], 1), R, 0)
    z0, t = n(draws["z0"]), n(draws["t_flow"])
    y_rep = np.repeat(y, R)
    z_t = (1 - t) * z0 + t * y_rep
    flow = 0.0
    for e in range(2):
        feats = np.stack([np_hl_gauss(zi, lo, hi, 6, 2.0) for zi in z_t])
        v = np_mlp(agent.floq.field, np.concatenate([sa, feats, np.cos(t)[:, None]], 1), e)[:, 0]
        flow += ((v - (y_rep - z0)) ** 2).reshape(B, R).sum(1).mean() / 2
    q_online = np.stack([np_floq_readout(agent.floq.field, sa, z0, lo, hi, K, e) for e in range(2)])  # [E, B*R]
    distill_target = q_online.reshape(2, B, R).mean((0, 2))
    q_phi = np.stack([np_mlp(agent.distilled, np.concatenate([s, a], 1), e)[:, 0] for e in range(2)])
    distill = np.mean((q_phi - distill_target) ** 2)
    np.testing.assert_allclose(float(info["critic/flow"]), flow, rtol=1e-5)
    np.testing.assert_allclose(float(info["critic/distill"]), distill, rtol=1e-5)
    np.testing.assert_allclose(float(loss), flow + distill, rtol=1e-5)


def test_floq_min_aggregation_and_bf16_readout():
    agent, batch = floq_agent(q_agg="min"), tiny_batch()
    draws = agent.draw(4, "cpu")
    B, R = 4, 2
    s2_rep = batch["next_observations"].repeat_interleave(R, 0)
    a2 = agent.actor.one_step_actions(s2_rep, draws["eps_next"]).clamp(-1, 1)
    per_member = agent.target_floq.read_out(torch.cat([s2_rep, a2], -1), draws["z0_next"], 3)
    expected = (batch["rewards"][:, None] + 0.9 * batch["masks"][:, None] * per_member.min(0).values.view(B, R)).mean(1)
    torch.testing.assert_close(agent.td_target(batch, draws["eps_next"], draws["z0_next"]), expected)
    low = agent.target_floq.read_out(torch.cat([s2_rep, a2], -1), draws["z0_next"], 3, torch.bfloat16)
    np.testing.assert_allclose(n(low), n(per_member), atol=0.05 * float(per_member.abs().max()) + 0.02)


def test_floq_gradients_stay_in_their_networks():
    agent, batch = floq_agent(), tiny_batch()
    draws = agent.draw(4, "cpu")
    agent.actor_loss(batch, draws)[0].backward()
    assert all(p.grad is None for p in [*agent.distilled.parameters(), *agent.floq.parameters()])
    agent.zero_grad(set_to_none=True)
    agent.critic_loss(batch, draws)[0].backward()
    assert all(p.grad is None for p in agent.actor.parameters())
    assert all(p.grad is None for p in agent.target_floq.parameters())
    assert all(p.grad is not None for p in agent.distilled.parameters())
    assert all(p.grad is not None for p in agent.floq.parameters())  # the flow loss reaches the field
    # an update moves the target field by exactly tau towards the online field
    agent.zero_grad(set_to_none=True)
    before = [p.clone() for p in agent.target_floq.parameters()]
    agent.update(batch)
    for b, o, t in zip(before, agent.floq.parameters(), agent.target_floq.parameters()):
        torch.testing.assert_close(t, (1 - agent.config.tau) * b + agent.config.tau * o.detach())


# ----------------------------------------------------------------------------- learning
# floq in bf16: 14 s on an AVX2-only CPU (no native bf16 there); bf16 training stays in the
# default run through fql here and SHARSA's smoke tests
@pytest.mark.parametrize("name,precision", [("fql", "float32"), ("fql", "bfloat16"), ("floq", "float32"),
                                            pytest.param("floq", "bfloat16", marks=pytest.mark.slow)])
def test_critic_learns_a_known_value(name, precision):
    """One state, reward -1 every step, never terminal: Q = -1 / (1 - gamma) = -2 for every action.
    bfloat16: every pass in bf16 (mixed-precision gradient steps, bf16 no-grad passes)."""
    torch.manual_seed(0)
    B = 64
    batch = {"observations": torch.zeros(B, 2), "next_observations": torch.zeros(B, 2),
             "actions": torch.rand(B, 1) * 2 - 1, "rewards": -torch.ones(B), "masks": torch.ones(B)}
    common = dict(hidden=(32, 32), gamma=0.5, tau=0.05, lr=3e-3, alpha=1.0, grad_dtype=precision, nograd_dtype=precision)
    if name == "fql":
        agent = FQL(2, 1, FQLConfig(**common))
    else:
        agent = Floq(2, 1, FloqConfig(**common, noise_copies=2, critic_steps=4), reward_range=(-1.0, 0.0))
    critic = agent.critic if name == "fql" else agent.floq.field
    seen = []  # the dtype the critic's first layer computes in during updates
    hook = critic.linears[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    for _ in range(400):
        batch["actions"] = torch.rand(B, 1) * 2 - 1
        info = agent.update(batch)
    hook.remove()
    assert set(seen) == {torch.float32 if precision == "float32" else torch.bfloat16}
    q = agent.score(batch["observations"], batch["actions"])
    assert float(q.mean()) == pytest.approx(-2.0, abs=0.15)
    assert agent.act(batch["observations"]).abs().max() <= 1.0
    # mixed precision keeps float32 weights (and optimiser state) and float32 scalar heads
    assert all(p.dtype == torch.float32 for p in agent.parameters())
    assert all(v.dtype == torch.float32 for v in info.values())


def test_hl_gauss_features_stay_finite_far_outside_the_support():
    z = torch.tensor([-1e4, -10.0, 1e4])
    feats = hl_gauss_features(z, -1.01 / 0.01, -0.99 / 0.01)  # a support that excludes all three
    assert torch.isfinite(feats).all()
    torch.testing.assert_close(feats.sum(-1), torch.ones(3))


def test_bf16_teacher_flow_stays_close_and_bad_dtype_is_refused():
    from robo_rl.errors import RoboRLError

    full = FQL(3, 2, FQLConfig(hidden=(32, 32)), seed=0)
    low = FQL(3, 2, FQLConfig(hidden=(32, 32), nograd_dtype="bfloat16"), seed=0)
    low.load_state_dict(full.state_dict())
    obs, eps = torch.randn(16, 3), torch.randn(16, 2)
    a, b = full.actor.flow_actions(obs, eps), low.actor.flow_actions(obs, eps)
    assert not torch.equal(a, b)  # the bf16 path is really taken
    torch.testing.assert_close(b, a, atol=0.05, rtol=0)
    with pytest.raises(RoboRLError, match="nograd_dtype"):
        FQL(3, 2, FQLConfig(nograd_dtype="float16"))
    with pytest.raises(RoboRLError, match="grad_dtype"):
        FloqConfig(grad_dtype="half")
