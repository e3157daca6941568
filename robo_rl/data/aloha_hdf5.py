"""ACT / ALOHA per-episode HDF5 files -> EpisodeStore.

The layout, as ACT, mobile-aloha and act-plus-plus record it (one file per episode,
`episode_<n>.hdf5`, n without zero padding):

    attrs: sim (bool; missing = False), compress (bool; only in recorders with JPEG frames)
    /observations/qpos     (T, 14)   -> obs/qpos
    /observations/qvel     (T, 14)   -> obs/qvel     (optional here)
    /observations/effort   (T, 14)   -> obs/effort   (real robot only)
    /action                (T, 14)   -> action
    /base_action           (T, 2)    -> base_action  (Mobile ALOHA only)
    /observations/images/<cam>       -> obs/images/<cam>
        raw:        uint8 (T, H, W, 3), HDF5 filters (gzip, ...) are read transparently
        compressed: uint8 (T, padded_len), one cv2 JPEG per row, zero-padded to the longest,
                    with /compress_len (num_cams, T) holding the true lengths

Arrays are imported exactly as stored, dtype included: no resampling and no one-step action
shift (ACT's training reader shifts real-robot actions by a step; a learner that wants that does it
itself). The files carry no timestamps, so step t is at t / fps (ACT records at 50 Hz).

Colour order: ACT's recorders hold frames as RGB and, for the compressed variant, pass them to
cv2.imencode, which takes them for BGR. cv2.imdecode undoes exactly that, so the decoded frame has
the channels in the order they were recorded (RGB); nothing is swapped here.

Every file must hold the same keys, shapes, dtypes and cameras (one store has one schema). The
files are checked before anything is written; frames are then copied a block of steps at a time
(h5py slices), so an hour of 640x480 frames never sits in memory. The store is written to
`OUT.importing` and moved to OUT only when every episode is in (robo_rl.data.outputs): a failed
import leaves OUT as it was, and overwrite replaces only an existing store, never a file or another
folder. A dataset h5py cannot read (a corrupt chunk) is one error line naming file and dataset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np

from robo_rl.data.codecs import decode_jpeg
from robo_rl.data.outputs import check_destination, new_store
from robo_rl.data.schema import IMAGE_PREFIX, EpisodeMeta, Schema, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

# HDF5 dataset -> store key, and whether a file must have it.
LOWDIM_DATASETS = {
    "/observations/qpos": ("obs/qpos", True),
    "/observations/qvel": ("obs/qvel", False),
    "/observations/effort": ("obs/effort", False),
    "/action": ("action", True),
    "/base_action": ("base_action", False),
}
IMAGES_GROUP = "/observations/images"
COMPRESS_LEN = "/compress_len"
BLOCK_STEPS = 64  # steps read from HDF5 and handed to the store at once: bounded memory


@dataclass
class CameraLayout:
    """One camera of one file: where its frames are and how they are stored."""

    dataset: str
    compressed: bool
    frame_shape: tuple[int, ...]  # (H, W, C) as stored in the store (decoded, for JPEG)


@dataclass
class EpisodeFile:
    """What the check of one file found: enough to write it without looking again."""

    path: Path
    steps: int
    lowdim: dict[str, tuple[str, tuple[int, ...], str]]  # store key -> (HDF5 dataset, per-step shape, dtype)
    cameras: dict[str, CameraLayout] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)  # sim, and compress where the file has it

    def signature(self) -> dict[str, Any]:
        """What must match across files for them to share one store."""
        keys = {k: (shape, dtype) for k, (_, shape, dtype) in self.lowdim.items()}
        keys.update({IMAGE_PREFIX + cam: (c.frame_shape, "uint8") for cam, c in self.cameras.items()})
        return dict(sorted(keys.items()))


def episode_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files to import: a directory's `*.hdf5` in numeric order (episode_2 before episode_10),
    files as given."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.hdf5"), key=_numeric_order)
            if not found:
                raise ConfigError(f"{p}: no .hdf5 files in this directory; give a folder of episode_<n>.hdf5 files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"{p}: does not exist; give a folder of episode_<n>.hdf5 files, or the files")
    if not files:
        raise ConfigError("no episode files given; give a folder of episode_<n>.hdf5 files, or the files")
    return files


def _numeric_order(path: Path) -> tuple:
    digits = re.findall(r"\d+", path.stem)
    return (0, int(digits[-1]), path.name) if digits else (1, 0, path.name)


def inspect_file(path: Path) -> EpisodeFile:
    """Check one episode file's layout and values; every problem is one line naming file and field."""
    where = str(path)  # the path as given: two folders may both hold an episode_0.hdf5
    if not h5py.is_hdf5(path):
        raise ConfigError(f"{where}: not an HDF5 file")
    try:
        h5 = h5py.File(path, "r")
    except OSError as e:
        raise ConfigError(f"{where}: not a readable HDF5 file ({e})") from None
    with h5:
        for dataset, (_, required) in LOWDIM_DATASETS.items():
            if required and dataset not in h5:
                raise ConfigError(f"{where}: no {dataset}; an ACT episode has /observations/qpos and /action")
        qpos = _dataset(h5, where, "/observations/qpos")
        if qpos.ndim != 2:  # checked before its length is taken as the episode's
            raise ConfigError(f"{where}: /observations/qpos has shape {qpos.shape}; expected (T, dims)")
        steps = qpos.shape[0]
        if steps == 0:
            raise ConfigError(f"{where}: /observations/qpos has 0 steps")
        lowdim = {}
        for dataset, (key, _) in LOWDIM_DATASETS.items():
            if dataset not in h5:
                continue
            d = _dataset(h5, where, dataset)
            if d.ndim != 2:
                raise ConfigError(f"{where}: {dataset} has shape {d.shape}; expected (T, dims)")
            if d.shape[0] != steps:
                raise ConfigError(f"{where}: {dataset} has {d.shape[0]} steps, /observations/qpos {steps}")
            if d.dtype.kind not in "fiu":
                raise ConfigError(f"{where}: {dataset} has dtype {d.dtype}; expected numbers")
            values = read_dataset(d, where, dataset, ())  # low-dimensional: small enough to check whole
            if d.dtype.kind == "f" and not np.isfinite(values).all():
                t = int(np.argwhere(~np.isfinite(values))[0][0])
                raise ConfigError(f"{where}: {dataset} holds NaN or inf at step {t}")
            lowdim[key] = (dataset, d.shape[1:], d.dtype.name)
        cameras: dict[str, CameraLayout] = {}
        if IMAGES_GROUP in h5:
            group = h5[IMAGES_GROUP]
            if not isinstance(group, h5py.Group):
                raise ConfigError(f"{where}: {IMAGES_GROUP} is not a group of camera datasets")
            for cam in group:
                cameras[cam] = _camera(h5, where, cam, steps)
        attrs = {"sim": bool(h5.attrs.get("sim", False))}
        if "compress" in h5.attrs:
            attrs["compress"] = bool(h5.attrs["compress"])
    return EpisodeFile(path, steps, lowdim, cameras, attrs)


