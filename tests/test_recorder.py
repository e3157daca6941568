"""The background Recorder: every step handed over lands in the right episode, bit for bit."""

import numpy as np
from episodes import assert_episode_equal, make_episode

from robo_rl.data.recorder import Recorder
from robo_rl.data.store import EpisodeStore


def test_back_to_back_episodes_lose_nothing(tmp_path, schema):
    """No pauses between episodes: the control side runs far ahead of the writer."""
    path = tmp_path / "rec"
    with Recorder(path, schema, ring_seconds=1.0) as rec:
        for e in range(12):
            data, ts, seg, meta = make_episode(e, schema)
            rec.start_episode(meta)
            for j in range(len(ts)):
                rec.add_step({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
            assert rec.end_episode() == e
        stats = rec.stats()
    assert stats.steps == sum(len(make_episode(e, schema)[1]) for e in range(12))
    with EpisodeStore.open(path) as store:
        assert store.n_episodes == 12 and store.n_steps == stats.steps
        for e in range(12):
            assert_episode_equal(store, e, e)
        assert store.validate() == []


def test_discarded_episode_leaves_nothing_and_appending_resumes(tmp_path, schema):
    path = tmp_path / "rec"
    with Recorder(path, schema) as rec:
        for e in range(2):
            data, ts, seg, meta = make_episode(e, schema)
            rec.start_episode(meta)
            for j in range(len(ts)):
                rec.add_step({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
            if e == 0:
                rec.discard_episode()
            else:
                rec.end_episode()
    with Recorder(path) as rec:  # reopen an existing store: appends after what is there
        data, ts, seg, meta = make_episode(2, schema)
        rec.start_episode(meta)
        for j in range(len(ts)):
            rec.add_step({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
        assert rec.end_episode() == 1
    with EpisodeStore.open(path) as store:
        assert store.n_episodes == 2
        assert_episode_equal(store, 0, 1)
        assert_episode_equal(store, 1, 2)
        assert store.validate() == []


def test_close_with_open_episode_drops_only_that_episode(tmp_path, schema):
    path = tmp_path / "rec"
    rec = Recorder(path, schema)
    data, ts, seg, meta = make_episode(0, schema)
    rec.start_episode(meta)
    for j in range(len(ts)):
        rec.add_step({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
    rec.end_episode(success=True)
    rec.start_episode()
    rec.add_step({k: v[0] for k, v in data.items()}, 1e6, 0)
    rec.close()
    with EpisodeStore.open(path) as store:
        assert store.n_episodes == 1 and store.meta(0).success is True
        assert np.array_equal(store.read("obs/qpos"), data["obs/qpos"])
        assert store.validate() == []
