"""`robo-rl record` as a person at a terminal runs it (a pseudo-terminal): episodes started and
ended with keys, teleop moves that reach the store, Ctrl-C keeping every finished episode, the
twin's episodes replaying exactly, and a policy taken over with the RaC keys."""

from __future__ import annotations

import time

import numpy as np

from conftest import robo_rl_cli, robo_rl_in_process
from pty_session import PtySession

from robo_rl.data.schema import Segment
from robo_rl.data.store import EpisodeStore


def test_ctrl_c_during_record_keeps_every_finished_episode(tmp_path):
    out = tmp_path / "demos"
    s = PtySession(["record", f"out={out}", "cameras=[top]", "episode_s=30"])
    try:
        s.expect("episode 0: press n to start")
        s.send("n")
        s.expect("episode 0: recording")
        time.sleep(0.3)
        s.send("wwwwwwqqqq", gap_s=0.05)  # the right gripper forward 3 cm, up 2 cm
        time.sleep(0.3)
        s.send("y")
        s.expect("episode 0: saved as 0")
        s.expect("episode 1: press n to start")
        s.send("n")
        s.expect("episode 1: recording")
        s.send("x")  # discarded: never stored
        s.expect("episode 1: discarded")
        s.send("n")
        s.expect("episode 1: recording")
        time.sleep(1.5)
        # end it as a failure and start the next one at once, its commit still under way; no gap, so
        # one terminal read holds both keys, as a quick typist sends them (the n must not be lost)
        s.send("fn", gap_s=0)
        s.expect("episode 1: saved as 1")
        s.expect("episode 2: recording")
        s.interrupt()  # Ctrl-C (to the whole process group, as a terminal sends it) in the middle of an episode
        code = s.wait()
        assert code == 0, f"exit {code}; the session printed:\n{s.output[-3000:]}"  # failed once in CI: show why
    finally:
        s.close()
    assert "2 episode(s) committed" in s.output
    with EpisodeStore.open(str(out)) as store:
        assert store.n_episodes == 2  # the two ended episodes; the discarded and the interrupted ones are not there
        m0, m1 = store.meta(0), store.meta(1)
        assert m0.extra["marked_success"] is True and m1.extra["marked_success"] is False
        assert m0.extra["ended"] == "marked y" and m0.source == "teleop" and m0.operator == "human_keyboard"
        ep = store.episode(0)
        assert (ep["segment"] == int(Segment.TELEOP)).all()
        moved = ep["action"][-1] - ep["action"][0]
        assert np.abs(moved[7:13]).max() > 0.02 and np.abs(moved[:6]).max() < 1e-3  # keys moved the right arm only
        frames = ep["obs/images/top"]
        assert frames.shape[1:] == (96, 96, 3) and frames.std() > 5  # the camera recipe's size, record's default
        assert np.all(np.diff(ep["timestamp"]) > 0)
    # the twin's episodes carry their initial state: they replay exactly
    r = robo_rl_cli("replay", str(out), "episode=all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 episode(s) replay faithfully" in r.stdout


def test_record_interventions_on_a_policy_with_the_rac_keys(tmp_path, checkpoints):
    out = tmp_path / "interventions"
    s = PtySession(["record", f"out={out}", f"checkpoint={checkpoints['state']}", "episode_s=20", "episodes=1"])
    try:
        s.expect("episode 0: press n to start")
        s.send("n")
        s.expect("episode 0: recording")
        time.sleep(0.6)  # the policy drives
        s.send("t")      # take over
        time.sleep(0.3)
        s.send("qqqq", gap_s=0.05)  # recovery: back up
        s.send("r")
        time.sleep(0.2)
        s.send("wwww", gap_s=0.05)  # correction
        s.send("c")  # RaC: the episode ends with the correction
        s.expect("episode 0: saved as 0")
        assert s.wait() == 0
    finally:
        s.close()
    with EpisodeStore.open(str(out)) as store:
        meta = store.meta(0)
        assert meta.source == "rac" and meta.extra["ended"] == "RaC end"
        assert len(meta.extra["interventions"]) == 1
        seg = store.episode(0)["segment"]
        labels = [int(Segment.POLICY), int(Segment.RECOVERY), int(Segment.CORRECTION)]
        assert all((seg == lab).any() for lab in labels), np.unique(seg)
        first = {lab: int(np.argmax(seg == lab)) for lab in labels}
        assert first[labels[0]] < first[labels[1]] < first[labels[2]]  # policy, then recovery, then correction
        assert seg[-1] == int(Segment.CORRECTION)  # nothing after the correction (RaC's END)


def test_record_and_teleop_refuse_bad_input_in_one_line(tmp_path, capsys):
    cases = [(("record", f"out={tmp_path}/a", "teleop=joystick"), "teleop='joystick'; choose one of keyboard, gamepad"),
             (("record", f"out={tmp_path}/a", "episode_s=null"), "episode_s=None; give an episode's time limit"),
             (("record", f"out={tmp_path}/a", "mode=dagger"), "mode='dagger'; choose rac or hg_dagger"),
             (("record",), "pass out=PATH"),
             (("teleop", "robot=aloha", "teleop=joystick"), "teleop='joystick'; choose one of")]
    for args, message in cases:  # in this process: no 2-3 s of imports per refusal
        code, err = robo_rl_in_process(capsys, *args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
    # a subprocess with no terminal on stdin (`pytest -s` would hand this process's terminal over)
    r = robo_rl_cli("record", f"out={tmp_path}/a", timeout=60)
    assert r.returncode == 2 and "the episode keys need a terminal" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()  # nothing was created for a refused session


def test_keys_typed_after_the_one_that_ends_an_episode_stay_queued():
    from robo_rl.cli.session import SessionKeys

    keys = SessionKeys(episode_keys="nyfx")
    try:
        keys.pending[:] = ["f", "n", "y"]  # one terminal read: end as a failure, start, end again
        assert keys.take(until="yfx") == ["f"] and keys.take(until="yfx") == ["n", "y"]
        keys.pending[:] = ["n", "n"]
        assert keys.take(until="yfx") == ["n", "n"] and keys.take() == []
    finally:
        keys.close()
