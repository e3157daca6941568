"""ACT / ALOHA HDF5 import: files written with h5py in ACT's own layout (raw frames, JPEG rows with
compress_len, gzip-filtered frames) become stores holding exactly what the files hold."""

from __future__ import annotations

from pathlib import Path

import cv2
import h5py
import numpy as np
import pytest
from conftest import robo_rl_cli

from robo_rl.data.aloha_hdf5 import import_hdf5
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

CAMERAS = ("top", "left_wrist")
FRAME_HW = (24, 32)
JPEG_QUALITY = 50  # what mobile-aloha's recorder uses


def frames_for(rng: np.random.Generator, steps: int, cam: int) -> np.ndarray:
    """RGB frames with a smooth gradient, a per-camera colour cast and a little noise (JPEG-friendly)."""
    y, x = np.mgrid[: FRAME_HW[0], : FRAME_HW[1]]
    base = np.stack([4 * x + 60 * cam, 6 * y, np.full_like(x, 200 - 80 * cam)], axis=-1)
    moving = base[None] + 3 * np.arange(steps)[:, None, None, None]
    return np.clip(moving + rng.integers(0, 8, size=moving.shape), 0, 255).astype(np.uint8)


def write_act_episode(path: Path, steps: int, seed: int, *, images: str = "raw", sim: bool | None = False,
                      effort: bool = False, base_action: bool = False) -> dict[str, np.ndarray]:
    """One episode as ACT's record_episodes writes it; returns {store key: what the store should hold}.

    images: raw (T, H, W, 3) | gzip (the same, gzip-filtered) | jpeg (cv2 JPEG rows, zero-padded,
    with /compress_len). dtype is given explicitly: ACT leaves it out and gets h5py's float32 default.
    """
    rng = np.random.default_rng(seed)
    arrays = {"/observations/qpos": rng.standard_normal((steps, 14)).astype(np.float32),
              "/observations/qvel": rng.standard_normal((steps, 14)).astype(np.float32),
              "/action": rng.standard_normal((steps, 14)).astype(np.float32)}
    if effort:
        arrays["/observations/effort"] = rng.standard_normal((steps, 14)).astype(np.float32)
    if base_action:
        arrays["/base_action"] = rng.standard_normal((steps, 2)).astype(np.float32)
    expected = {"obs/qpos": arrays["/observations/qpos"], "obs/qvel": arrays["/observations/qvel"],
                "action": arrays["/action"]}
    if effort:
        expected["obs/effort"] = arrays["/observations/effort"]
    if base_action:
        expected["base_action"] = arrays["/base_action"]
    with h5py.File(path, "w", rdcc_nbytes=1024 ** 2 * 2) as root:
        if sim is not None:
            root.attrs["sim"] = sim
        if images == "jpeg":
            root.attrs["compress"] = True
        obs = root.create_group("observations")
        image = obs.create_group("images")
        encoded_lengths = []
        for c, cam in enumerate(CAMERAS):
            frames = frames_for(rng, steps, c)
            if images == "jpeg":
                encoded = [cv2.imencode(".jpg", f, [int(cv2.IMWRITE_JPEG_QUALITY), JPEG_QUALITY])[1].ravel()
                           for f in frames]
                padded = max(len(e) for e in encoded)
                rows = np.zeros((steps, padded), np.uint8)
                for t, e in enumerate(encoded):
                    rows[t, : len(e)] = e
                image.create_dataset(cam, (steps, padded), dtype="uint8", chunks=(1, padded))[...] = rows
                encoded_lengths.append([len(e) for e in encoded])
                expected[f"obs/images/{cam}"] = np.stack([cv2.imdecode(e, 1) for e in encoded])
                expected[f"original/{cam}"] = frames
            else:
                extra = {"compression": "gzip", "compression_opts": 4} if images == "gzip" else {}
                image.create_dataset(cam, (steps, *FRAME_HW, 3), dtype="uint8", chunks=(1, *FRAME_HW, 3),
                                     **extra)[...] = frames
                expected[f"obs/images/{cam}"] = frames
        for name, values in arrays.items():
            root.create_dataset(name, values.shape, dtype="f4")[...] = values
        if images == "jpeg":
            root.create_dataset("compress_len", (len(CAMERAS), steps), dtype="f4")[...] = np.array(encoded_lengths)
    return expected