def read_dataset(d: Any, where: str, dataset: str, selection: Any) -> np.ndarray:
    """`d[selection]`, with h5py's read errors (a chunk that does not decompress, a truncated file)
    as one line naming the file and the dataset."""
    try:
        return d[selection]
    except (OSError, RuntimeError) as e:
        reason = " ".join(str(e).split())
        raise ConfigError(f"{where}: {dataset}: cannot read ({reason})") from None


def _dataset(h5: Any, where: str, dataset: str) -> Any:
    d = h5[dataset]
    if not isinstance(d, h5py.Dataset):
        raise ConfigError(f"{where}: {dataset} is a group, expected a dataset")
    return d


def _camera(h5: Any, where: str, cam: str, steps: int) -> CameraLayout:
    dataset = f"{IMAGES_GROUP}/{cam}"
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", cam):
        raise ConfigError(f"{where}: {dataset}: a camera name is letters, digits, _ . - (it becomes a store key)")
    d = _dataset(h5, where, dataset)
    if d.dtype != np.uint8:
        raise ConfigError(f"{where}: {dataset} has dtype {d.dtype}; expected uint8 frames or JPEG bytes")
    if d.ndim not in (2, 4):
        raise ConfigError(f"{where}: {dataset} has shape {d.shape}; expected (T, H, W, 3) frames or (T, bytes) JPEGs")
    if d.shape[0] != steps:
        raise ConfigError(f"{where}: {dataset} has {d.shape[0]} frames, /observations/qpos {steps} steps")
    if d.ndim == 4:
        if d.shape[3] not in (1, 3):
            raise ConfigError(f"{where}: {dataset} has shape {d.shape}; expected (T, H, W, 3) or (T, H, W, 1)")
        return CameraLayout(dataset, False, tuple(d.shape[1:]))
    if COMPRESS_LEN not in h5:
        raise ConfigError(f"{where}: {dataset} holds JPEG rows but the file has no {COMPRESS_LEN}; "
                          "a compressed ACT episode has both")
    lengths = h5[COMPRESS_LEN]
    if lengths.ndim != 2 or lengths.shape[1] != steps:
        raise ConfigError(f"{where}: {COMPRESS_LEN} has shape {lengths.shape}; expected (cameras, {steps})")
    first = decode_jpeg(read_dataset(d, where, dataset, 0), where, dataset, 0)
    return CameraLayout(dataset, True, first.shape)


