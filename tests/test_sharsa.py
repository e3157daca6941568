"""SHARSA / double SHARSA (robo_rl/rl/sharsa.py): every loss against an independent computation,
detached targets, goal sampling on hand-built trajectories, best-of-N selection, and a short
training run on a 2-D point-reaching dataset."""

import math

import numpy as np
import pytest
import torch

from robo_rl.errors import RoboRLError
from robo_rl.rl.sharsa import Sharsa, SharsaConfig, build_batch, goal_replay, sample_batch, sample_goal_indices

OBS, GOAL, ACT = 3, 2, 2


# ---------------------------------------------------------------------------- numpy reference
def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def bce_np(logit, y):
    return -(y * np.log(sig(logit)) + (1 - y) * np.log(1 - sig(logit)))


def weights(net):
    """A hidden=() EnsembleMLP is one affine map per member: (W [E, in, out], b [E, out])."""
    (lin,) = net.linears
    return lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()[:, 0]


def affine(net, *parts):
    """Member outputs [E, B, out] of a one-layer network on the concatenated numpy inputs."""
    W, b = weights(net)
    x = np.concatenate([np.asarray(p, np.float64) for p in parts], -1)
    return np.einsum("bi,eio->ebo", x, W) + b[:, None, :]


def randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.7 * torch.randn(p.shape, generator=g))


def linear_agent(double=True, **kw):
    """Every network a single affine layer (hidden=()), weights random and known to the test."""
    cfg = SharsaConfig(hidden=(), horizon=5, gamma=0.9, double=double, **kw)
    agent = Sharsa(OBS, ACT, GOAL, cfg, seed=0)
    randomise(agent, 1)  # also makes the target critics differ from the online ones
    return agent


def hand_batch():
    rng = np.random.default_rng(3)
    B = 5
    k = np.array([0, 3, 5, 2, 5], np.float32)
    success = np.array([1, 1, 0, 1, 0], np.float32)
    low_hit = np.array([1, 0, 0, 1, 0], np.float32)
    arr = {
        "observations": rng.normal(size=(B, OBS)), "actions": rng.uniform(-1, 1, (B, ACT)),
        "value_goals": rng.normal(size=(B, GOAL)), "high_actions": rng.normal(size=(B, GOAL)),
        "high_next_observations": rng.normal(size=(B, OBS)), "subgoal_steps": k,
        "rewards": 0.9 ** k * success, "masks": 1 - success,
        "actor_goals": rng.normal(size=(B, GOAL)), "actor_subgoals": rng.normal(size=(B, GOAL)),
        "low_goals": rng.normal(size=(B, GOAL)), "next_observations": rng.normal(size=(B, OBS)),
        "low_value_goals": rng.normal(size=(B, GOAL)), "low_rewards": low_hit, "low_masks": 1 - low_hit,
    }
    return arr, {key: torch.as_tensor(v, dtype=torch.float32) for key, v in arr.items()}


