"""OGBench datasets made locally with OGBench's own oracles: the files load through ogbench's
loader for goal-conditioned, single-task and oracle-rep names; same seed, same arrays; the CLI."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import robo_rl_cli

pytest.importorskip("ogbench")

from robo_rl.errors import RoboRLError  # noqa: E402
from robo_rl.sim.ogbench import dataset_name, evaluate, generate_dataset, make_env_and_datasets  # noqa: E402

EPISODES, STEPS = 2, 60


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("ogbench") / "cube-single-play-v0.npz"
    summary = generate_dataset("cube-single-v0", out, EPISODES, steps_per_episode=STEPS, seed=3, progress=False)
    return out, summary


def test_files_layout_and_dtypes(tiny):
    out, s = tiny
    assert s["train_path"] == str(out) and s["val_path"] == str(out).replace(".npz", "-val.npz")
    assert (s["train_transitions"], s["val_transitions"]) == (EPISODES * STEPS, STEPS)
    assert s["targets"] >= EPISODES + 1 and 0 <= s["targets_reached"] <= s["targets"]
    with np.load(out) as f:
        assert set(f.files) == {"observations", "actions", "terminals", "qpos", "qvel"}  # no buttons in cube envs
        n = EPISODES * STEPS
        assert f["observations"].shape == (n, 28) and f["observations"].dtype == np.float32
        assert f["actions"].shape == (n, 5) and f["actions"].dtype == np.float32
        assert np.abs(f["actions"]).max() <= 1.0
        assert f["terminals"].dtype == bool
        assert np.flatnonzero(f["terminals"]).tolist() == [STEPS - 1, 2 * STEPS - 1]
        assert f["qpos"].dtype == np.float32 and f["qpos"].shape[0] == n
        assert f["qvel"].dtype == np.float32 and f["qvel"].shape[0] == n
    assert not list(out.parent.glob(".*.tmp"))  # written atomically, nothing left behind


@pytest.mark.parametrize("name", ["cube-single-play-v0", "cube-single-play-singletask-task2-v0",
                                  "cube-single-play-oraclerep-v0"])
def test_loads_through_ogbench(tiny, name, tmp_path):
    out, _ = tiny
    env, train, val = make_env_and_datasets(name, out)
    alone = tmp_path / Path(out).name  # the training file without its -val.npz: loads the same
    shutil.copy(out, alone)
    env_alone, train_alone, val_alone = make_env_and_datasets(name, alone)
    env_alone.close()
    assert val_alone is None and sorted(train_alone) == sorted(train)
    for key in train:
        np.testing.assert_array_equal(train_alone[key], train[key], err_msg=key)
    try:
        # ogbench's regular layout drops each episode's last observation (it has no next one)
        assert train["observations"].shape == (EPISODES * (STEPS - 1), 28)
        assert val["observations"].shape == (STEPS - 1, 28)
        assert train["next_observations"].shape == train["observations"].shape
        np.testing.assert_array_equal(train["next_observations"][:STEPS - 2], train["observations"][1:STEPS - 1])
        if "singletask" in name:
            assert train["rewards"].shape == (EPISODES * (STEPS - 1),)
            assert set(np.unique(train["rewards"])) <= {-1.0, 0.0}  # cube-single: successes - 1
            assert "masks" in train and env.unwrapped._reward_task_id == 2
        if "oraclerep" in name:
            assert train["oracle_reps"].shape == (EPISODES * (STEPS - 1), 3)  # one cube's xyz
    finally:
        env.close()


def test_same_seed_same_arrays(tiny, tmp_path):
    out, _ = tiny
    again = generate_dataset("cube-single-v0", tmp_path / "again.npz", EPISODES, steps_per_episode=STEPS, seed=3,
                             progress=False)
    other = generate_dataset("cube-single-v0", tmp_path / "other", EPISODES, steps_per_episode=STEPS, seed=4,
                             progress=False)
    assert other["train_path"] == str(tmp_path / "other.npz")
    with np.load(out) as a, np.load(again["train_path"]) as b, np.load(other["train_path"]) as c:
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert not np.array_equal(a["observations"], c["observations"])


def test_bad_arguments():
    with pytest.raises(RoboRLError, match="not an OGBench"):
        generate_dataset("cube-sngle-v0", "/nonexistent/x.npz", 1)
    with pytest.raises(RoboRLError, match="dataset_type"):
        generate_dataset("cube-single-v0", "/nonexistent/x.npz", 1, dataset_type="expert")
    with pytest.raises(RoboRLError, match="episodes"):
        generate_dataset("cube-single-v0", "/nonexistent/x.npz", 0)
    with pytest.raises(RoboRLError, match="no such dataset"):
        make_env_and_datasets("cube-single-play-v0", "/nonexistent/x.npz")
    assert dataset_name("cube-double-v0", "noisy") == "cube-double-noisy-v0"
    assert dataset_name("puzzle-3x3-v0", "play") == "puzzle-3x3-play-v0"


def test_noisy_type(tmp_path):
    s = generate_dataset("cube-single-v0", tmp_path / "n.npz", 1, dataset_type="noisy", steps_per_episode=40,
                         progress=False)
    with np.load(s["train_path"]) as f:
        assert f["actions"].shape == (40, 5) and np.abs(f["actions"]).max() <= 1.0


def test_evaluate_goal_conditioned_and_single_task(tiny):
    out, _ = tiny
    zero = lambda obs, goal: np.zeros(5)  # noqa: E731
    env, _, _ = make_env_and_datasets("cube-single-play-v0", out)
    try:
        goals = []
        r = evaluate(env, lambda o, g: goals.append(g) or np.zeros(5), episodes=2, seed=0, progress=False)
        assert r["goal_conditioned"] and r["episodes"] == 2 and set(r["per_task"]) == {1, 2}
        assert goals[0].shape == (28,) and r["mean_episode_length"] == 200  # cube-single's time limit
        assert 0.0 <= r["success_rate"] <= 1.0
    finally:
        env.close()
    env, _, _ = make_env_and_datasets("cube-single-play-singletask-task2-v0", out)
    try:
        r = evaluate(env, zero, episodes=1, seed=0, progress=False)
        assert not r["goal_conditioned"] and r["episodes"] == 1 and list(r["per_task"]) == [2]
    finally:
        env.close()


def test_cli_writes_dataset_config_and_table(tmp_path):
    out = tmp_path / "d" / "cs.npz"
    r = robo_rl_cli("ogbench-data", "episodes=1", "steps=30", "seed=1", f"out={out}")
    assert r.returncode == 0, r.stderr
    assert out.is_file() and (tmp_path / "d" / "cs-val.npz").is_file()
    assert "steps: 30" in (tmp_path / "d" / "cs.yaml").read_text()
    assert "cube-single-play-v0" in r.stdout and "targets reached" in r.stdout


def test_cli_bad_env_is_one_line():
    r = robo_rl_cli("ogbench-data", "env=cube-sngle-v0", "episodes=1")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("INFO ")]
    assert len(lines) == 1 and lines[0].startswith("error: env='cube-sngle-v0'"), r.stderr
    assert "Traceback" not in r.stderr
