"""Where a converter writes: checked first, built aside, swapped in last.

Every import and export (rosbag2, LeRobot, ACT HDF5) builds its result in a staging folder next
to OUT and only then moves it into place, so a failure part way leaves OUT as it was. These
helpers hold the two rules that keep a user's data safe:
- `check_destination`: OUT may not be (or overlap) a source, may not be a file, and an existing
  non-empty OUT is replaced only with overwrite and only if it is the kind of thing the converter
  writes (a store, a LeRobot dataset): a typo in OUT never deletes an unrelated folder;
- `move_into_place`: the old OUT is renamed aside, the new one renamed in, and the old one deleted
  last; if the second rename fails the old one is put back. A crash in between leaves the old
  result at OUT.old-<id>, which `EpisodeStore.open` points to.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from robo_rl.errors import ConfigError

if TYPE_CHECKING:
    from robo_rl.data.schema import Schema
    from robo_rl.data.store import EpisodeStore


def check_destination(out: str | os.PathLike, overwrite: bool, sources: Iterable[str | os.PathLike] = (),
                      marker: str = "zarr.json", kind: str = "robo_rl store") -> Path:
    """OUT as an absolute path, or a ConfigError saying why it may not be written.
    `marker`: the file (relative to OUT) that shows an existing OUT is a `kind` we may replace."""
    target = Path(out).absolute()
    if not target.name:  # "/" has no name to put a staging folder beside
        raise ConfigError(f"{out}: give a folder to create, not the file system's root")
    for src in sources:
        source = Path(src).resolve()
        resolved = target.resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            raise ConfigError(f"{out}: is the input {src} or overlaps it; write somewhere else")
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{out}: is a file, not a folder; give a new folder to write")
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise ConfigError(f"{out}: already exists; pass overwrite=true to replace it")
        if not (target / marker).is_file():
            raise ConfigError(f"{out}: is not a {kind} (no {marker}), so it is not replaced even with overwrite=true; "
                              "give a new folder")
    return target


def staging_dir(out: Path, suffix: str) -> Path:
    """A fresh, empty folder beside OUT to build the result in (what a killed earlier run left is removed)."""
    staging = out.with_name(f"{out.name}.{suffix}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    return staging


def move_into_place(staging: Path, out: Path) -> None:
    """Make the finished `staging` folder OUT; an existing OUT is kept until the new one is in."""
    old = None
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    elif out.exists():
        old = out.with_name(f"{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def import_copy_size(schema: "Schema", size: Sequence[int] | None) -> tuple[int, int] | None:
    """The size of an import's training-size copies: `size` where every camera's frames are at
    least that large in both sides and some are larger; None (no copies) where there is no camera,
    or frames already at or under it, which train reads as they are."""
    if size is None or not schema.image_keys:
        return None
    h, w = (int(v) for v in size)
    full = [tuple(schema.keys[k].shape[:2]) for k in schema.image_keys]
    if any(fh < h or fw < w for fh, fw in full) or all(f == (h, w) for f in full):
        return None
    return h, w


@contextlib.contextmanager
def new_store(out: Path, schema: "Schema", train_image_size: Sequence[int] | None = None) -> Iterator["EpisodeStore"]:
    """An importer's store: created in OUT.importing, moved to OUT when the block ends without an
    error; on an error its writer lock is released and the folder removed (OUT is untouched).
    `train_image_size`: also keep every camera frame downscaled to it, what train reads
    (import_copy_size says when)."""
    from robo_rl.data.store import EpisodeStore  # here: outputs.py is also used by the exporter

    staging = staging_dir(out, "importing")
    store = None
    try:
        store = EpisodeStore.create(staging, schema, train_image_size=import_copy_size(schema, train_image_size))
        yield store
        store.close()
        store = None
        move_into_place(staging, out)
    except BaseException:
        if store is not None:
            with contextlib.suppress(Exception):  # already failing: keep the first error
                store.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
