"""Every bad input is a RoboRLError naming what and where, and committed data is untouched."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from episodes import assert_episode_equal, make_episode

from robo_rl.data.recorder import Recorder
from robo_rl.data.schema import Schema
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import RoboRLError, SchemaError, StoreError


def _step(schema, e=7, j=0):
    data, ts, seg, _ = make_episode(e, schema)
    return {k: v[j].copy() for k, v in data.items()}, float(ts[j])


BAD_STEPS = [
    ("unknown key", lambda s: {**s, "obs/extra": np.zeros(3)}, r"unknown \['obs/extra'\]"),
    ("missing key", lambda s: {k: v for k, v in s.items() if k != "action"}, r"missing \['action'\]"),
    ("wrong shape", lambda s: {**s, "obs/qpos": np.zeros(13, np.float32)}, r"'obs/qpos' has shape \(13,\), expected \(14,\)"),
    ("wrong dtype", lambda s: {**s, "obs/images/top": s["obs/images/top"].astype(np.float32)}, r"'obs/images/top' has dtype float32, expected uint8"),
    ("NaN", lambda s: {**s, "action": np.full(14, np.nan, np.float32)}, r"'action' holds NaN or inf at index \(0,\)"),
    ("inf", lambda s: {**s, "obs/gripper": np.array([0.0, np.inf])}, r"'obs/gripper' holds NaN or inf at index \(1,\)"),
    # already of the schema's dtype: the check's fast path (one sum) must catch it too
    ("-inf float32", lambda s: {**s, "obs/qpos": np.r_[np.zeros(13), -np.inf].astype(np.float32)},
     r"'obs/qpos' holds NaN or inf at index \(13,\)"),
]


@pytest.mark.filterwarnings("ignore:overflow encountered in reduce")  # the one-sum check's overflow, then the exact test
def test_large_finite_values_whose_sum_overflows_are_accepted(filled_store):
    step, ts = _step(filled_store.schema)
    big = np.full(14, np.finfo(np.float32).max, np.float32)  # the sum is inf; every value is finite
    w = filled_store.begin_episode()
    w.add({**step, "obs/qpos": big}, ts)
    w.commit()
    assert np.array_equal(filled_store.read("obs/qpos", filled_store.n_steps - 1)[0], big)


@pytest.mark.parametrize("name,mutate,pattern", BAD_STEPS, ids=[b[0] for b in BAD_STEPS])
def test_bad_step_is_refused_with_key_episode_and_step(filled_store, name, mutate, pattern):
    before = {k: filled_store.read(k) for k in filled_store.data_keys}
    step, ts = _step(filled_store.schema)
    w = filled_store.begin_episode()
    w.add(step, ts)
    with pytest.raises(SchemaError, match=pattern) as err:
        w.add(mutate(step), ts + 0.02)
    assert "episode 6 step 1" in str(err.value)
    w.discard()
    for k, v in before.items():
        assert np.array_equal(filled_store.read(k), v)
    for i in range(6):
        assert_episode_equal(filled_store, i, i)


def test_timestamps_going_backwards_are_refused(filled_store):
    step, ts = _step(filled_store.schema)
    w = filled_store.begin_episode()
    w.add(step, ts)
    with pytest.raises(SchemaError, match=r"episode 6 step 1: timestamp .* goes backwards"):
        w.add(step, ts - 0.5)
    data, tss, seg, _ = make_episode(7, filled_store.schema)
    tss = tss.copy()
    tss[5] = tss[3]
    w.discard()
    with pytest.raises(SchemaError, match=r"episode 6 step 5: timestamp .* goes backwards"):
        filled_store.add_episode(data, tss, seg)
    assert filled_store.n_episodes == 6 and filled_store.validate() == []


def test_bad_blocks_are_refused(filled_store):
    data, ts, seg, _ = make_episode(7, filled_store.schema)
    with pytest.raises(SchemaError, match="different lengths"):
        filled_store.add_episode(data, ts[:-1], seg)
    bad = dict(data, action=data["action"][:, :10])
    with pytest.raises(SchemaError, match=r"'action' has shape \(\d+, 10\), expected \(T, 14\)"):
        filled_store.add_episode(bad, ts, seg)
    with pytest.raises(SchemaError, match="unknown segment label 'retry'"):
        filled_store.add_episode(data, ts, "retry")
    assert filled_store.n_episodes == 6


def test_recorder_refuses_bad_steps_in_the_callers_thread(tmp_path, schema):
    rec = Recorder(tmp_path / "r", schema)
    try:
        step, ts = _step(schema)
        rec.start_episode()
        rec.add_step(step, ts)
        with pytest.raises(SchemaError, match=r"episode 0 step 1: key 'obs/qpos' has shape"):
            rec.add_step({**step, "obs/qpos": np.zeros(3)}, ts + 0.02)
        with pytest.raises(SchemaError, match="goes backwards"):
            rec.add_step(step, ts - 1)
        rec.add_step(step, ts + 0.02)
        rec.end_episode(success=True)
    finally:
        rec.close()
    with EpisodeStore.open(tmp_path / "r") as s:
        assert s.n_episodes == 1 and s.n_steps == 2 and s.validate() == []


def test_not_a_store_and_newer_schema(tmp_path, filled_store):
    with pytest.raises(StoreError, match="no such store"):
        EpisodeStore.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "file.txt").write_text("hi")
    with pytest.raises(StoreError, match=r"not a robo_rl store \(no zarr.json\)"):
        EpisodeStore.open(tmp_path / "plain")
    with pytest.raises(StoreError, match="already exists"):
        EpisodeStore.create(tmp_path / "plain", filled_store.schema)
    assert (tmp_path / "plain" / "file.txt").read_text() == "hi"  # nothing touched
    root = Path(filled_store.location)
    filled_store.close()
    meta = json.loads((root / "zarr.json").read_text())
    meta["attributes"]["robo_rl"]["schema_version"] = 99
    (root / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="schema version 99, this robo_rl reads up to 1; upgrade robo_rl"):
        EpisodeStore.open(root)


def test_schema_definition_errors():
    with pytest.raises(SchemaError, match="images are uint8"):
        Schema.build({"obs/images/top": ((64, 64, 3), "float32")}, fps=50)
    with pytest.raises(SchemaError, match="reserved"):
        Schema.build({"timestamp": ((1,), "float64")}, fps=50)
    with pytest.raises(SchemaError, match="not like"):
        Schema.build({"obs/qpos": "14 floats"}, fps=50)
    with pytest.raises(SchemaError, match="fps must be positive"):
        Schema.build({"obs/qpos": "(14,) float32"}, fps=0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True)


def test_cli_prints_one_line_no_traceback(tmp_path, filled_store):
    for args, needle in [
        (("dataset", "info", str(tmp_path / "nope")), "no such store"),
        (("dataset", "info", str(tmp_path)), "not a robo_rl store"),
        (("dataset", "merge", filled_store.location), "give out=PATH"),
        (("dataset", "frobnicate", "x"), "unknown dataset op"),
        (("flyaway",), "unknown verb"),
        (("collect", "task=insertion", "grasp_along=[0.02,0.01]", f"out={tmp_path / 'g'}"), "grasp_along=[0.02, 0.01]"),
    ]:
        r = _cli(*args)
        assert r.returncode != 0, args
        assert "Traceback" not in r.stderr, r.stderr
        lines = [line for line in r.stderr.strip().splitlines() if line]
        assert len(lines) == 1 and needle in lines[0], (args, r.stderr)
    assert not (tmp_path / "g").exists()


def test_roboerror_is_the_base_of_every_user_error():
    assert issubclass(SchemaError, RoboRLError) and issubclass(StoreError, RoboRLError)


def test_a_camera_command_runs_from_a_plain_shell_with_no_display_and_no_mujoco_gl(tmp_path):
    """The first command a user types after install: no MUJOCO_GL, no display. It renders
    offscreen instead of ending in an OpenGL traceback."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY", "PYOPENGL_PLATFORM")}
    env["TQDM_DISABLE"] = "1"
    r = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "collect", "task=transfer_cube", "episodes=1",
                        "cameras=[top]", f"out={tmp_path / 'demos'}"], capture_output=True, text=True, timeout=300,
                       env=env, cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert EpisodeStore.open(tmp_path / "demos").schema.keys["obs/images/top"].shape[-1] == 3


