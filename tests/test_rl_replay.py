"""Offline-RL data: n-step returns and transitions by hand, a real EpisodeStore on disk, OGBench
.npz import, and the device replay's sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.data.store import EpisodeStore
from robo_rl.errors import RoboRLError
from robo_rl.rl.replay import (DeviceReplay, load_ogbench_npz, nstep_returns, trajectory_bounds,
                               transitions_from_arrays, transitions_from_store)
from tests.episodes import make_episode, small_schema


def test_trajectory_bounds():
    starts, ends = trajectory_bounds(np.array([0, 0, 1, 0, 1, 0, 0]))
    assert starts.tolist() == [0, 0, 0, 3, 3, 5, 5]
    assert ends.tolist() == [2, 2, 2, 4, 4, 6, 6]  # an unterminated tail is a trajectory too


def test_nstep_returns_by_hand():
    # trajectory A: rows 0..4, ends without a terminal; trajectory B: rows 5..7, row 7 terminal (mask 0)
    rewards = np.array([1, 2, 3, 4, 5, 10, 20, 30], float)
    masks = np.array([1, 1, 1, 1, 1, 1, 1, 0], float)
    _, ends = trajectory_bounds(np.array([0, 0, 0, 0, 1, 0, 0, 1]))
    g = 0.5
    ret, boot, disc = nstep_returns(rewards, masks, ends, n=3, gamma=g)
    # row 0: 1 + .5*2 + .25*3, bootstrap from row 3 with .125
    assert ret[0] == pytest.approx(1 + g * 2 + g * g * 3) and boot[0] == 3 and disc[0] == pytest.approx(g ** 3)
    # row 2: rows 2, 3 only (row 4 is the last row and not terminal: no next obs), bootstrap row 4
    assert ret[2] == pytest.approx(3 + g * 4) and boot[2] == 4 and disc[2] == pytest.approx(g ** 2)
    # row 3: one step, bootstrap from the trajectory's last row
    assert ret[3] == pytest.approx(4) and boot[3] == 4 and disc[3] == pytest.approx(g)
    # row 5: 10 + .5*20 + .25*30 and row 7 is terminal: no bootstrap
    assert ret[5] == pytest.approx(10 + g * 20 + g * g * 30) and disc[5] == 0
    # row 7: terminal itself
    assert ret[7] == pytest.approx(30) and disc[7] == 0
    # n = 1 is the plain one-step target
    ret1, boot1, disc1 = nstep_returns(rewards, masks, ends, n=1, gamma=g)
    assert ret1.tolist() == rewards.tolist() and boot1[:4].tolist() == [1, 2, 3, 4] and disc1[7] == 0


def test_transitions_drop_unbootstrappable_last_rows():
    obs = np.arange(6, dtype=np.float32)[:, None]
    out = transitions_from_arrays(obs, obs * 10, np.array([0, 0, 1, 0, 0, 1]), rewards=np.arange(6),
                                  masks=np.array([1, 1, 1, 1, 1, 0]))
    # row 2 ends trajectory 1 without a terminal: dropped; row 5 is terminal: kept (bootstrap unused)
    assert out["observations"][:, 0].tolist() == [0, 1, 3, 4, 5]
    assert out["next_observations"][:, 0].tolist() == [1, 2, 4, 5, 5]
    assert out["rewards"].tolist() == [0, 1, 3, 4, 5] and out["masks"].tolist() == [1, 1, 1, 1, 0]
    with pytest.raises(RoboRLError, match="actions"):
        transitions_from_arrays(obs, obs[:3], np.zeros(6))


def test_transitions_from_a_real_store(tmp_path):
    schema = small_schema(cameras=False)
    store = EpisodeStore.create(tmp_path / "s", schema)
    lengths, successes = [], []
    for e in range(4):
        data, ts, seg, meta = make_episode(e, schema)
        store.add_episode(data, ts, seg, meta)
        lengths.append(len(ts))
        successes.append(meta.success)
    store.close()
    store = EpisodeStore.open(tmp_path / "s")
    tr = transitions_from_store(store, obs_keys=("obs/qpos", "obs/gripper"))
    assert tr["observations"].shape[1] == 16
    # failed episodes (odd e are successes) lose their last row; successful ones keep it as terminal
    expected_rows = sum(n if ok else n - 1 for n, ok in zip(lengths, successes))
    assert len(tr["observations"]) == expected_rows
    assert tr["rewards"].sum() == sum(successes) and (tr["masks"] == 0).sum() == sum(successes)
    assert set(np.unique(tr["segments"])) <= {0, 1, 2, 3, 4}
    # stage rewards: each stage gained pays 1 / number of stages
    stages = [np.minimum(np.arange(n) // 10, 2) for n in lengths]
    tr2 = transitions_from_store(store, obs_keys=("obs/qpos",), reward="stage", stages=stages)
    # (a failed episode's last row is dropped, and with it the stage it gained there, if any)
    expected = sum((s[-1] - s[0]) - (0 if ok else s[-1] - s[-2]) for s, ok in zip(stages, successes)) / 2
    assert tr2["rewards"].sum() == pytest.approx(expected)
    assert set(np.unique(tr2["rewards"])) <= {0.0, 0.5}
    with pytest.raises(RoboRLError, match="obs/nothing"):
        transitions_from_store(store, obs_keys=("obs/nothing",))
    with pytest.raises(RoboRLError, match="stages"):
        transitions_from_store(store, reward="stage")


def test_ogbench_npz_import(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, observations=np.zeros((5, 3), np.float32), actions=np.zeros((5, 2), np.float32),
             terminals=np.array([0, 0, 1, 0, 1], bool), qpos=np.zeros((5, 4)))
    d = load_ogbench_npz(path)
    assert set(d) == {"observations", "actions", "terminals", "qpos"}
    np.savez(tmp_path / "bad.npz", observations=np.zeros((5, 3)))
    with pytest.raises(RoboRLError, match="no 'actions'"):
        load_ogbench_npz(tmp_path / "bad.npz")
    with pytest.raises(RoboRLError, match="does not exist"):
        load_ogbench_npz(tmp_path / "missing.npz")
    (tmp_path / "torn.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(RoboRLError, match="cannot be read"):
        load_ogbench_npz(tmp_path / "torn.npz")


def test_device_replay_sampling_is_seeded_bounded_and_appendable():
    arrays = {"observations": np.arange(100, dtype=np.float32)[:, None], "rewards": np.arange(100, dtype=np.float64)}
    a, b = DeviceReplay(arrays, seed=3), DeviceReplay(arrays, seed=3)
    x, y = a.sample(64), b.sample(64)
    assert torch.equal(x["observations"], y["observations"])
    assert x["rewards"].dtype == torch.float32  # float64 arrives as float32
    torch.testing.assert_close(x["observations"][:, 0], x["rewards"])  # rows stay aligned across keys
    assert 0 <= float(x["rewards"].min()) and float(x["rewards"].max()) < 100
    a.reserve(2)
    a.add({"observations": [100.0], "rewards": 100.0})
    assert len(a) == 101 and float(a.data["observations"][100, 0]) == 100.0
    a.add({"observations": [101.0], "rewards": 101.0})
    with pytest.raises(RoboRLError, match="full"):
        a.add({"observations": [102.0], "rewards": 102.0})
    seen = torch.cat([a.sample(512)["rewards"] for _ in range(8)])
    assert float(seen.max()) >= 100  # appended rows are sampled
    with pytest.raises(RoboRLError, match="disagree"):
        DeviceReplay({"a": np.zeros(3), "b": np.zeros(4)})


def test_offline_loop_flags_td_overfitting_and_survives_a_diverged_critic(tmp_path):
    """The loop's held-out check: training TD error falls while held-out rises -> flagged once in
    results.json; a NaN measurement is logged, not fatal."""
    from robo_rl.learn.offline import OfflineConfig, OfflineLoop

    class Scripted(torch.nn.Module):
        """An 'agent' whose TD errors follow a script: train falls, held-out rises."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.updates, self.calls = 0, 0

        def update(self, batch):
            self.updates += 1
            return {"critic/loss": torch.tensor(1.0)}

        def td_errors(self, batch):
            self.calls += 1
            k = self.updates
            if k == 7 and batch["held"][0]:
                return torch.tensor([float("nan")])
            return torch.tensor([2.0 + 0.1 * k if batch["held"][0] else 2.0 / k])

    agent = Scripted()
    loop = OfflineLoop(agent, OfflineConfig(steps=40, batch_size=2, log_every=3, heldout_every=1, checkpoint_every=0),
                       tmp_path, sample=lambda n: {"held": torch.zeros(n, dtype=torch.bool)},
                       heldout=lambda n: {"held": torch.ones(n, dtype=torch.bool)}, progress=False)
    result = loop.fit()
    assert result["updates"] == 40 and result["td_overfitting"] is True
    assert [r["step"] for r in result["td_history"]] == list(range(1, 41))  # every heldout_every, not every log_every
    # a resumed loop carries the detector's state on (it does not restart its window)
    again = OfflineLoop(Scripted(), OfflineConfig(steps=40, batch_size=2), tmp_path, sample=lambda n: {}, progress=False)
    again.load(tmp_path / "checkpoints" / "last.pt")
    assert again.overfit_warned and len(again.overfit.steps) == 39 and again.overfit.overfitting()
    assert any(r["heldout_td_error"] != r["heldout_td_error"] for r in result["td_history"])  # the NaN is kept
    assert (tmp_path / "checkpoints" / "last.pt").is_file() and (tmp_path / "results.json").is_file()


