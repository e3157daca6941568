"""Chunk critic (robo_rl/rl/chunk_critic.py): SARSA chunk targets and BCE against hand values,
detached targets, value-guided selection, per-step stages from the twin, and `robo-rl critic`."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import robo_rl_cli
from conftest import robo_rl_in_process as _in_process

from robo_rl.data.schema import EpisodeMeta
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.learn.learner import atomic_save
from robo_rl.rl.chunk_critic import (ChunkCritic, ChunkCriticConfig, ValueGuided, chunk_data_from_episodes,
                                     episode_rewards)

H, GAMMA, A, D = 3, 0.9, 2, 3


def tiny_episodes():
    """A: 5 steps, successful, stages 0 1 0 1 2 (a stage lost and regained pays once).
    B: 4 steps, failed, stages 0 0 1 1. Two stages in all, so each pays 0.5."""
    rng = np.random.default_rng(0)
    eps = []
    for T, ok, stages in ((5, True, [0, 1, 0, 1, 2]), (4, False, [0, 0, 1, 1])):
        eps.append({"obs": rng.standard_normal((T, D)).astype(np.float32),
                    "action": rng.standard_normal((T, A)).astype(np.float32), "success": ok, "stages": np.array(stages)})
    return eps


def tiny_critic(data, seed=0):
    cfg = ChunkCriticConfig(horizon=H, gamma=GAMMA, hidden=(8, 8), reward="stage")
    return ChunkCritic(D, A, cfg, ["obs/x"], "pack_cube", data.stats(), n_stages=2, seed=seed), cfg


def test_stage_rewards_pay_each_new_stage_once():
    r, m = episode_rewards(5, True, "stage", np.array([0, 1, 0, 1, 2]), n_stages=2)
    assert r.tolist() == [0, 0.5, 0, 0, 0.5] and m.tolist() == [1, 1, 1, 1, 0]
    r, m = episode_rewards(4, False, "success")
    assert r.tolist() == [0, 0, 0, 0] and m.tolist() == [1, 1, 1, 1]
    r, m = episode_rewards(3, True, "success")
    assert r.tolist() == [0, 0, 1] and m.tolist() == [1, 1, 0]


def test_sarsa_chunk_target_and_bce_match_hand_computation():
    eps = tiny_episodes()
    cfg = ChunkCriticConfig(horizon=H, gamma=GAMMA, reward="stage")
    data = chunk_data_from_episodes(eps, cfg, n_stages=2)
    # rows: A = 0..4 (4 terminal: success), B = 5..8 (8 is B's last row, no next obs: not trained on)
    assert data.train_rows_np.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    g = GAMMA
    # row -> (H_c-step return, bootstrap row, discount, chunk rows, next chunk rows)
    hand = {
        0: (0 + g * 0.5 + g * g * 0, 3, g ** 3, [0, 1, 2], [3, 4, 4]),
        2: (0 + g * 0 + g * g * 0.5, None, 0.0, [2, 3, 4], None),   # reaches A's terminal step: no bootstrap
        4: (0.5, None, 0.0, [4, 4, 4], None),                      # the terminal row, chunk padded
        5: (0 + g * 0 + g * g * 0.5, 8, g ** 3, [5, 6, 7], [8, 8, 8]),
        6: (0 + g * 0.5, 8, g ** 2, [6, 7, 8], [8, 8, 8]),          # B ends: the sum stops before its last row
        7: (0.5, 8, g, [7, 8, 8], [8, 8, 8]),
    }
    rows = torch.tensor(sorted(hand))
    batch = data.gather(rows)
    obs_all = np.concatenate([e["obs"] for e in eps])
    act_all = np.concatenate([e["action"] for e in eps])
    critic, _ = tiny_critic(data)
    with torch.no_grad():  # a target network that differs from the online one
        for p in critic.target_critic.parameters():
            p.add_(0.1 * torch.randn_like(p))
    st = data.stats()
    sd_o, sd_a = np.maximum(st["obs_std"], 0.01), np.maximum(st["act_std"], 0.01)

    def net_input(obs_row, chunk_rows):
        o = (obs_all[obs_row] - st["obs_mean"]) / sd_o
        a = (act_all[chunk_rows] - st["act_mean"]) / sd_a
        return torch.tensor(np.concatenate([o, a.reshape(-1)]), dtype=torch.float32)[None]

    y_hand = []
    for i, row in enumerate(sorted(hand)):
        ret, boot, disc, chunk_rows, next_rows = hand[row]
        np.testing.assert_allclose(batch["chunk"][i].numpy(), act_all[chunk_rows])
        np.testing.assert_allclose(float(batch["returns"][i]), ret, rtol=1e-6)
        np.testing.assert_allclose(float(batch["discount"][i]), disc, rtol=1e-6)
        qbar = 0.0
        if boot is not None:
            np.testing.assert_allclose(batch["next_chunk"][i].numpy(), act_all[next_rows])
            with torch.no_grad():
                qbar = float(torch.sigmoid(critic.target_critic(net_input(boot, next_rows))).min())
        y_hand.append(ret + disc * qbar)
    y = critic.target(batch)
    np.testing.assert_allclose(y.numpy(), y_hand, rtol=1e-5, atol=1e-6)

    loss, _ = critic.critic_loss(batch)
    with torch.no_grad():
        logits = torch.cat([critic.critic(net_input(r, hand[r][3])) for r in sorted(hand)], dim=1)[..., 0]  # [E, B]
        q = torch.sigmoid(logits).double()
        yt = torch.tensor(y_hand, dtype=torch.float64)
        bce = -(yt * torch.log(q) + (1 - yt) * torch.log(1 - q))
    np.testing.assert_allclose(float(loss.detach()), float(bce.mean(1).sum()), rtol=1e-5)


def test_targets_are_detached_and_only_the_online_critic_learns():
    data = chunk_data_from_episodes(tiny_episodes(), ChunkCriticConfig(horizon=H, gamma=GAMMA), n_stages=2)
    critic, _ = tiny_critic(data)
    critic.target_critic.load_state_dict(critic.critic.state_dict())  # same weights: a leak would add gradient
    batch = data.gather(torch.arange(8))
    assert not critic.target(batch).requires_grad
    loss, _ = critic.critic_loss(batch)
    loss.backward()
    grads = [p.grad.clone() for p in critic.critic.parameters()]
    assert all(p.grad is None for p in critic.target_critic.parameters())
    # the same loss with y as a constant gives the same gradient
    critic.zero_grad(set_to_none=True)
    y = critic.target(batch).clone()
    logits = critic.logits(batch["obs"], batch["chunk"])
    torch.nn.functional.binary_cross_entropy_with_logits(logits, y.expand_as(logits), reduction="none").mean(-1).sum().backward()
    for a, b in zip(grads, (p.grad for p in critic.critic.parameters())):
        torch.testing.assert_close(a, b)
    before = copy.deepcopy(critic.target_critic.state_dict())
    online_before = copy.deepcopy(critic.critic.state_dict())
    critic.update(batch)
    for k, v in critic.target_critic.state_dict().items():  # Polyak: tau toward the online weights of before
        torch.testing.assert_close(v, before[k] + critic.config.tau * (critic.critic.state_dict()[k] - before[k]))
    assert any(not torch.equal(v, online_before[k]) for k, v in critic.critic.state_dict().items())


class KnownCritic:
    """Score = the chunk's first action's first coordinate times the observation's first value."""

    def __init__(self):
        self.calls = []

    def features(self, window):
        return np.asarray(window["obs/x"])[:, -1]

    def score(self, obs, chunks):
        self.calls.append(len(chunks))
        return torch.as_tensor(np.asarray(chunks)[:, 0, 0] * np.asarray(obs)[:, 0])