# ---------------------------------------------------------------------------- (1) losses by hand
def test_critic_bce_with_known_outputs():
    """Constant outputs: critic logits (0, ln 3) -> Q = (1/2, 3/4); value logit 0 -> V = 1/2."""
    agent = Sharsa(1, 1, 1, SharsaConfig(hidden=(), horizon=5, gamma=0.5), seed=0)
    with torch.no_grad():
        for p in agent.parameters():
            p.zero_()
        agent.critic.linears[0].bias[1] = math.log(3.0)
    one = torch.ones(1, 1)
    batch = {"observations": one, "value_goals": one, "high_actions": one, "high_next_observations": one,
             "subgoal_steps": torch.tensor([2.0]), "rewards": torch.tensor([0.0]), "masks": torch.tensor([1.0])}
    y = 0.5 ** 2 * 1.0 * 0.5  # r + gamma^k m V = 0.125
    expected = -(y * math.log(0.5) + (1 - y) * math.log(0.5)) - (y * math.log(0.75) + (1 - y) * math.log(0.25))
    loss, _ = agent.critic_loss(batch)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # value against min(Qbar): the target critic is still all zeros -> min = 1/2, V logit 0 -> BCE = ln 2
    assert agent.value_loss(batch)[0].item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_high_level_losses_match_numpy():
    agent = linear_agent()
    a, batch = hand_batch()

    # critic: y = r + gamma^k m sigmoid(V(s_{t+k}, g)); sum over members of mean BCE on [s, g, w]
    v_next = sig(affine(agent.value, a["high_next_observations"], a["value_goals"])[0, :, 0])
    y = a["rewards"] + 0.9 ** a["subgoal_steps"] * a["masks"] * v_next
    q = affine(agent.critic, a["observations"], a["value_goals"], a["high_actions"])[..., 0]  # [E, B]
    expected = sum(bce_np(q[e], y).mean() for e in range(2))
    assert agent.critic_loss(batch)[0].item() == pytest.approx(expected, rel=1e-5)

    # value: target min over the TARGET critics' sigmoids; BCE of V(s, g)
    qbar = sig(affine(agent.target_critic, a["observations"], a["value_goals"], a["high_actions"])[..., 0]).min(0)
    v = affine(agent.value, a["observations"], a["value_goals"])[0, :, 0]
    assert agent.value_loss(batch)[0].item() == pytest.approx(bce_np(v, qbar).mean(), rel=1e-5)
    q_online = sig(q).min(0)
    assert bce_np(v, q_online).mean() != pytest.approx(bce_np(v, qbar).mean(), rel=1e-3)  # target really differs

    # td_errors: per row, mean over members of (sigmoid(Q) - y)^2
    np.testing.assert_allclose(agent.td_errors(batch).numpy(), ((sig(q) - y) ** 2).mean(0), rtol=1e-5)


def flow_expected(net, context, x1, x0, t):
    x_t = (1 - t) * x0 + t * x1
    pred = affine(net, *context, x_t, t)[0]
    return ((pred - (x1 - x0)) ** 2).mean()


def test_flow_bc_losses_match_numpy():
    agent = linear_agent()
    a, batch = hand_batch()
    rng = np.random.default_rng(5)
    B = len(a["observations"])
    x0_w, x0_a = rng.normal(size=(B, GOAL)), rng.normal(size=(B, ACT))
    t = rng.uniform(size=(B, 1))
    f32 = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731

    got = agent.high_actor_loss(batch, noise=f32(x0_w), times=f32(t))[0].item()
    want = flow_expected(agent.high_flow, (a["observations"], a["actor_goals"]), a["actor_subgoals"], x0_w, t)
    assert got == pytest.approx(want, rel=1e-5)

    got = agent.low_actor_loss(batch, noise=f32(x0_a), times=f32(t))[0].item()
    want = flow_expected(agent.low_flow, (a["observations"], a["low_goals"]), a["actions"], x0_a, t)
    assert got == pytest.approx(want, rel=1e-5)


def test_double_sharsa_low_critic_and_value_match_numpy():
    agent = linear_agent(double=True)
    a, batch = hand_batch()
    low_gamma = 1 - 1 / 5
    v_next = sig(affine(agent.low_value, a["next_observations"], a["low_value_goals"])[0, :, 0])
    y = a["low_rewards"] + low_gamma * a["low_masks"] * v_next
    q = affine(agent.low_critic, a["observations"], a["low_value_goals"], a["actions"])[..., 0]
    expected = sum(bce_np(q[e], y).mean() for e in range(2))
    assert agent.low_critic_loss(batch)[0].item() == pytest.approx(expected, rel=1e-5)

    qbar = sig(affine(agent.target_low_critic, a["observations"], a["low_value_goals"], a["actions"])[..., 0]).min(0)
    v = affine(agent.low_value, a["observations"], a["low_value_goals"])[0, :, 0]
    assert agent.low_value_loss(batch)[0].item() == pytest.approx(bce_np(v, qbar).mean(), rel=1e-5)
    assert agent.config_dict()["low_gamma"] == pytest.approx(low_gamma)