def assert_episode_holds(store: EpisodeStore, i: int, expected: dict[str, np.ndarray], fps: float = 50.0) -> None:
    got = store.episode(i)
    for key, want in expected.items():
        if key.startswith("original/"):
            continue
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, (i, key, got[key].dtype, got[key].shape)
        assert np.array_equal(got[key], want), f"episode {i} key {key} differs"
    steps = len(expected["action"])
    assert np.array_equal(got["timestamp"], np.arange(steps) / fps)
    assert (got["segment"] == 0).all()  # TELEOP


def test_raw_episodes_import_exactly_in_numeric_order(tmp_path):
    src = tmp_path / "sim_transfer_cube"
    src.mkdir()
    # written out of order, and sim missing on one file (readers take it as False)
    expected = {n: write_act_episode(src / f"episode_{n}.hdf5", steps, seed=n, sim=sim)
                for n, steps, sim in ((10, 40, True), (2, 20, True), (1, 30, None))}
    store = import_hdf5([src], tmp_path / "store", task="transfer_cube", progress=False)
    assert not store.writable and store.n_episodes == 3
    assert [m.extra["file"] for m in store.metas] == ["episode_1.hdf5", "episode_2.hdf5", "episode_10.hdf5"]
    assert [m.extra["sim"] for m in store.metas] == [False, True, True]
    assert store.metas[0].source == "hdf5:episode_1.hdf5" and store.metas[0].task == "transfer_cube"
    assert "compress" not in store.metas[0].extra
    assert store.schema.cameras == sorted(CAMERAS) and store.schema.robot == "aloha" and store.schema.fps == 50
    assert set(store.schema.keys) == {"obs/qpos", "obs/qvel", "action", "obs/images/top", "obs/images/left_wrist"}
    for i, n in enumerate((1, 2, 10)):
        assert_episode_holds(store, i, expected[n])
    assert store.validate() == []


def test_jpeg_episodes_via_the_cli_decode_as_cv2_does(tmp_path):
    src = tmp_path / "aloha_real"
    src.mkdir()
    expected = [write_act_episode(src / f"episode_{n}.hdf5", 25 + 5 * n, seed=100 + n, images="jpeg",
                                  effort=True, base_action=True) for n in range(3)]
    out = tmp_path / "store"
    r = robo_rl_cli("dataset", "import-hdf5", str(src), str(out), "fps=30")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == \
        f"{out}: 3 episode(s), {25 + 30 + 35} steps at 30 fps, cameras left_wrist, top"
    store = EpisodeStore.open(out)
    assert store.metas[1].extra == {"sim": False, "compress": True, "file": "episode_1.hdf5"}
    assert {"obs/effort", "base_action"} <= set(store.schema.keys)
    for i, want in enumerate(expected):
        assert_episode_holds(store, i, want, fps=30.0)
        for cam in CAMERAS:  # the recorded channel order survives the cv2 round trip: close to the original
            error = np.abs(store.episode(i)[f"obs/images/{cam}"].astype(int) - want[f"original/{cam}"]).mean()
            assert error < 6, (cam, error)


def test_imported_frames_keep_training_size_copies_as_recorded_ones_do(tmp_path):
    """image_size: the frames stay at full size and each gets a copy at that size, the one train
    reads (so a 480x640 import trains at the recipe's 96x96, not 33x the pixels); frames no larger
    than it get none, and a bad size is one line."""
    from robo_rl.data.codecs import resize_rgb

    src = tmp_path / "act"
    src.mkdir()
    want = write_act_episode(src / "episode_0.hdf5", 12, seed=3)
    out = tmp_path / "store"
    r = robo_rl_cli("dataset", "import-hdf5", str(src), str(out), "image_size=[12,16]")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith("(full size, with 12x16 copies that train reads)")
    store = EpisodeStore.open(out)
    assert store.train_image_size == (12, 16)
    for cam in CAMERAS:
        full = store.read(f"obs/images/{cam}")
        assert full.shape == (12, *FRAME_HW, 3) and np.array_equal(full, want[f"obs/images/{cam}"])
        small = store.read(f"obs/images/{cam}", small=True)
        assert np.array_equal(small, np.stack([resize_rgb(f, (12, 16)) for f in full]))
    # the default (the recipe's 96x96) is larger than these 24x32 frames: no copies
    assert import_hdf5([src], tmp_path / "plain", progress=False, train_image_size=(96, 96)).train_image_size is None
    bad = robo_rl_cli("dataset", "import-hdf5", str(src), str(tmp_path / "bad"), "image_size=[4,4]")
    assert bad.returncode != 0 and "image_size=[4, 4] must be at least 8 px" in bad.stderr + bad.stdout
    assert not (tmp_path / "bad").exists()