def test_value_guided_picks_the_argmax_with_one_policy_and_one_critic_call():
    rng = np.random.default_rng(1)
    B, N, To = 3, 5, 2
    window = {"obs/x": rng.standard_normal((B, To, D)).astype(np.float32)}
    window["obs/x"][:, -1, 0] = [1.0, -1.0, 2.0]  # sign flips which chunk is best
    calls = []

    def predict(w):
        calls.append(w)
        return rng.standard_normal((len(w["obs/x"]), 6, A)).astype(np.float32)

    critic = KnownCritic()
    vg = ValueGuided(predict, critic, samples=N)
    out = vg(window)
    assert len(calls) == 1 and len(critic.calls) == 1 and critic.calls[0] == B * N
    np.testing.assert_array_equal(calls[0]["obs/x"], np.repeat(window["obs/x"], N, axis=0))
    assert out.shape == (B, 6, A)
    # regenerate what predict returned
    rng2 = np.random.default_rng(1)
    rng2.standard_normal((B, To, D))
    drawn = rng2.standard_normal((B * N, 6, A)).astype(np.float32).reshape(B, N, 6, A)
    for b, sign in enumerate([1.0, -1.0, 2.0]):
        best = int(np.argmax(drawn[b, :, 0, 0] * sign))
        np.testing.assert_array_equal(out[b], drawn[b, best])
    assert vg.stats()["guided_calls"] == 1


