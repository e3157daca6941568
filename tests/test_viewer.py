"""The Rerun viewer (robo_rl/data/viewer.py, `robo-rl view`, `view=true`): what it writes to an
.rrd is read back with rerun's own reader and compared with the episode store step by step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

rr = pytest.importorskip("rerun")

from conftest import robo_rl_cli, robo_rl_in_process  # noqa: E402
from episodes import make_episode, small_schema  # noqa: E402
from pty_session import PtySession  # noqa: E402

from robo_rl.cli.session import close_session  # noqa: E402
from robo_rl.data.schema import Segment  # noqa: E402
from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.data.viewer import LiveView, RerunLogger  # noqa: E402

RERUN_BIN = Path(sys.executable).parent / "rerun"


def read_rrd(path: Path) -> tuple[dict[str, dict[str, list]], dict[str, dict[str, list]]]:
    """(temporal, static): entity path -> column -> values, rows of all chunks sorted by `step`."""
    from rerun.chunk import RrdReader

    temporal: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    static: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for chunk in RrdReader(str(path)).stream():
        batch = chunk.to_record_batch()
        into = static if chunk.is_static else temporal
        for name in batch.schema.names:
            if name in ("log_time", "rerun.controls.RowId"):  # log_time needs pandas to convert
                continue
            col = batch.column(name)
            into[chunk.entity_path][name] += (col.cast("int64") if name == "time" else col).to_pylist()
    for cols in temporal.values():
        order = np.argsort(cols["step"], kind="stable")
        for name in cols:
            cols[name] = [cols[name][j] for j in order]
    return temporal, static


def make_store(path: Path, cameras: bool = True, episodes: int = 3) -> EpisodeStore:
    schema = small_schema(cameras)
    store = EpisodeStore.create(path, schema)
    for e in range(episodes):
        store.add_episode(*make_episode(e, schema))
    return store


def test_view_saves_an_episode_that_rerun_reads_back(tmp_path):
    with make_store(tmp_path / "store") as store:
        ep, meta, T = store.episode(1), store.meta(1), int(store.episode_lengths[1])
    out = tmp_path / "ep1.rrd"
    r = robo_rl_cli("view", str(tmp_path / "store"), "episode=1", "--save", str(out), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{T} steps" in r.stdout and f"rerun {out}" in r.stdout
    verify = subprocess.run([str(RERUN_BIN), "rrd", "verify", str(out)], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    temporal, static = read_rrd(out)
    for key in ("obs/qpos", "action", "obs/gripper"):  # joint positions and commands as time series
        cols = temporal[f"/{key}"]
        assert cols["step"] == list(range(T))
        np.testing.assert_array_equal(np.array(cols["Scalars:scalars"]), ep[key].astype(np.float64))
        assert len(static[f"/{key}"]["SeriesLines:names"][0]) == ep[key].shape[1]
    seconds = (ep["timestamp"] - ep["timestamp"][0]) * 1e9
    np.testing.assert_allclose(temporal["/obs/qpos"]["time"], seconds, atol=1)
    for cam in ("top", "wrist"):  # one JPEG per step and camera
        cols = temporal[f"/obs/images/{cam}"]
        assert cols["step"] == list(range(T)) and cols["EncodedImage:media_type"] == [["image/jpeg"]] * T
        import cv2

        frame = cv2.imdecode(np.array(cols["EncodedImage:blob"][0][0], dtype=np.uint8), cv2.IMREAD_COLOR)
        assert frame.shape == ep[f"obs/images/{cam}"].shape[1:]
    seg = ep["segment"].astype(int)
    assert [s[0] for s in temporal["/segment/id"]["Scalars:scalars"]] == seg.tolist()
    changes = [0] + [t for t in range(1, T) if seg[t] != seg[t - 1]]
    labels = temporal["/segment/label"]
    assert labels["step"] == changes  # a text-log entry exactly where the label changes
    assert [t[0] for t in labels["TextLog:text"]] == [Segment(seg[t]).name for t in changes]
    doc = static["/meta"]["TextDocument:text"][0][0]
    assert f"| task | {meta.task} |" in doc and f"| success | {meta.success} |" in doc and "| robot | test_arms |" in doc


def test_raw_frames_come_back_bit_for_bit_and_a_store_without_cameras_logs(tmp_path):
    with make_store(tmp_path / "store") as store:
        logger = RerunLogger("raw", save=tmp_path / "raw.rrd", jpeg_quality=None)
        counts = logger.log_episode(store, 0)
        logger.close()
        frames = store.episode(0)["obs/images/top"]
    temporal, static = read_rrd(tmp_path / "raw.rrd")
    assert counts["steps"] == len(frames)
    got = np.array([b[0] for b in temporal["/obs/images/top"]["Image:buffer"]], dtype=np.uint8)
    np.testing.assert_array_equal(got.reshape(frames.shape), frames)
    fmt = static["/obs/images/top"]["Image:format"][0][0]
    assert (fmt["height"], fmt["width"]) == frames.shape[1:3]

    with make_store(tmp_path / "nocam", cameras=False, episodes=1) as store:
        logger = RerunLogger("nocam", save=tmp_path / "nocam.rrd")
        logger.log_episode(store, 0)
        logger.close()
        qpos = store.episode(0)["obs/qpos"]
    temporal, _ = read_rrd(tmp_path / "nocam.rrd")
    assert not any("images" in e for e in temporal)
    np.testing.assert_array_equal(np.array(temporal["/obs/qpos"]["Scalars:scalars"]), qpos.astype(np.float64))


def test_live_view_drops_and_counts_instead_of_blocking(tmp_path):
    """A viewer slower than the loop: the logging thread is held until every step was offered, so
    all but a queue's worth are dropped; step() never waits, and what got through is in the file."""
    n, queue_size = 200, 4
    logger = RerunLogger("live", save=tmp_path / "live.rrd")
    release = threading.Event()
    real_log_step = logger.log_step

    def slow_log_step(*args, **kwargs):
        release.wait(timeout=60)
        real_log_step(*args, **kwargs)

    logger.log_step = slow_log_step
    live = LiveView(logger, queue_size=queue_size)
    rng = np.random.default_rng(0)
    sent = {}
    for i in range(n):
        values = {"obs/qpos": rng.standard_normal(14).astype(np.float32), "obs/images/top": np.zeros((8, 8, 3), np.uint8)}
        if live.step(values, Segment.POLICY if i < n // 2 else Segment.CORRECTION, t=i / 50):
            sent[i] = values["obs/qpos"]
    release.set()
    counts = live.close()
    assert counts["steps"] == n and counts["logged"] + counts["dropped"] == n
    assert counts["logged"] == len(sent) and counts["dropped"] >= n - queue_size - 1
    temporal, _ = read_rrd(tmp_path / "live.rrd")
    qpos = temporal["/obs/qpos"]
    assert qpos["step"] == sorted(sent)  # dropped steps leave gaps; the logged ones keep their index
    np.testing.assert_array_equal(np.array(qpos["Scalars:scalars"]), np.array([sent[i] for i in sorted(sent)], np.float64))
    assert temporal["/obs/images/top"]["step"] == sorted(sent)


def test_live_view_after_a_logging_error_drains_counts_and_reports(tmp_path):
    """A step rerun rejects (an image of object dtype): the loop never sees the error; from there
    on the thread only drains, later steps count as dropped, and close() reports it, not raises."""
    live = LiveView(RerunLogger("bad", save=tmp_path / "bad.rrd", jpeg_quality=None), queue_size=256)
    good = {"obs/qpos": np.zeros(14, np.float32)}
    for _ in range(3):
        assert live.step(good, Segment.TELEOP)
    assert live.step({"obs/images/top": np.array([[object()]], dtype=object)}, Segment.TELEOP)  # step 3
    for _ in range(5):
        live.step(good, Segment.TELEOP)
    live.mark("after the error")  # not logged either, and never blocks
    counts = live.close()  # does not raise
    assert counts["steps"] == 9 and counts["logged"] == 3 and counts["dropped"] == 6
    assert counts["error"].startswith("logging failed at step 3: ValueError")
    summary = live.summary()
    assert "3 of 9 steps logged" in summary and "6 dropped (logging failed at step 3: ValueError" in summary
    assert len(summary.splitlines()) == 1
    assert live.close() == counts  # twice: a session's cleanup may call it again
    temporal, _ = read_rrd(tmp_path / "bad.rrd")  # what was logged before the error is in the file
    assert temporal["/obs/qpos"]["step"] == [0, 1, 2] and "/events" not in temporal


def test_close_session_closes_every_part_then_raises_the_first_error():
    closed = []

    class Part:
        def __init__(self, name, fails=False):
            self.name, self.fails = name, fails

        def close(self):
            closed.append(self.name)
            if self.fails:
                raise RuntimeError(f"{self.name} failed")

    with pytest.raises(RuntimeError, match="keys failed"):
        close_session(Part("keys", fails=True), None, Part("robot"), Part("recorder", fails=True), Part("live"))
    assert closed == ["keys", "robot", "recorder", "live"]


def test_record_with_view_true_streams_its_steps_to_an_rrd(tmp_path):
    out, rrd = tmp_path / "demos", tmp_path / "live.rrd"
    s = PtySession(["record", f"out={out}", "cameras=[top]", "image_size=[48,64]", "auto_start=true", "episodes=1",
                    "episode_s=1", "view=true", f"view_save={rrd}"])
    try:
        assert s.wait(120) == 0, s.output[-3000:]
    finally:
        s.close()
    m = re.search(r"view: (\d+) of (\d+) steps logged to (\S+), (\d+) dropped", s.output)
    assert m, s.output[-3000:]
    logged, steps, dropped = int(m.group(1)), int(m.group(2)), int(m.group(4))
    with EpisodeStore.open(str(out)) as store:
        ep = store.episode(0)
    assert steps == len(ep["action"]) == 50 and logged + dropped == steps and logged > 0
    temporal, static = read_rrd(rrd)
    got = temporal["/obs/qpos"]
    assert len(got["step"]) == logged
    np.testing.assert_array_equal(np.array(got["Scalars:scalars"]), ep["obs/qpos"][got["step"]].astype(np.float64))
    np.testing.assert_array_equal(np.array(temporal["/action"]["Scalars:scalars"]),
                                  ep["action"][temporal["/action"]["step"]].astype(np.float64))
    assert len(temporal["/obs/images/top"]["step"]) == logged
    assert [t[0] for t in temporal["/segment/label"]["TextLog:text"]] == ["TELEOP"]
    assert temporal["/events"]["TextLog:text"] == [["episode 0: recording"]]
    assert "robo-rl record (live)" in static["/meta"]["TextDocument:text"][0][0]
    assert static["/obs/qpos"]["SeriesLines:names"][0][0] == "left_waist"  # joint names from the robot's spec


def test_bad_input_is_one_line(tmp_path, capsys):
    with make_store(tmp_path / "store", cameras=False, episodes=2):
        pass
    no_display = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    blocked = tmp_path / "blocked"  # a `rerun` that fails to import, as if rerun-sdk were not installed
    blocked.mkdir()
    (blocked / "rerun.py").write_text("raise ImportError('rerun-sdk is not installed')\n")
    cases = [(("view", str(tmp_path / "nope"), "--save", str(tmp_path / "a.rrd")), None, "nope"),
             (("view", str(tmp_path / "store"), "episode=5", "--save", str(tmp_path / "a.rrd")), None, "out of range"),
             (("view", str(tmp_path / "store"), "episode=all", "--save", str(tmp_path / "a.rrd")), None, "give episode=N"),
             (("view", str(tmp_path / "store"), "--save"), None, "--save needs a file name"),
             (("view", str(tmp_path / "store")), no_display, "no display"),
             (("record", f"out={tmp_path}/r", "auto_start=true", "view=true"), no_display, "pass view_save=x.rrd"),
             (("view", str(tmp_path / "store"), f"--save={tmp_path / 'a.rrd'}"),
              {**os.environ, "PYTHONPATH": f"{blocked}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
              "the Rerun viewer needs rerun-sdk: pip install 'robo_rl[viz]'")]
    for args, env, message in cases:
        if env is None:  # in this process: the refusals that need no other environment (1-2 s of start-up each)
            code, err = robo_rl_in_process(capsys, *args)
        else:
            r = run_cli(args, env)
            code, err = r.returncode, r.stderr
        err = err.strip()
        assert code == 2 and message in err and len(err.splitlines()) == 1 and err.startswith("error:"), (args, err)
    assert not (tmp_path / "a.rrd").exists() and not (tmp_path / "r").exists()


def run_cli(args: tuple[str, ...], env: dict | None) -> subprocess.CompletedProcess:
    if env is None:
        return robo_rl_cli(*args, timeout=120)
    env = {**env, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL)