def import_hdf5(paths: Sequence[str | Path], out: str | Path, *, fps: float = 50.0, task: str = "",
                robot: str = "aloha", overwrite: bool = False, progress: bool = True,
                train_image_size: Sequence[int] | None = None) -> EpisodeStore:
    """Every episode file under `paths` (folders and/or files) into a new store at `out`, opened
    read-only; all or nothing. Each file is one episode, labelled TELEOP, with source
    `hdf5:<file name>` and extra {"sim": ..., "file": <file name>} (plus "compress" where set)."""
    from tqdm import tqdm

    if not fps or fps <= 0:
        raise ConfigError(f"fps={fps}: the episodes' rate must be positive (ACT records at 50)")
    out = check_destination(out, overwrite, sources=paths)  # a file, a source, or a folder not a store: refused
    files = [inspect_file(f) for f in episode_files(paths)]  # every check before anything is written
    first = files[0]
    for f in files[1:]:
        if f.signature() != first.signature():
            raise ConfigError(f"{f.path}: holds {_describe(f.signature())}, but {first.path} holds "
                              f"{_describe(first.signature())}; every episode of a store has the same keys")
    schema = Schema.build(first.signature(), fps=fps, robot=robot, cameras=sorted(first.cameras))
    with new_store(out, schema, train_image_size) as store:  # OUT.importing, renamed to OUT only when every episode is in
        for f in tqdm(files, desc="import-hdf5", unit="episode", disable=not progress):
            _write_episode(store, f, fps, task)
    return EpisodeStore.open(out)


def _write_episode(store: EpisodeStore, f: EpisodeFile, fps: float, task: str) -> None:
    where = str(f.path)
    meta = EpisodeMeta(task=task, source=f"hdf5:{f.path.name}", extra={**f.attrs, "file": f.path.name})
    writer = store.begin_episode(meta)
    with h5py.File(f.path, "r") as h5:
        for a in range(0, f.steps, BLOCK_STEPS):
            b = min(f.steps, a + BLOCK_STEPS)
            block = {key: read_dataset(h5[dataset], where, dataset, np.s_[a:b])
                     for key, (dataset, _, _) in f.lowdim.items()}
            for cam, layout in f.cameras.items():
                rows = read_dataset(h5[layout.dataset], where, layout.dataset, np.s_[a:b])
                if layout.compressed:
                    frames = [decode_jpeg(row, where, layout.dataset, a + i) for i, row in enumerate(rows)]
                    for i, frame in enumerate(frames):
                        if frame.shape != layout.frame_shape:
                            raise ConfigError(f"{where}: {layout.dataset} frame {a + i} is {frame.shape}, frame 0 "
                                              f"{layout.frame_shape}; a camera's frames have one size")
                    rows = np.stack(frames)
                block[IMAGE_PREFIX + cam] = rows
            writer.add_block(block, np.arange(a, b) / fps, Segment.TELEOP)
    writer.commit()


def _describe(signature: dict[str, Any]) -> str:
    return ", ".join(f"{k} {tuple(shape)} {dtype}" for k, (shape, dtype) in signature.items())