def test_gzip_filtered_files_given_one_by_one_keep_their_order(tmp_path):
    files = [tmp_path / "episode_7.hdf5", tmp_path / "episode_3.hdf5"]
    expected = [write_act_episode(f, 22, seed=7 - i, images="gzip", sim=True, effort=True) for i, f in enumerate(files)]
    store = import_hdf5(files, tmp_path / "store", progress=False)
    assert [m.extra["file"] for m in store.metas] == ["episode_7.hdf5", "episode_3.hdf5"]
    for i, want in enumerate(expected):
        assert_episode_holds(store, i, want)
    # an existing store is refused, then replaced on request
    with pytest.raises(ConfigError, match="already exists"):
        import_hdf5(files[:1], tmp_path / "store", progress=False)
    assert import_hdf5(files[:1], tmp_path / "store", overwrite=True, progress=False).n_episodes == 1


def spoil(path: Path, case: str) -> None:
    """Turn a good episode file into one with the given fault."""
    if case == "not_hdf5":
        path.write_text("this is not HDF5\n")
        return
    with h5py.File(path, "r+") as root:
        steps = root["/action"].shape[0]
        if case == "no_action":
            del root["/action"]
        elif case == "length_mismatch":
            values = root["/action"][: steps - 1]
            del root["/action"]
            root["/action"] = values
        elif case == "qpos_ndim":
            values = root["/observations/qpos"][:, 0]
            del root["/observations/qpos"]
            root["/observations/qpos"] = values
        elif case == "frame_count":
            values = root["/observations/images/top"][: steps - 2]
            del root["/observations/images/top"]
            root["/observations/images/top"] = values
        elif case == "no_compress_len":
            del root["/compress_len"]
        elif case == "bad_jpeg":  # frame 5: found only while writing, after episode_0 is in the store
            junk = np.frombuffer(b"\xff\xd8\xff\xe0not a jpeg", np.uint8)
            row = np.zeros(root["/observations/images/top"].shape[1], np.uint8)
            row[: len(junk)] = junk
            root["/observations/images/top"][5] = row
        elif case == "nan_qpos":
            root["/observations/qpos"][3, 2] = np.nan
        elif case == "nan_action":
            root["/action"][7, 0] = np.inf
        elif case == "other_cameras":
            del root["/observations/images/left_wrist"]
        else:
            raise AssertionError(case)


