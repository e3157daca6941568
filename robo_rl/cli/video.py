"""robo-rl video: an episode as an H.264 MP4, each frame labelled with its segment, step and time.

Frames come from the store's camera keys (obs/images/<camera>), several cameras tiled side by
side, or, for a store recorded without frames (or with source=render), from the MuJoCo twin: the
episode is replayed from its recorded initial state and rendered step by step. The label colour
tells who produced the step (TELEOP, POLICY, RECOVERY, CORRECTION, SCRIPTED), so RaC's
interventions stand out when scrubbing through a video.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from robo_rl.cli.app import run_store_app
from robo_rl.cli.session import episode_index, open_store
from robo_rl.cli.tables import human_bytes, print_table
from robo_rl.data.schema import IMAGE_PREFIX, SEGMENT_KEY, TIMESTAMP_KEY, Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.data.codecs import Mp4Writer, probe
from robo_rl.errors import ConfigError
from robo_rl.sim.replay import check_fits, load_episode, make_env, rendered_frames

log = logging.getLogger(__name__)

SOURCES = ("auto", "stored", "render")
READ_CHUNK = 64  # stored frames read per batch: a long episode is never held in memory whole

# Label colours (RGB): humans blue, the policy green, RaC's interventions orange (recovery) and red
# (correction), scripted experts purple.
SEGMENT_COLOURS: dict[int, tuple[int, int, int]] = {
    Segment.TELEOP: (30, 110, 230),
    Segment.POLICY: (30, 160, 70),
    Segment.RECOVERY: (245, 130, 0),
    Segment.CORRECTION: (220, 40, 40),
    Segment.SCRIPTED: (140, 70, 170),
}
UNKNOWN_COLOUR = (110, 110, 110)


def main(argv: list[str]) -> int:
    return run_store_app("video", run, argv)


# ---------------------------------------------------------------------- frames
def _rgb(img: np.ndarray) -> np.ndarray:
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img


def tile(images: list[np.ndarray]) -> np.ndarray:
    """Cameras side by side; a camera of another height is scaled to the first one's height."""
    import cv2

    h = images[0].shape[0]
    out = []
    for img in images:
        img = _rgb(img)
        if img.shape[0] != h:
            w = max(1, round(img.shape[1] * h / img.shape[0]))
            img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
        out.append(img)
    return np.ascontiguousarray(np.concatenate(out, axis=1)) if len(out) > 1 else np.ascontiguousarray(out[0])


def pad_even(img: np.ndarray) -> np.ndarray:
    """yuv420p halves the chroma planes: width and height must be even (pad one black row/column)."""
    h, w = img.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return img
    return np.pad(img, ((0, h % 2), (0, w % 2), (0, 0)))


def segment_name(value: int) -> str:
    try:
        return Segment(int(value)).name
    except ValueError:
        return f"SEGMENT {int(value)}"


def overlay(img: np.ndarray, segment: int, step: int, last_step: int, t: float) -> np.ndarray:
    """Segment label on a box of its colour (top left), step and time (bottom left), sized to the frame."""
    import cv2

    img = img.copy()
    h, w = img.shape[:2]
    font = cv2.FONT_HERSHEY_SIMPLEX
    scale = float(np.clip(min(h, w) / 400, 0.25, 1.0))
    thick = 2 if scale >= 0.7 else 1
    pad = max(2, round(4 * scale))

    def text_box(text: str, org_y_top: int | None, colour: tuple[int, int, int]) -> None:
        (tw, th), base = cv2.getTextSize(text, font, scale, thick)
        y0 = org_y_top if org_y_top is not None else h - th - base - 2 * pad
        y0 = max(0, y0)
        cv2.rectangle(img, (0, y0), (min(w - 1, tw + 2 * pad), min(h - 1, y0 + th + base + 2 * pad)), colour, -1)
        cv2.putText(img, text, (pad, y0 + pad + th), font, scale, (255, 255, 255), thick, cv2.LINE_AA)

    text_box(segment_name(segment), 0, SEGMENT_COLOURS.get(int(segment), UNKNOWN_COLOUR))
    text_box(f"step {step}/{last_step}  t={t:.2f}s", None, (0, 0, 0))
    return img


def stored_frames(store: EpisodeStore, i: int, cameras: list[str]) -> Iterator[list[np.ndarray]]:
    start, end = store.episode_range(i)
    for s in range(start, end, READ_CHUNK):
        e = min(end, s + READ_CHUNK)
        blocks = [store.read(f"{IMAGE_PREFIX}{c}", s, e) for c in cameras]
        for j in range(e - s):
            yield [b[j] for b in blocks]