def test_a_machine_that_cannot_render_says_what_to_install(tmp_path):
    """A rendering backend whose library is missing, or none at all (what robo-rl picks with no
    display, no EGL and no OSMesa): one line naming the packages, no traceback."""
    import os
    from ctypes.util import find_library

    env = {**os.environ, "TQDM_DISABLE": "1"}
    args = [sys.executable, "-m", "robo_rl.cli.main", "collect", "task=transfer_cube", "episodes=1", "cameras=[top]"]
    r = subprocess.run([*args, f"out={tmp_path / 'none'}"], capture_output=True, text=True, timeout=300,
                       env={**env, "MUJOCO_GL": "disable"}, cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot render offscreen with MUJOCO_GL=disable" in r.stderr and "apt install libegl1" in r.stderr
    r = subprocess.run([*args, f"out={tmp_path / 'osmesa'}"], capture_output=True, text=True, timeout=300,
                       env={**env, "MUJOCO_GL": "osmesa"}, cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL)
    if find_library("OSMesa") is None:
        assert r.returncode == 2 and r.stderr.strip() == (
            "error: MUJOCO_GL=osmesa, but libOSMesa is not installed (apt install libosmesa6); unset MUJOCO_GL to let "
            "robo-rl pick what this machine has, or install EGL (apt install libegl1 libgl1-mesa-dri) or OSMesa "
            "(apt install libosmesa6), or run on a desktop with a display"), r.stderr
    else:  # this machine has OSMesa: it renders with it
        assert r.returncode == 0, r.stdout + r.stderr