# ---------------------------------------------------------------------------- (2) detached targets
def has_grad(module):
    return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_targets_are_detached_and_losses_touch_only_their_networks():
    agent = Sharsa(OBS, ACT, GOAL, SharsaConfig(hidden=(8, 8), horizon=5, double=True), seed=0)
    _, batch = hand_batch()
    nets = ["critic", "target_critic", "value", "high_flow", "low_flow", "low_critic", "target_low_critic",
            "low_value"]
    owners = {
        "critic_loss": {"critic"}, "value_loss": {"value"}, "high_actor_loss": {"high_flow"},
        "low_actor_loss": {"low_flow"}, "low_critic_loss": {"low_critic"}, "low_value_loss": {"low_value"},
    }
    for loss_name, own in owners.items():
        agent.optimizer.zero_grad(set_to_none=True)
        loss, _ = getattr(agent, loss_name)(batch)
        loss.backward()
        touched = {name for name in nets if has_grad(getattr(agent, name))}
        assert touched == own, f"{loss_name} put gradient into {touched - own or 'nothing'}"
    # only the critics have Polyak targets, and the optimiser never steps them
    opt_params = {id(p) for group in agent.optimizer.param_groups for p in group["params"]}
    assert not opt_params & {id(p) for p in agent.target_critic.parameters()}
    assert not opt_params & {id(p) for p in agent.target_low_critic.parameters()}
    assert len(opt_params) == sum(1 for p in agent.parameters() if p.requires_grad)


def test_update_moves_targets_by_polyak_only():
    agent = Sharsa(OBS, ACT, GOAL, SharsaConfig(hidden=(8,), tau=0.25), seed=0)
    _, batch = hand_batch()
    before = [p.clone() for p in agent.target_critic.parameters()]
    agent.update(batch)
    for t, b, o in zip(agent.target_critic.parameters(), before, agent.critic.parameters()):
        torch.testing.assert_close(t, 0.75 * b + 0.25 * o)


# ---------------------------------------------------------------------------- (3) sampling
LENGTHS = [5, 40, 1, 12, 30]  # rows 0-4, 5-44, 45, 46-57, 58-87; the length-1 trajectory is never a state


def dataset(with_oracle=True):
    obs, act, term, reps = [], [], [], []
    for j, L in enumerate(LENGTHS):
        for s in range(L):
            obs.append([j, s, 0.5])
            act.append([s / 100, -j / 10])
            term.append(s == L - 1)
            reps.append([1000.0 * j + s])
    out = {"observations": np.array(obs, np.float32), "actions": np.array(act, np.float32),
           "terminals": np.array(term)}
    if with_oracle:
        out["oracle_reps"] = np.array(reps, np.float32)
    return out


def bounds():
    first = np.cumsum([0] + LENGTHS[:-1])
    traj = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    return traj, first[traj] + np.array(LENGTHS)[traj] - 1  # per row: trajectory, last row


def test_states_come_only_from_rows_with_a_next_observation():
    replay = goal_replay(dataset(), seed=0)
    idx = replay.indices(200_000).numpy()
    _, end = bounds()
    valid = np.flatnonzero(np.arange(len(end)) < end)
    assert len(valid) == 83 and set(np.unique(idx)) == set(valid)
    counts = np.bincount(idx, minlength=len(end))[valid]
    assert np.abs(counts / counts.mean() - 1).max() < 0.1


def test_goal_mix_matches_probabilities():
    replay = goal_replay(dataset(), seed=1)
    traj, end = bounds()
    idx = replay.indices(200_000)
    goal = sample_goal_indices(replay, idx, 0.2, 0.5).numpy()
    idx = idx.numpy()
    cur = goal == idx
    future = (traj[goal] == traj[idx]) & (goal > idx) & (goal <= end[idx])
    n_valid = 83
    # a random goal can itself land on t, or ahead of t in t's own trajectory
    later_valid = end[idx] - 1 - idx  # valid rows in (t, end]
    assert cur.mean() == pytest.approx(0.2 + 0.3 / n_valid, abs=0.005)
    assert future.mean() == pytest.approx(0.5 + 0.3 * (later_valid / n_valid).mean(), abs=0.005)
    # a goal is a valid row (random, current or future) or the last row of t's own trajectory
    assert ((goal < end[goal]) | (goal == end[idx])).all()


