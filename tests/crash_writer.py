"""A writer process for the crash tests: appends generated episodes forever, printing
'committed N' after each commit, until it is killed.

    python tests/crash_writer.py STORE direct|jpeg|recorder|partial
    (jpeg: direct, frames stored lossy with training-size copies beside)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from episodes import SMALL, make_episode, small_schema  # noqa: E402

from robo_rl.data.recorder import Recorder  # noqa: E402
from robo_rl.data.store import EpisodeStore  # noqa: E402


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    schema = small_schema()
    if mode == "recorder":
        rec = Recorder(path, schema)
        e = rec._first_episode
        print("ready", flush=True)
        while True:
            data, ts, seg, meta = make_episode(e, schema)
            rec.start_episode(meta)
            for j in range(len(ts)):
                rec.add_step({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
            rec.end_episode()
            rec.flush()
            print(f"committed {e}", flush=True)
            e += 1
    codec = {"image_codec": "jpeg", "image_quality": 80, "train_image_size": SMALL} if mode == "jpeg" else {}
    store = EpisodeStore.open(path, mode="a") if (Path(path) / "zarr.json").exists() else EpisodeStore.create(path, schema, **codec)
    print("ready", flush=True)
    if mode == "partial":
        # Write most of an episode (camera frames reach disk shard by shard), then wait to be killed.
        data, ts, seg, meta = make_episode(store.n_episodes, schema, min_len=300, max_len=300)
        w = store.begin_episode(meta)
        for j in range(len(ts)):
            w.add({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
        print("partial", flush=True)
        time.sleep(600)
    e = store.n_episodes
    while True:
        data, ts, seg, meta = make_episode(e, schema)
        w = store.begin_episode(meta)
        # Alternate step-by-step and whole-block appends so both paths get killed mid-way.
        if e % 2:
            for j in range(len(ts)):
                w.add({k: v[j] for k, v in data.items()}, ts[j], int(seg[j]))
        else:
            w.add_block(data, ts, seg)
        w.commit()
        print(f"committed {e}", flush=True)
        e += 1


if __name__ == "__main__":
    main()