def test_offline_loop_resume_restores_the_optimizer_and_continues_the_same_stream(tmp_path):
    """Two runs: 6 updates straight, or 3 + resume + 3, each evaluating every 3 updates with draws
    from the replay's generator (as acting does). Same weights at the end (Adam moments, update
    count and the replay's RNG all come back, after the evaluation's draws)."""
    from robo_rl.learn.offline import OfflineConfig, OfflineLoop
    from robo_rl.rl.fql import FQL, FQLConfig

    rng = np.random.default_rng(0)
    arrays = {"observations": rng.standard_normal((200, 3), np.float32), "actions": rng.uniform(-1, 1, (200, 2)).astype(np.float32),
              "next_observations": rng.standard_normal((200, 3), np.float32), "rewards": -np.ones(200, np.float32),
              "masks": np.ones(200, np.float32)}

    def run(steps, run_dir, resume=False):
        torch.manual_seed(0)
        replay = DeviceReplay(arrays, seed=1)
        agent = FQL(3, 2, FQLConfig(hidden=(16, 16)), seed=0)
        agent.generator = replay.generator
        evaluate = lambda step: {"draw": float(torch.rand(1, generator=replay.generator))}  # noqa: E731
        loop = OfflineLoop(agent, OfflineConfig(steps=steps, batch_size=8, log_every=3, heldout_every=0, checkpoint_every=0,
                                                eval_every=3),
                           run_dir, replay.sample, evaluate=evaluate, progress=False, generator=replay.generator)
        if resume:
            loop.load(run_dir / "checkpoints" / "last.pt")
        loop.fit()
        return agent

    straight = run(6, tmp_path / "a")
    run(3, tmp_path / "b")
    resumed = run(6, tmp_path / "b", resume=True)
    assert resumed.updates == 6
    for p, q in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q)