def test_future_goals_uniform_like_reference_and_geometric_offsets():
    replay = goal_replay(dataset(), seed=2)
    idx = torch.full((200_000,), 5)  # first row of trajectory 1 (rows 5..44)
    goal = sample_goal_indices(replay, idx, 0.0, 1.0).numpy()
    assert goal.min() == 6 and goal.max() == 44
    freq = np.bincount(goal - 6, minlength=39) / len(goal)
    # a continuous uniform over (6, 44] rounded to a row: the two end rows carry half weight
    np.testing.assert_allclose(freq[1:-1], 1 / 38, rtol=0.08)
    np.testing.assert_allclose(freq[[0, -1]], 0.5 / 38, rtol=0.12)

    goal = sample_goal_indices(replay, idx, 0.0, 1.0, geom_p=0.1).numpy()
    offsets = goal - 5
    assert offsets.min() == 1 and offsets.max() == 39  # clipped at the trajectory's last row
    assert (offsets == 1).mean() == pytest.approx(0.1, abs=0.004)
    assert (offsets == 2).mean() == pytest.approx(0.09, abs=0.004)
    assert (offsets == 39).mean() == pytest.approx(0.9 ** 38, abs=0.003)


def test_build_batch_hand_values():
    cfg = SharsaConfig(horizon=5, gamma=0.9, double=True)
    replay = goal_replay(dataset(), seed=0)
    t = torch.tensor([5, 5, 5, 5, 42, 10, 3, 40])
    g = torch.tensor([5, 8, 10, 30, 70, 7, 4, 44])
    low = torch.tensor([5, 6, 5, 5, 42, 0, 3, 41])
    b = build_batch(replay, cfg, t, g, g, low)
    k = np.array([0, 3, 5, 5, 2, 5, 1, 4])
    # success = [k < n]: goal within reach (rows 0, 1, 6), or the trajectory ends within n (rows 4, 7;
    # row 4's goal is in another trajectory: the reference's definition counts it all the same)
    success = np.array([1, 1, 0, 0, 1, 0, 1, 1])
    np.testing.assert_array_equal(b["subgoal_steps"].numpy(), k)
    np.testing.assert_allclose(b["rewards"].numpy(), 0.9 ** k * success, rtol=1e-6)
    np.testing.assert_array_equal(b["masks"].numpy(), 1 - success)
    rep = lambda j, s: 1000.0 * j + s  # noqa: E731
    np.testing.assert_array_equal(b["high_actions"][:, 0].numpy(),
                                  [rep(1, 0), rep(1, 3), rep(1, 5), rep(1, 5), rep(1, 39), rep(1, 10), rep(0, 4),
                                   rep(1, 39)])
    np.testing.assert_array_equal(b["high_next_observations"][:, 1].numpy(), [0, 3, 5, 5, 39, 10, 4, 39])
    np.testing.assert_array_equal(b["actor_subgoals"].numpy(), b["high_actions"].numpy())
    np.testing.assert_array_equal(b["value_goals"][:, 0].numpy(), dataset()["oracle_reps"][g.numpy(), 0])
    # low level: rep(s_{min(t+n, end)}), next observation t+1, one-step reward = [goal is t]
    np.testing.assert_array_equal(b["low_goals"][:, 0].numpy(),
                                  [rep(1, 5)] * 4 + [rep(1, 39), rep(1, 10), rep(0, 4), rep(1, 39)])
    np.testing.assert_array_equal(b["next_observations"][:, 1].numpy(), [1, 1, 1, 1, 38, 6, 4, 36])
    np.testing.assert_array_equal(b["low_rewards"].numpy(), [1, 0, 1, 1, 1, 0, 1, 0])
    np.testing.assert_array_equal(b["low_masks"].numpy(), [0, 1, 0, 0, 0, 1, 0, 1])