BAD_INPUTS = {  # case -> (image layout, what the message names besides the file)
    "not_hdf5": ("raw", "not an HDF5 file"),
    "no_action": ("raw", "no /action"),
    "length_mismatch": ("raw", "/action has 19 steps"),
    "qpos_ndim": ("raw", "/observations/qpos has shape (20,)"),
    "frame_count": ("raw", "/observations/images/top has 18 frames"),
    "no_compress_len": ("jpeg", "no /compress_len"),
    "bad_jpeg": ("jpeg", "/observations/images/top frame 5: JPEG does not decode"),
    "nan_qpos": ("raw", "/observations/qpos holds NaN or inf at step 3"),
    "nan_action": ("raw", "/action holds NaN or inf at step 7"),
    "other_cameras": ("raw", "obs/images/top"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_file_is_one_line_naming_file_and_field_and_leaves_nothing(tmp_path, case):
    images, says = BAD_INPUTS[case]
    src = tmp_path / "src"
    src.mkdir()
    write_act_episode(src / "episode_0.hdf5", 20, seed=0, images=images)
    write_act_episode(src / "episode_1.hdf5", 20, seed=1, images=images)
    spoil(src / "episode_1.hdf5", case)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        import_hdf5([src], out, progress=False)
    message = str(err.value)
    assert message.startswith(f"{src / 'episode_1.hdf5'}: ") and says in message and "\n" not in message, message
    assert not out.exists() and not list(tmp_path.glob("*.importing"))


def test_cli_bad_input_is_one_error_line_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = robo_rl_cli("dataset", "import-hdf5", str(empty), str(tmp_path / "a"))
    assert r.returncode == 2 and r.stderr.strip() == f"error: {empty}: no .hdf5 files in this directory; " \
        "give a folder of episode_<n>.hdf5 files", r.stderr
    src = tmp_path / "src"
    src.mkdir()
    for n in range(2):
        write_act_episode(src / f"episode_{n}.hdf5", 20, seed=n, images="jpeg")
    spoil(src / "episode_1.hdf5", "bad_jpeg")
    r = robo_rl_cli("dataset", "import-hdf5", str(src), str(tmp_path / "b"))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert errors[0] == f"error: {src / 'episode_1.hdf5'}: /observations/images/top frame 5: JPEG does not decode"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not list(tmp_path.glob("*.importing"))


def corrupt_chunk(path: Path, dataset: str, step: int = 0) -> None:
    """Overwrite bytes in the middle of the gzip chunk holding `step`: it no longer decompresses."""
    with h5py.File(path, "r") as root:
        d = root[dataset]
        assert d.compression == "gzip"
        info = d.id.get_chunk_info(step // d.chunks[0])
        offset, size = info.byte_offset, info.size
    with open(path, "r+b") as f:
        f.seek(offset + size // 3)
        f.write(b"\x00\xff" * max(4, size // 6))


@pytest.mark.parametrize("dataset, step", [("/observations/images/top", 7), ("/action", 0)])
def test_a_chunk_that_does_not_decompress_is_one_line(tmp_path, dataset, step):
    """Frames are first read while writing, low-dimensional arrays while checking: both say file and dataset."""
    src = tmp_path / "src"
    src.mkdir()
    write_act_episode(src / "episode_0.hdf5", 20, seed=0, images="gzip")
    write_act_episode(src / "episode_1.hdf5", 20, seed=1, images="gzip")
    bad = src / "episode_1.hdf5"
    if dataset == "/action":  # ACT leaves these unfiltered; a recorder may not
        with h5py.File(bad, "r+") as root:
            values = root["/action"][()]
            del root["/action"]
            root.create_dataset("/action", data=values, chunks=values.shape, compression="gzip")
    corrupt_chunk(bad, dataset, step)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        import_hdf5([src], out, progress=False)
    message = str(err.value)
    assert message.startswith(f"{bad}: {dataset}: cannot read (") and "\n" not in message, message
    assert not out.exists() and not list(tmp_path.glob("out.*"))


def test_a_failed_overwrite_keeps_the_old_store(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for n in range(2):
        write_act_episode(src / f"episode_{n}.hdf5", 20, seed=n, images="jpeg")
    out = tmp_path / "out"
    import_hdf5([src / "episode_0.hdf5"], out, task="old", progress=False).close()
    spoil(src / "episode_1.hdf5", "bad_jpeg")  # found only while writing, after episode_0 is in the new store
    with pytest.raises(ConfigError, match="frame 5: JPEG does not decode"):
        import_hdf5([src], out, overwrite=True, progress=False)
    with EpisodeStore.open(out) as store:
        assert store.n_episodes == 1 and store.metas[0].task == "old" and store.validate() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no out.importing, no out.old-*


def test_cli_forgotten_out_never_deletes_an_input(tmp_path):
    """`import-hdf5 ep_0.hdf5 ep_1.hdf5 overwrite=true`: the last file is taken as OUT, and refused."""
    files = [tmp_path / f"episode_{n}.hdf5" for n in range(2)]
    for n, f in enumerate(files):
        write_act_episode(f, 20, seed=n)
    before = files[1].read_bytes()
    r = robo_rl_cli("dataset", "import-hdf5", *map(str, files), "overwrite=true")
    errors = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"error: {files[1]}: is a file"), r.stderr
    assert files[1].read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode_0.hdf5", "episode_1.hdf5"]


def test_out_that_is_not_a_store_is_never_replaced(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    write_act_episode(src / "episode_0.hdf5", 20, seed=0)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me\n")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="already exists" if not overwrite else "is not a robo_rl store"):
            import_hdf5([src], notes, overwrite=overwrite, progress=False)
    # OUT `.`: the working folder, not a store: a one-line refusal, not a traceback
    monkeypatch.chdir(notes)
    with pytest.raises(ConfigError, match="is not a robo_rl store"):
        import_hdf5([src], ".", overwrite=True, progress=False)
    # OUT inside the input folder (or the input itself): refused
    with pytest.raises(ConfigError, match="overlaps"):
        import_hdf5([src], src / "store", progress=False)
    assert (notes / "todo.txt").read_text() == "keep me\n" and sorted(p.name for p in notes.iterdir()) == ["todo.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "src"]
    assert sorted(p.name for p in src.iterdir()) == ["episode_0.hdf5"]
