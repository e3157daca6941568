"""robo-rl replay and robo-rl video on freshly collected twin episodes: a replay reproduces the
recording (the twin is deterministic), a video is a decodable H.264 MP4 of the right length and
size with segment labels, and episodes that cannot be replayed fail with one line."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import robo_rl_in_process

from robo_rl.data.schema import EpisodeMeta, Segment
from robo_rl.data.store import EpisodeStore

av = pytest.importorskip("av")


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def _one_line_error(r, needle):
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One state-only store and one with two small cameras, one TransferCube episode each, plus a
    copy of the camera store whose episode has no initial state and mixed segment labels."""
    root = tmp_path_factory.mktemp("replay")
    state, cams = root / "state", root / "cams"
    r = _cli("collect", "task=transfer_cube", "episodes=1", f"out={state}", "cameras=[]")
    assert r.returncode == 0, r.stderr
    r = _cli("collect", "task=transfer_cube", "episodes=1", f"out={cams}", "cameras=[top,left_wrist]", "image_size=[33,45]")
    assert r.returncode == 0, r.stderr
    bare = root / "bare"
    with EpisodeStore.open(cams) as src, EpisodeStore.create(bare, src.schema) as dst:
        ep = src.episode(0)
        ts, seg = ep.pop("timestamp"), ep.pop("segment").copy()
        n = len(ts)
        seg[: n // 2], seg[n // 2:] = Segment.POLICY, Segment.CORRECTION  # a policy run an operator corrected
        meta = EpisodeMeta.from_json(src.meta(0).to_json())
        meta.extra.pop("init_state")
        dst.add_episode(ep, ts, seg, meta)
    return {"state": state, "cams": cams, "bare": bare}


def test_replay_of_a_collected_episode_reproduces_it(stores):
    from robo_rl.sim.replay import load_episode, make_env, replay_episode

    with EpisodeStore.open(stores["state"]) as store:
        ep = load_episode(store, 0)
        meta = store.meta(0)
    env = make_env(ep.task)
    res = replay_episode(env, ep)
    env.close()
    assert res.joint_div.shape == (ep.length, 14) and len(res.joint_names) == 14
    assert res.max_joint < 1e-5, res.joint_div.max(axis=0)
    assert res.object_max_pos is not None and res.object_max_pos < 1e-5
    assert res.replayed_success == meta.success is True
    assert res.replayed_stage == meta.extra["max_stage"]
    # a perturbed action shows up as divergence in that joint: the comparison is not vacuous
    ep.action = ep.action.copy()
    ep.action[len(ep.action) // 3, 3] += 0.01  # left_forearm_roll
    env = make_env(ep.task)
    res = replay_episode(env, ep)
    env.close()
    assert res.joint_div[:, 3].max() > 1e-3 and res.joint_div[:, 3].max() == res.max_joint


def test_replay_cli_prints_per_joint_table_and_same_outcome(stores):
    r = _cli("replay", f"dataset={stores['state']}", "episode=0")
    assert r.returncode == 0, r.stderr
    for name in ("left_waist", "right_gripper", "cube", "orientation (rad)", "max stage"):
        assert name in r.stdout, r.stdout
    assert "replay faithfully" in r.stdout
    r = _cli("replay", stores["cams"], "episode=all")
    assert r.returncode == 0, r.stderr
    assert "1 episodes" in r.stdout and "True / True" in r.stdout


def test_video_from_stored_frames_is_h264_with_right_frames_and_size(stores, tmp_path):
    out = tmp_path / "ep0.mp4"
    r = _cli("video", f"dataset={stores['cams']}", "episode=0", f"out={out}", "cameras=[top,left_wrist]")
    assert r.returncode == 0, r.stderr
    with EpisodeStore.open(stores["cams"]) as store:
        n = int(store.episode_lengths[0])
        fps = store.schema.fps
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and s.codec_context.pix_fmt == "yuv420p"
        assert float(s.average_rate) == pytest.approx(fps)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
    assert len(frames) == n
    assert frames[0].shape == (34, 90, 3)  # two 33x45 cameras side by side, padded to even
    assert out.stat().st_size > 1000 and not list(tmp_path.glob("*.partial"))


def test_video_rerenders_a_state_only_store_and_colours_segments(stores, tmp_path):
    out = tmp_path / "render.mp4"
    r = _cli("video", stores["state"], "episode=0", f"out={out}", "image_size=[48,64]")
    assert r.returncode == 0, r.stderr
    assert "re-rendered in the twin" in r.stdout
    assert any("replay max joint divergence" in line and "0.00e+00" in line for line in r.stdout.splitlines()), r.stdout
    with EpisodeStore.open(stores["state"]) as store:
        n = int(store.episode_lengths[0])
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and (s.codec_context.width, s.codec_context.height) == (64, 48)
        assert sum(1 for _ in c.decode(s)) == n
    # segment labels: POLICY (green) then CORRECTION (red) in the top-left label box
    out = tmp_path / "labels.mp4"
    r = _cli("video", stores["bare"], f"out={out}", "crf=10")
    assert r.returncode == 0, r.stderr
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    first, last = frames[0][1, 1].astype(int), frames[-1][1, 1].astype(int)
    assert first[1] > first[0] + 60 and last[0] > last[1] + 60, (first, last)


def test_episode_without_initial_state_is_a_one_line_error(stores, tmp_path, capsys):
    def refused(*args: str) -> SimpleNamespace:  # in this process: a refusal needs no interpreter start-up
        code, err = robo_rl_in_process(capsys, *args)
        return SimpleNamespace(returncode=code, stdout="", stderr=err)

    _one_line_error(refused("replay", f"dataset={stores['bare']}", "episode=0"), "no recorded initial state")
    _one_line_error(refused("video", f"dataset={stores['bare']}", "source=render", f"out={tmp_path / 'x.mp4'}"),
                    "no recorded initial state")
    assert not (tmp_path / "x.mp4").exists()
    _one_line_error(refused("replay", f"dataset={stores['state']}", "episode=7"), "out of range")
    _one_line_error(refused("replay", f"dataset={tmp_path / 'nope'}"), "no such store")
    _one_line_error(refused("video", f"dataset={stores['state']}", "source=stored"), "no frames of camera")