def test_sampled_batches_never_cross_trajectories():
    cfg = SharsaConfig(horizon=5, gamma=0.9, double=True)
    replay = goal_replay(dataset(), seed=3)
    b = {k: v.numpy() for k, v in sample_batch(replay, 20_000, cfg).items()}
    L = np.array(LENGTHS)
    j, s = b["observations"][:, 0].astype(int), b["observations"][:, 1].astype(int)
    assert (s < L[j] - 1).all() and not (j == 2).any()
    k = b["subgoal_steps"].astype(int)
    assert ((0 <= k) & (k <= 5)).all()
    nxt = b["high_next_observations"]
    np.testing.assert_array_equal(nxt[:, 0], j)
    np.testing.assert_array_equal(nxt[:, 1], s + k)
    np.testing.assert_array_equal(b["high_actions"][:, 0], 1000 * j + s + k)
    aj, ask = np.divmod(b["actor_subgoals"][:, 0].astype(int), 1000)
    assert (aj == j).all() and ((ask - s >= 0) & (ask - s <= 5)).all()
    np.testing.assert_array_equal(b["low_goals"][:, 0], 1000 * j + np.minimum(s + 5, L[j] - 1))
    np.testing.assert_array_equal(b["next_observations"][:, :2], np.stack([j, s + 1], 1))
    gj, gs = np.divmod(b["value_goals"][:, 0].astype(int), 1000)
    reached = (gj == j) & (gs >= s) & (gs - s < 5)
    success = reached | (L[j] - 1 - s < 5)
    np.testing.assert_array_equal(b["masks"], 1 - success)
    np.testing.assert_allclose(b["rewards"], 0.9 ** k * success, rtol=1e-6)
    assert (b["masks"] == 0).mean() > 0.2  # the mix has real successes (p_cur alone gives 0.2)


def test_rep_choice():
    arrays = dataset()
    b = sample_batch(goal_replay(arrays), 8, SharsaConfig(rep="obs", horizon=5))
    assert b["value_goals"].shape == (8, 3) and b["low_goals"].shape == (8, 3)
    b = sample_batch(goal_replay(arrays), 8, SharsaConfig(horizon=5))  # auto: oracle_reps
    assert b["value_goals"].shape == (8, 1) and b["observations"].shape == (8, 3)
    with pytest.raises(RoboRLError, match="oracle_reps"):
        sample_batch(goal_replay(dataset(with_oracle=False)), 8, SharsaConfig(rep="oracle"))
    with pytest.raises(RoboRLError, match="sum to 1"):
        SharsaConfig(p_cur=0.5).check()


# ---------------------------------------------------------------------------- (4) acting
def test_plan_integrates_flow_and_picks_argmax_of_min_q():
    agent = linear_agent(double=True, num_samples=16, flow_steps=3)
    with torch.no_grad():  # critic: zero weight on (s, g), known linear function of w per member
        W = agent.critic.linears[0].weight
        W.zero_()
        W[0, OBS + GOAL:, 0] = torch.tensor([1.0, -2.0])
        W[1, OBS + GOAL:, 0] = torch.tensor([1.5, -1.0])
        agent.critic.linears[0].bias[:] = torch.tensor([0.0, 0.3]).view(2, 1, 1)
    rng = np.random.default_rng(0)
    B, N = 4, 16
    obs, goals = rng.normal(size=(B, OBS)), rng.normal(size=(B, GOAL))
    agent.generator = torch.Generator().manual_seed(7)
    out = agent.plan(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(goals, dtype=torch.float32))

    # the candidates: 3 Euler steps of the (affine) high flow from the generator's first normals
    x = torch.randn(B * N, GOAL, generator=torch.Generator().manual_seed(7)).double().numpy()
    ctx_o, ctx_g = np.repeat(obs, N, 0), np.repeat(goals, N, 0)
    for i in range(3):
        x = x + affine(agent.high_flow, ctx_o, ctx_g, x, np.full((B * N, 1), i / 3))[0] / 3
    cands = out["candidates"].double().numpy()
    np.testing.assert_allclose(cands.reshape(B * N, GOAL), x, rtol=1e-4, atol=1e-5)

    q = np.minimum(cands @ [1.0, -2.0], cands @ [1.5, -1.0] + 0.3)  # [B, N]
    best = q.argmax(1)
    np.testing.assert_allclose(out["subgoals"].numpy(), cands[np.arange(B), best], rtol=1e-6)
    assert len(set(best.tolist())) > 1  # the choice really varies across rows