def test_value_guided_with_a_real_critic_keeps_its_best_chunk():
    data = chunk_data_from_episodes(tiny_episodes(), ChunkCriticConfig(horizon=H, gamma=GAMMA), n_stages=2)
    critic, _ = tiny_critic(data)
    critic.eval()
    chunks = np.random.default_rng(2).standard_normal((4, 6, A)).astype(np.float32)
    window = {"obs/x": np.random.default_rng(3).standard_normal((1, 2, D)).astype(np.float32)}
    out = ValueGuided(lambda w: chunks, critic, samples=4)(window)
    q = critic.score(np.repeat(window["obs/x"][:, -1], 4, 0), chunks)
    np.testing.assert_array_equal(out[0], chunks[int(q.argmax())])


def test_save_load_and_mismatch_errors(tmp_path):
    data = chunk_data_from_episodes(tiny_episodes(), ChunkCriticConfig(horizon=H, gamma=GAMMA), n_stages=2)
    critic, _ = tiny_critic(data)
    atomic_save(critic.checkpoint(), tmp_path / "c.pt")
    loaded = ChunkCritic.load(tmp_path / "c.pt")
    batch = data.gather(torch.arange(8))
    torch.testing.assert_close(loaded.score(batch["obs"], batch["chunk"]), critic.score(batch["obs"], batch["chunk"]))
    assert loaded.obs_keys == ["obs/x"] and loaded.config.horizon == H and loaded.task == "pack_cube"
    loaded.check_matches(["obs/x"], H, "pack_cube")
    with pytest.raises(ConfigError, match="trained on obs keys"):
        loaded.check_matches(["obs/qpos"], H, "pack_cube")
    with pytest.raises(ConfigError, match="chunks of 3 actions, the policy executes 8"):
        loaded.check_matches(["obs/x"], 8, "pack_cube")
    with pytest.raises(ConfigError, match="trained on task 'pack_cube'"):
        loaded.check_matches(["obs/x"], H, "insertion")
    with pytest.raises(ConfigError, match="does not exist"):
        ChunkCritic.load(tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="could not be read"):
        ChunkCritic.load(tmp_path / "junk.pt")


# ---------------------------------------------------------------------- the twin: stages and rollouts
@pytest.fixture(scope="module")
def twin_store(tmp_path_factory):
    """Two scripted PackCube episodes (one cut short at 120 steps, unlabelled success), recorded as
    `collect` does, without a stage key; and the stages the twin reported while recording them."""
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.recording import demo_schema, demo_step

    env = BimanualEnv("pack_cube")
    path = tmp_path_factory.mktemp("twin") / "store"
    store = EpisodeStore.create(path, demo_schema(env, [], (240, 320)))
    truth = []
    for seed, limit in ((0, env.max_steps), (1, 120)):
        obs, _ = env.reset(seed=seed)
        meta_extra = {"seed": seed, "init_state": env.sim_state().tolist()}
        expert, steps, stages = env.expert(ExpertNoise()), [], []
        for _ in range(limit):
            prev = obs
            obs, _, terminated, truncated, info = env.step(expert.act())
            steps.append(demo_step(prev, info["executed_action"], []))
            stages.append(int(info["stage"]))
            if terminated or truncated:
                break
        data = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        store.add_episode(data, np.arange(len(steps)) / 50, "SCRIPTED",
                          EpisodeMeta(task="pack_cube", success=bool(info["success"]), extra=meta_extra))
        truth.append(np.array(stages))
    store.close()
    env.close()
    return path, truth


