"""Crash safety with real processes killed by SIGKILL at random moments."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from episodes import assert_episode_equal

from robo_rl.data.store import EpisodeStore

WRITER = Path(__file__).parent / "crash_writer.py"


def _start(path: Path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill takes the recorder's writer too
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _group_alive(pgid: int) -> bool:
    """Any process of group `pgid` not yet dead (zombies have released their locks)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _kill_and_count(proc: subprocess.Popen) -> int:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # wait() reaps only the writer; the recorder's own writer process, which holds the store's
    # lock, may still be dying on a loaded machine, and the next writer must not race it
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    out = proc.stdout.read()
    return sum(1 for line in out.splitlines() if line.startswith("committed"))


def _check(path: Path, reported: int, previous: int) -> int:
    """Open without repair; every committed episode must be exactly what was written."""
    store = EpisodeStore.open(path)
    n = store.n_episodes
    # Killed after a commit but before it printed: at most one more than reported.
    assert previous + reported <= n <= previous + reported + 1, (previous, reported, n)
    for i in range(n):
        assert_episode_equal(store, i, i)
    store.close()
    return n


# By default the writer is killed 6 times through the Recorder (test_partial_episode_is_dropped_and_
# repair_says_so kills the direct writer on a lossless store). The direct runs, lossless (5 kills,
# 16 s; 14 kills, ~67 s on an AMD EPYC, AVX2) and into a JPEG store (4 kills, 10 s), are `-m slow`.
@pytest.mark.parametrize("mode,rounds", [pytest.param("direct", 5, marks=pytest.mark.slow),
                                         pytest.param("direct", 14, marks=pytest.mark.slow), ("recorder", 6),
                                         # jpeg: the lossy frame codec and training-size copies under the same kills (10 s, AVX2)
                                         pytest.param("jpeg", 4, marks=pytest.mark.slow)])
def test_sigkill_at_random_points_never_loses_committed_episodes(tmp_path, mode, rounds):
    path = tmp_path / "store"
    rng = random.Random(1234 + len(mode))
    n = 0
    for _ in range(rounds):
        proc = _start(path, mode)
        time.sleep(rng.uniform(0.05, 1.5))
        reported = _kill_and_count(proc)
        n = _check(path, reported, n)
    assert n > 0, "the writer never committed anything; the test proved nothing"
    with EpisodeStore.open(path, mode="a") as store:
        store.repair()
        assert store.validate() == []
        assert store.n_episodes == n
    # and the store keeps working: one more writer round appends after the survivors
    proc = _start(path, mode)
    time.sleep(1.0)
    reported = _kill_and_count(proc)
    _check(path, reported, n)


def test_partial_episode_is_dropped_and_repair_says_so(tmp_path, filled_store):
    path = Path(filled_store.location)
    before = filled_store.n_episodes
    filled_store.close()
    proc = _start(path, "partial")
    assert proc.stdout.readline().strip() == "partial"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with EpisodeStore.open(path) as store:  # opens without repair, sees only committed episodes
        assert store.n_episodes == before
        assert store.array("obs/images/top").shape[0] > store.n_steps  # the partial frames are on disk
        for i in range(before):
            assert_episode_equal(store, i, i)
        assert any("uncommitted" in p for p in store.validate())
    out = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "dataset", "repair", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "dropped" in out and "uncommitted" in out, out
    with EpisodeStore.open(path) as store:
        assert store.validate() == []
        assert store.n_episodes == before
        for i in range(before):
            assert_episode_equal(store, i, i)


def test_second_writer_is_refused_while_first_holds_the_lock(filled_store):
    from robo_rl.errors import StoreError

    with pytest.raises(StoreError, match="another process"):
        EpisodeStore.open(filled_store.location, mode="a")
    filled_store.close()
    EpisodeStore.open(filled_store.location, mode="a").close()  # free again once closed