def test_double_low_level_picks_best_clipped_action():
    agent = linear_agent(double=True, num_samples=16, flow_steps=3)
    with torch.no_grad():
        W = agent.low_critic.linears[0].weight
        W.zero_()
        W[:, OBS + GOAL:, 0] = torch.tensor([[-1.0, 2.0], [-0.5, 1.0]])
        agent.low_flow.linears[0].bias[0, 0, 0] = 3.0  # push actions past the box on the first axis
    obs, sub = torch.randn(4, OBS), torch.randn(4, GOAL)
    out = agent.low_actions(obs, sub)
    cands = out["candidates"].numpy()
    assert cands.min() >= -1 and cands.max() <= 1 and (np.abs(cands) == 1).any()
    q = np.minimum(cands @ [-1.0, 2.0], cands @ [-0.5, 1.0])
    np.testing.assert_allclose(out["actions"].numpy(), cands[np.arange(4), q.argmax(1)])
    actions = agent.act(obs, torch.randn(4, GOAL))
    assert actions.shape == (4, ACT) and torch.isfinite(actions).all() and actions.abs().max() <= 1
    assert agent.act(obs[0], sub[0]).shape == (ACT,)


# ---------------------------------------------------------------------------- (5) smoke run
def point_dataset(trajectories=60, length=40, seed=0):
    """A 2-D point driven toward a random target each trajectory (noisy proportional control)."""
    rng = np.random.default_rng(seed)
    obs, act, term = [], [], []
    for _ in range(trajectories):
        pos, target = rng.uniform(-1, 1, 2), rng.uniform(-1, 1, 2)
        for s in range(length):
            a = np.clip(2.0 * (target - pos) + rng.normal(0, 0.2, 2), -1, 1)
            obs.append(pos.copy())
            act.append(a)
            term.append(s == length - 1)
            pos = np.clip(pos + 0.1 * a, -1, 1)
    return {"observations": np.array(obs, np.float32), "actions": np.array(act, np.float32),
            "terminals": np.array(term)}


@pytest.fixture
def one_thread():
    """Tiny networks: intra-op threads only add contention (and on a busy CPU, a lot of it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("double,precision", [(False, "float32"), (True, "float32"), (False, "bfloat16")])
def test_smoke_training_lowers_critic_loss(double, precision, one_thread):
    torch.manual_seed(0)
    cfg = SharsaConfig(hidden=(64, 64), batch_size=256, horizon=5, gamma=0.99, num_samples=8, flow_steps=4,
                       lr=1e-3, double=double, grad_dtype=precision)
    replay = goal_replay(point_dataset(), seed=0)
    agent = Sharsa(2, 2, 2, cfg, seed=0)
    held = sample_batch(replay, 2048, cfg)

    def excess():
        """Critic BCE minus its floor (the targets' own entropy): sum over members of KL(y || Q)."""
        y = agent.critic_target(held).clamp(1e-6, 1 - 1e-6)
        entropy = -(y * y.log() + (1 - y) * (1 - y).log()).mean()
        with torch.no_grad():
            return agent.critic_loss(held)[0].item() - cfg.ensemble * entropy.item()

    start, losses = excess(), []
    seen = []  # the dtype the critic's first layer computes in during updates
    agent.critic.linears[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype) if torch.is_grad_enabled() else None)
    for _ in range(200):
        info = agent.update(sample_batch(replay, cfg.batch_size, cfg))
        losses.append(info["critic/loss"].item())
        assert all(torch.isfinite(v) for v in info.values())
    assert np.mean(losses[-20:]) < 0.9 * np.mean(losses[:20])
    assert excess() < 0.5 * start
    batch = sample_batch(replay, 64, cfg)
    actions = agent.act(batch["observations"], batch["value_goals"])
    assert actions.shape == (64, 2) and torch.isfinite(actions).all() and actions.abs().max() <= 1
    td = agent.td_errors(batch)
    assert td.shape == (64,) and (td >= 0).all()
    assert all(p.dtype == torch.float32 for p in agent.parameters())  # mixed precision: float32 weights
    assert set(seen) == {torch.float32 if precision == "float32" else torch.bfloat16}