def test_stages_of_a_recorded_episode_match_the_twin(twin_store, tmp_path):
    from robo_rl.sim.critic_data import episode_stages, replay_stages

    path, truth = twin_store
    store = EpisodeStore.open(path)
    stages = episode_stages(store)
    assert [len(s) for s in stages] == [len(t) for t in truth]
    for s, t in zip(stages, truth):
        np.testing.assert_array_equal(s, t)
    assert store.meta(0).success and stages[0][-1] == 5 and stages[0][0] == 0
    assert set(np.unique(stages[0])) == {0, 1, 2, 3, 4, 5}  # every PackCube stage, in one real episode
    # an episode that does not track its recording is refused, not mislabelled
    ep = store.episode(1)
    bad = EpisodeStore.create(tmp_path / "bad", store.schema)
    ep["obs/qpos"][50] += 0.01
    bad.add_episode({k: v for k, v in ep.items() if k in store.schema.keys}, ep["timestamp"], "SCRIPTED", store.meta(1))
    with pytest.raises(ConfigError, match="does not replay in the twin"):
        replay_stages(bad, 0)
    bad.close()
    store.close()


def test_recorded_rollouts_carry_the_stages_the_twin_reported(tmp_path):
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.critic_data import record_rollouts, replay_stages

    def hold(w):  # a "policy" that holds the arms where they are
        q = np.asarray(w["obs/qpos"])[:, -1]
        return np.repeat(q[:, None], 16, axis=1)

    summary = record_rollouts(hold, "pack_cube", ["obs/qpos", "obs/env_state"], 2, 16, ChunkingConfig(), tmp_path / "r",
                              episodes=2, n_envs=2, seed=7, max_steps=30, progress=False)
    assert [e.seed for e in summary.episodes] == [7, 8] and all(e.length == 30 for e in summary.episodes)
    store = EpisodeStore.open(tmp_path / "r")
    assert store.n_episodes == 2 and "stage" in store.data_keys and store.meta(0).extra["seed"] in (7, 8)
    for e in range(2):
        np.testing.assert_array_equal(replay_stages(store, e), store.episode(e, ["stage"])["stage"])
    store.close()


# ---------------------------------------------------------------------- the command
def _one_line(code, err, needle):
    """A user error: non-zero exit, and one line on stderr naming it (no traceback)."""
    assert code != 0
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and needle in lines[0], err


@pytest.fixture(scope="module")
def critic_run(twin_store, tmp_path_factory):
    """`robo-rl critic` on the twin store, as a user runs it (a subprocess)."""
    path, _ = twin_store
    run = tmp_path_factory.mktemp("critic") / "run"
    r = robo_rl_cli("critic", f"dataset=[{path}]", "task=pack_cube", "obs_keys=[obs/qpos,obs/env_state]", "horizon=8",
                    "reward=stage", "steps=30", "batch_size=16", "hidden=[16,16]", "heldout_fraction=0.5",
                    "log_every=10", "heldout_every=10", "threads=1", f"run_dir={run}")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return run


def test_critic_command_trains_and_saves(critic_run):
    for name in ("critic.pt", "config.yaml", "results.json", "metrics.jsonl"):
        assert (critic_run / name).is_file(), name
    critic = ChunkCritic.load(critic_run / "critic.pt")
    assert critic.obs_keys == ["obs/qpos", "obs/env_state"] and critic.config.horizon == 8 and critic.updates == 30
    assert critic.n_stages == 5 and critic.task == "pack_cube" and critic.config.reward == "stage"


