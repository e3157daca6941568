"""EpisodeStore on real zarr v3 stores on disk."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from episodes import assert_episode_equal, make_episode, small_schema

from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.data.store import IMAGE_SHARD, EpisodeStore
from robo_rl.errors import SchemaError, StoreError


def test_episodes_round_trip_bit_for_bit(filled_store):
    store = EpisodeStore.open(filled_store.location)
    assert store.n_episodes == 6
    assert store.episode_ends.tolist() == np.cumsum(store.episode_lengths).tolist()
    for i in range(6):
        assert_episode_equal(store, i, i)
    assert store.schema.to_json() == small_schema().to_json()
    assert store.schema.cameras == ["top", "wrist"]


def test_step_by_step_equals_whole_episode(tmp_path, schema):
    a = EpisodeStore.create(tmp_path / "a", schema)
    data, ts, seg, meta = make_episode(3, schema, min_len=300, max_len=300)  # crosses image shards
    w = a.begin_episode(meta)
    for j in range(len(ts)):
        w.add({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
    assert w.commit() == 0
    b = EpisodeStore.create(tmp_path / "b", schema)
    b.add_episode(data, ts, seg, meta)
    for k in a.data_keys:
        assert np.array_equal(a.read(k), b.read(k)), k


def test_uncommitted_episode_is_invisible_and_discard_cuts_it(filled_store, schema):
    data, ts, seg, meta = make_episode(6, schema, min_len=300, max_len=300)
    w = filled_store.begin_episode(meta)
    w.add_block(data, ts, seg)  # whole image shards reach disk now
    reader = EpisodeStore.open(filled_store.location)
    assert reader.n_episodes == 6
    assert filled_store.array("obs/images/top").shape[0] > filled_store.n_steps
    w.discard()
    assert filled_store.array("obs/images/top").shape[0] == filled_store.n_steps
    assert filled_store.validate() == []


def test_camera_frames_are_grouped_into_shard_files(tmp_path, schema):
    store = EpisodeStore.create(tmp_path / "s", schema)
    data, ts, seg, meta = make_episode(0, schema, min_len=1000, max_len=1000)
    store.add_episode(data, ts, seg, meta)
    files = [p for p in (tmp_path / "s" / "data" / "obs" / "images" / "top").rglob("*") if p.is_file()]
    expected_shards = -(-1000 // IMAGE_SHARD)
    assert len(files) <= expected_shards + 1, f"{len(files)} files for 1000 frames"  # + zarr.json


def test_reader_sees_only_committed_episodes_and_refreshes(tmp_path):
    """A writer process appends while this process reads."""
    path = tmp_path / "store"
    EpisodeStore.create(path, small_schema()).close()
    writer = subprocess.Popen([sys.executable, str(Path(__file__).parent / "crash_writer.py"), str(path), "direct"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        reader = EpisodeStore.open(path)
        seen = [reader.n_episodes]
        deadline = time.monotonic() + 20
        while seen[-1] < 25 and time.monotonic() < deadline:
            time.sleep(0.05)
            reader.refresh()
            n = reader.n_episodes
            assert n >= seen[-1]
            for i in range(n):  # every visible episode is complete and exact
                assert_episode_equal(reader, i, i)
            seen.append(n)
        assert seen[-1] >= 25 and len(set(seen)) > 2, seen
    finally:
        writer.kill()
        writer.wait()


def test_select_filter_merge_delete(filled_store, tmp_path):
    s = filled_store
    assert s.select(task="task1") == [i for i in range(6) if i % 3 == 1]
    assert s.select(success=True) == [1, 3, 5]
    assert s.select(source="teleop") == [0, 4]
    assert s.select(task="task0", success=False) == [0]
    # segment: episodes holding at least one step with that label
    seg = s.read("segment")
    has_rec = [i for i in range(6) if (seg[slice(*s.episode_range(i))] == Segment.RECOVERY).any()]
    assert s.select(segment="recovery") == has_rec

    filtered = s.copy_episodes(tmp_path / "odd", s.select(success=True))
    assert filtered.n_episodes == 3
    for i, e in enumerate([1, 3, 5]):
        assert_episode_equal(filtered, i, e)

    merged = EpisodeStore.merge([s, filtered], tmp_path / "merged")
    assert merged.n_episodes == 9
    for i, e in enumerate([0, 1, 2, 3, 4, 5, 1, 3, 5]):
        assert_episode_equal(merged, i, e)

    left = merged.delete([0, 2, 7])
    assert left == 6
    for i, e in enumerate([1, 3, 4, 5, 1, 5]):
        assert_episode_equal(merged, i, e)
    assert merged.validate() == []
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name or ".rewrite-" in p.name]


def test_merge_refuses_different_schemas(filled_store, tmp_path):
    other = EpisodeStore.create(tmp_path / "lowdim", small_schema(cameras=False))
    with pytest.raises(StoreError, match="merge"):
        EpisodeStore.merge([filled_store, other], tmp_path / "m")
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_stats_saved_once_and_invalidated_by_growth(filled_store, schema):
    from robo_rl.data.stats import Normalizer, compute_stats, get_stats

    st = get_stats(filled_store)
    assert set(st) == {"obs/qpos", "action", "obs/gripper"}
    x = filled_store.read("action").astype(np.float64)
    assert np.allclose(st["action"]["mean"], x.mean(0)) and np.allclose(st["action"]["p99"], np.percentile(x, 99, axis=0))
    assert EpisodeStore.open(filled_store.location).load_stats() is not None  # saved in the store
    data, ts, seg, meta = make_episode(6, schema)
    filled_store.add_episode(data, ts, seg, meta)
    assert filled_store.load_stats() is None  # stale after growth
    assert np.allclose(get_stats(filled_store)["action"]["max"], compute_stats(filled_store)["action"]["max"])
    for mode in ("minmax", "percentile", "meanstd"):
        n = Normalizer.from_stats(st["action"], mode)
        y = n.normalize(x.astype(np.float32))
        assert np.allclose(n.unnormalize(y), x, atol=1e-4)
        if mode == "minmax":
            assert y.min() >= -1.0001 and y.max() <= 1.0001


def test_remote_read_over_http(filled_store, tmp_path):
    """Any fsspec URL zarr accepts opens read-only; here a real HTTP server on loopback."""
    pytest.importorskip("aiohttp")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    root = Path(filled_store.location).parent
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "range_http_server.py"), str(port), str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        remote = EpisodeStore.open(f"http://127.0.0.1:{port}/store")
        assert remote.n_episodes == 6 and not remote.writable
        for i in range(6):
            assert_episode_equal(remote, i, i)
        with pytest.raises(StoreError, match="read-only"):
            EpisodeStore.open(f"http://127.0.0.1:{port}/store", mode="a")
    finally:
        server.kill()
        server.wait()


def test_meta_updates_at_commit(tmp_path, schema):
    store = EpisodeStore.create(tmp_path / "s", schema)
    data, ts, seg, _ = make_episode(0, schema)
    w = store.begin_episode(EpisodeMeta(task="pick"))
    w.add_block(data, ts, seg)
    w.commit(success=True, notes="operator retried once", extra={"interventions": [{"t": 1.5}]})
    m = EpisodeStore.open(store.location).meta(0)
    assert m.success is True and m.notes == "operator retried once" and m.extra["interventions"][0]["t"] == 1.5


def test_corrupted_chunk_is_reported_not_returned(filled_store):
    """A flipped byte on disk is caught by the chunk checksum: read() raises, validate() names it."""
    root = Path(filled_store.location)
    filled_store.close()
    shard = next(p for p in sorted((root / "data" / "action" / "c").rglob("*")) if p.is_file())
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    store = EpisodeStore.open(root)
    with pytest.raises(StoreError, match="'action' rows .* unreadable"):
        store.read("action")
    assert any("'action'" in p and "unreadable" in p for p in store.validate())


def test_open_or_create_appends_and_refuses_another_schema(tmp_path):
    schema = Schema.build({"obs/qpos": ((2,), "float32"), "action": ((2,), "float32")}, fps=50)
    with EpisodeStore.open_or_create(tmp_path / "s", schema) as store:
        store.add_episode({"obs/qpos": np.zeros((3, 2), np.float32), "action": np.zeros((3, 2), np.float32)},
                          np.arange(3) / 50, "TELEOP", EpisodeMeta(task="toy"))
    with EpisodeStore.open_or_create(tmp_path / "s", schema) as store:  # appends, keeps what is there
        assert store.n_episodes == 1
    other = Schema.build({"obs/qpos": ((3,), "float32"), "action": ((2,), "float32")}, fps=50)
    with pytest.raises(SchemaError, match="not the ones given"):
        EpisodeStore.open_or_create(tmp_path / "s", other)
    assert EpisodeStore.open(tmp_path / "s").n_episodes == 1