def run(cfg: DictConfig) -> int:
    if cfg.source not in SOURCES:
        raise ConfigError(f"source={cfg.source!r}; choose one of {', '.join(SOURCES)}")
    cams = cfg.cameras if cfg.cameras else [cfg.camera]
    cameras = [cams] if isinstance(cams, str) else [str(c) for c in cams]
    if not cameras or any(not c for c in cameras):
        raise ConfigError("give a camera (camera=top) or several (cameras=[top,left_wrist])")
    if len(set(cameras)) != len(cameras):
        raise ConfigError(f"cameras={cameras}: a camera is listed twice")
    size = tuple(int(v) for v in cfg.image_size)
    if len(size) != 2 or min(size) < 8:
        raise ConfigError(f"image_size={list(cfg.image_size)}: give [height, width], each >= 8 pixels")
    if not 0 <= int(cfg.crf) <= 51:
        raise ConfigError(f"crf={cfg.crf}: x264 quality is 0 (lossless) .. 51 (worst); 18-28 is usual")

    store = open_store(cfg.dataset)
    with store:
        if isinstance(cfg.episode, str) and cfg.episode.lower() == "all":
            raise ConfigError("video: one episode per file; give episode=N")
        i = episode_index(store, cfg.episode)
        stored_cams = list(store.schema.cameras)
        source = cfg.source
        if source == "auto":
            source = "stored" if stored_cams else "render"
        if source == "stored":
            missing = [c for c in cameras if c not in stored_cams]
            if missing:
                have = ", ".join(stored_cams) or "none"
                raise ConfigError(f"{store.location}: no frames of camera(s) {missing} (stored cameras: {have}); "
                                  f"pick one of those, or source=render to re-render in the twin")
        fps = float(store.schema.fps)
        T = int(store.episode_lengths[i])
        lab = store.episode(i, [TIMESTAMP_KEY, SEGMENT_KEY])
        ep = env = None
        if source == "render":
            ep = load_episode(store, i, cfg.task)  # no init_state -> one-line error
            env = make_env(ep.task, cameras, size)  # unknown camera -> one-line error
            check_fits(env, ep)
        out = Path(cfg.out) if cfg.out else Path(f"{Path(store.location).name}_ep{i}.mp4")
        if out.is_dir():
            raise ConfigError(f"out={out}: is a directory; give a file name like out={out / f'episode_{i}.mp4'}")

        if cfg.source == "auto" and source == "render":
            log.info("%s holds no camera frames: re-rendering episode %d in the twin", store.location, i)
        divergence: list[float] = []
        frames = stored_frames(store, i, cameras) if source == "stored" else rendered_frames(env, ep, cameras, divergence)
        ts, seg = lab[TIMESTAMP_KEY], lab[SEGMENT_KEY]
        writer = Mp4Writer(out, fps, int(cfg.crf), str(cfg.preset))
        try:
            with tqdm(total=T, desc=f"video episode {i}", unit="frame") as bar:
                for t, imgs in enumerate(frames):
                    img = tile(imgs)
                    if cfg.overlay:
                        img = overlay(img, int(seg[t]), t, T - 1, float(ts[t] - ts[0]))
                    writer.write(pad_even(img))
                    bar.update()
            writer.close()
        except BaseException:
            writer.abort()
            raise
        finally:
            if env is not None:
                env.close()

    facts = probe(out)
    labels = {segment_name(v): int(n) for v, n in zip(*np.unique(seg, return_counts=True))}
    src = (f"stored frames ({', '.join(cameras)})" if source == "stored"
           else f"re-rendered in the twin ({', '.join(cameras)} at {size[0]}x{size[1]})")
    rows = [
        ("file", str(out)),
        ("episode", f"{i} of {store.location}"),
        ("frames from", src),
        ("codec", f"{facts['codec']} ({facts['pix_fmt']}), crf {cfg.crf}"),
        ("size", f"{facts['width']}x{facts['height']}"),
        ("frames", f"{facts['frames']} at {facts['fps']:g} fps ({T / fps:.2f} s)"),
        ("bytes", f"{out.stat().st_size} ({human_bytes(out.stat().st_size)})"),
        ("segments", ", ".join(f"{k} {v}" for k, v in labels.items())),
    ]
    if divergence:
        rows.append(("replay max joint divergence", f"{max(divergence):.2e}"))
    print_table(f"video {out}", ["", ""], rows)
    return 0