def test_critic_command_refuses_bad_input_in_one_line(twin_store, critic_run, tmp_path, capsys):
    path, _ = twin_store
    _one_line(*_in_process(capsys, "critic", f"dataset=[{tmp_path / 'nope'}]", f"run_dir={tmp_path / 'r'}"),
              "no such store")
    _one_line(*_in_process(capsys, "critic", f"dataset=[{path}]", "obs_keys=[obs/qpos,obs/nope]", f"run_dir={tmp_path / 'r'}"),
              "has no key(s) ['obs/nope']")
    _one_line(*_in_process(capsys, "critic", f"dataset=[{path}]", "reward=dense", f"run_dir={tmp_path / 'r'}"),
              "reward='dense'")
    _one_line(*_in_process(capsys, "critic", f"dataset=[{path}]", "task=insertion", f"run_dir={tmp_path / 'r'}"),
              "task=insertion, but the stores hold episodes of ['pack_cube']")
    _one_line(*_in_process(capsys, "critic", f"dataset=[{path}]", f"run_dir={critic_run}"), "already holds a critic")


def tiny_policy_checkpoint(path, obs_keys, task):
    """A checkpoint in the Learner's layout for an untrained tiny flow policy (no training needed)."""
    from robo_rl.policies import make_policy, policy_spec
    from robo_rl.policies.config import ObsShapes

    shapes = ObsShapes({k: {"obs/qpos": 14, "obs/env_state": 22}[k] for k in obs_keys}, {}, 14)
    policy = make_policy("flow", {"dit_dim": 16, "dit_depth": 1, "dit_heads": 2, "obs_dim": 16}, shapes)
    torch.save({"policy": policy_spec(policy), "model": policy.state_dict(), "ema": None, "task": task,
                "obs_keys": list(obs_keys), "chunking": {"n_action_steps": 8}, "step": 0}, path)
    return path


def test_eval_and_deploy_refuse_a_critic_made_for_another_policy(critic_run, tmp_path, capsys):
    critic = critic_run / "critic.pt"
    qpos_only = tiny_policy_checkpoint(tmp_path / "qpos.pt", ["obs/qpos"], "pack_cube")
    other_task = tiny_policy_checkpoint(tmp_path / "tc.pt", ["obs/qpos", "obs/env_state"], "transfer_cube")
    same = tiny_policy_checkpoint(tmp_path / "pc.pt", ["obs/qpos", "obs/env_state"], "pack_cube")
    _one_line(*_in_process(capsys, "eval", f"checkpoint={qpos_only}", f"critic={critic}", f"out={tmp_path / 'e'}"),
              "critic was trained on obs keys ['obs/qpos', 'obs/env_state'], the policy reads ['obs/qpos']")
    _one_line(*_in_process(capsys, "eval", f"checkpoint={same}", f"critic={critic}", "chunking.n_action_steps=4",
                           f"out={tmp_path / 'e'}"), "critic scores chunks of 8 actions, the policy executes 4")
    _one_line(*_in_process(capsys, "deploy", f"checkpoint={other_task}", f"critic={critic}"),
              "critic was trained on task 'pack_cube', the policy runs 'transfer_cube'")
    _one_line(*_in_process(capsys, "deploy", f"checkpoint={same}", f"critic={tmp_path / 'none.pt'}"), "does not exist")


def test_eval_with_a_critic_runs_value_guided(critic_run, tmp_path, capsys):
    import json

    same = tiny_policy_checkpoint(tmp_path / "pc.pt", ["obs/qpos", "obs/env_state"], "pack_cube")
    code, err = _in_process(capsys, "eval", f"checkpoint={same}", f"critic={critic_run / 'critic.pt'}", "critic_samples=3",
                            "episodes=2", "n_envs=2", "max_steps=16", "videos=0", f"out={tmp_path / 'e'}", "threads=1")
    assert code == 0, err
    result = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert result["critic_samples"] == 3 and result["guided_calls"] == 2  # 16 steps, 8 per chunk, both envs in one call
