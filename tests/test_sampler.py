"""Windows, pads, weights, splits, DataLoader workers and the device path."""

import numpy as np
import pytest
import torch

from robo_rl.data.sampler import WindowSampler, segment_weight_table, split_episodes, window_loader
from robo_rl.data.schema import Segment
from robo_rl.errors import ConfigError


def naive_window(store, ep, t, obs_keys, n_obs, horizon, data=None):
    """Reference: slice one window out of one episode with edge padding, step by step. `data`:
    the episode as `store.episode(ep)` reads it, when the caller has it already."""
    data = store.episode(ep) if data is None else data
    T = len(data["action"])
    out = {}
    for k in obs_keys:
        out[k] = np.stack([data[k][max(j, 0)] for j in range(t - n_obs + 1, t + 1)])
    out["action"] = np.stack([data["action"][min(j, T - 1)] for j in range(t, t + horizon)])
    out["obs_is_pad"] = np.array([j < 0 for j in range(t - n_obs + 1, t + 1)])
    out["action_is_pad"] = np.array([j >= T for j in range(t, t + horizon)])
    out["action_is_cut"] = out["action_is_pad"] & (store.meta(ep).success is False)
    return out


def test_every_window_matches_the_reference(filled_store):
    keys = ["obs/qpos", "obs/images/top"]
    eps = [1, 2, 4]
    s = WindowSampler(filled_store, keys, n_obs=3, horizon=8, episodes=eps)
    assert len(s) == sum(filled_store.episode_lengths[eps])
    batch = s.get(np.arange(len(s)))
    i = 0
    for ep in eps:
        data = filled_store.episode(ep)  # read once per episode, not once per window
        for t in range(filled_store.episode_lengths[ep]):
            ref = naive_window(filled_store, ep, t, keys, 3, 8, data)
            for k, v in ref.items():
                assert np.array_equal(batch[k][i], v), (ep, t, k)
            assert batch["episode"][i] == ep
            i += 1


def test_padding_past_a_cut_episode_is_flagged_and_not_learned(tmp_path, schema):
    """An episode that ended without success (a RaC intervention stopped after its correction)
    has no known future: its padded actions are flagged, and the loss gives them no weight,
    while padding past a finished episode ("hold still once done") still trains."""
    from dataclasses import replace

    from episodes import make_episode

    from robo_rl.data.store import EpisodeStore

    store = EpisodeStore.create(tmp_path / "s", schema)
    for e, success in enumerate([True, False, None]):
        data, ts, seg, meta = make_episode(e, schema)
        store.add_episode(data, ts, seg, replace(meta, success=success))
    s = WindowSampler(store, ["obs/qpos"], n_obs=1, horizon=8)
    b = s.get(np.arange(len(s)))
    for ep in range(3):
        rows = b["episode"] == ep
        assert b["action_is_pad"][rows].any()
        assert b["action_is_cut"][rows].any() == (ep == 1)
        assert not (b["action_is_cut"] & ~b["action_is_pad"]).any()

    from robo_rl.policies.body import ChunkBody

    class Cfg:
        mask_padded_actions = False
    err = torch.ones(4, 8, 2)
    err[:, 4:] = 10.0  # large errors on the last four steps
    pad = torch.zeros(4, 8, dtype=torch.bool)
    pad[:, 4:] = True
    body = type("B", (), {"cfg": Cfg(), "action_weights": torch.ones(2)})()  # every action dimension weighted 1
    held = ChunkBody.per_sample_loss(body, err, {"action_is_pad": pad, "action_is_cut": torch.zeros_like(pad)})
    cut = ChunkBody.per_sample_loss(body, err, {"action_is_pad": pad, "action_is_cut": pad})
    assert torch.allclose(held, torch.full((4,), 50.5)) and torch.allclose(cut, torch.ones(4))
    store.close()


def test_segment_weights_and_weighted_sampling(filled_store):
    s = WindowSampler(filled_store, ["obs/qpos"], segment_weights={"RECOVERY": 3.0, "policy": 0.0})
    seg = s.data["segment"]
    assert np.array_equal(s.weights, np.where(seg == Segment.RECOVERY, 3.0, np.where(seg == Segment.POLICY, 0.0, 1.0)))
    b = s.sample(4000, np.random.default_rng(0), weighted=True)
    assert not (b["segment"] == Segment.POLICY).any()
    share = (b["segment"] == Segment.RECOVERY).mean()
    expected = s.weights[seg == Segment.RECOVERY].sum() / s.weights.sum()
    assert abs(share - expected) < 0.05
    with pytest.raises(ConfigError):
        segment_weight_table({"TELEOP": -1})


def test_split_by_episode_is_disjoint_and_seeded():
    tr, va = split_episodes(50, 0.2, seed=3)
    assert len(va) == 10 and not set(tr) & set(va) and sorted(tr + va) == list(range(50))
    assert (tr, va) == split_episodes(50, 0.2, seed=3)
    assert split_episodes(50, 0.2, seed=4) != (tr, va)
    assert len(split_episodes(3, 0.1)[1]) == 1


def test_device_path_equals_numpy_path(filled_store):
    cpu = WindowSampler(filled_store, ["obs/qpos", "obs/gripper"])
    dev = WindowSampler(filled_store, ["obs/qpos", "obs/gripper"], device="cpu")
    idx = np.random.default_rng(0).integers(0, len(cpu), 100)
    a, b = cpu.get(idx), dev.get(torch.as_tensor(idx))
    for k in a:
        assert np.array_equal(a[k], b[k].numpy()), k
    g = torch.Generator().manual_seed(0)
    batch = dev.sample(32, g, weighted=True)
    assert batch["action"].shape == (32, 16, 14)
    # weighted draws on the device: a zero weight is never drawn, and a reweight takes effect at once
    masked = WindowSampler(filled_store, ["obs/qpos"], segment_weights={"policy": 0.0}, device="cpu")
    assert not (masked.sample(2000, g, weighted=True)["segment"] == Segment.POLICY).any()
    only_recovery = (masked.data["segment"] == Segment.RECOVERY).astype(np.float32)
    masked.reweight(only_recovery)
    assert (masked.sample(500, g, weighted=True)["segment"] == Segment.RECOVERY).all()


def test_dataloader_with_workers_matches_direct_gathers(filled_store):
    s = WindowSampler(filled_store, ["obs/qpos", "obs/images/wrist"])
    seen = 0
    for batch in window_loader(s, batch_size=16, num_workers=2, num_batches=5, seed=1):
        assert batch["obs/images/wrist"].shape == (16, 2, 24, 32, 3)
        assert batch["action"].dtype == torch.float32
        # each window a worker returns is exactly the window the sampler gives for its index
        direct = s.get(batch["index"].numpy())
        for k, v in direct.items():
            assert np.array_equal(batch[k].numpy(), v), k
        seen += 1
    assert seen == 5
    # same seed, same batches, with or without workers
    a = [b["action"] for b in window_loader(s, 16, num_workers=0, num_batches=3, seed=7)]
    b = [b["action"] for b in window_loader(s, 16, num_workers=2, num_batches=3, seed=7)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bad_sampler_config(filled_store):
    with pytest.raises(ConfigError, match="no key 'obs/nope'"):
        WindowSampler(filled_store, ["obs/nope"])
    with pytest.raises(ConfigError, match="GiB"):
        WindowSampler(filled_store, ["obs/images/top"], max_memory_gb=1e-6)
