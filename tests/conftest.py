import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
os.environ.setdefault("MUJOCO_GL", "egl")

from episodes import make_episode, small_schema  # noqa: E402

from robo_rl.data.store import EpisodeStore  # noqa: E402


@pytest.fixture
def schema():
    return small_schema()


@pytest.fixture
def filled_store(tmp_path, schema):
    """A store with 6 generated episodes, open for appending."""
    store = EpisodeStore.create(tmp_path / "store", schema)
    for e in range(6):
        data, ts, seg, meta = make_episode(e, schema)
        store.add_episode(data, ts, seg, meta)
    yield store
    store.close()
