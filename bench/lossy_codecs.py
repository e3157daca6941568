"""Lossy frame storage for real cameras: which codec, at which setting?

Frames: MuJoCo renders of the table-top scene at 480x640 plus Gaussian sensor noise (sigma 3,
clipped), standing in for a real camera (`bench/image_codecs.py` makes both). Candidates, each
frame or chunk decodable on its own so random access stays cheap:
  jpeg q=Q       per-frame JPEG (Pillow's libjpeg-turbo), quality Q
  h264 crf=C g=G short-GOP H.264 chunks of G frames (PyAV, libx264 `ultrafast`, one thread),
                 each chunk a stream of its own: a frame costs decoding its chunk up to it
Columns, per camera frame: bytes; MB per minute for three cameras at 30 fps (the issue's target
is <= 300); PSNR against the noisy frame the camera gave (>= 35 dB wanted) and against the clean
render; encode ms on one thread, and the share of one core that three 30 fps cameras take;
random-access decode ms of one frame.

    python bench/lossy_codecs.py [--frames 64]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_kind, make_console, table  # noqa: E402
from image_codecs import add_sensor_noise, render_frames  # noqa: E402

from robo_rl.data.codecs import psnr  # noqa: E402

FRAMES_PER_MINUTE = 3 * 30 * 60  # three cameras at 30 fps


def jpeg(frames: np.ndarray, quality: int) -> tuple[list[bytes], float, callable]:
    from PIL import Image

    t = time.perf_counter()
    blobs = []
    for f in frames:
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="JPEG", quality=quality)
        blobs.append(buf.getvalue())
    enc = (time.perf_counter() - t) / len(frames)

    def decode(i: int) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(blobs[i])).convert("RGB"))

    return blobs, enc, decode


def h264(frames: np.ndarray, crf: int, gop: int) -> tuple[list[bytes], float, callable]:
    import av

    h, w = frames.shape[1:3]

    def encode_chunk(chunk: np.ndarray) -> bytes:
        buf = io.BytesIO()
        with av.open(buf, "w", format="h264") as out:
            s = out.add_stream("libx264", rate=30)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.thread_count = 1
            s.options = {"crf": str(crf), "preset": "ultrafast", "g": str(gop), "bf": "0"}
            for f in chunk:
                for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                    out.mux(p)
            for p in s.encode():
                out.mux(p)
        return buf.getvalue()

    t = time.perf_counter()
    blobs = [encode_chunk(frames[i:i + gop]) for i in range(0, len(frames), gop)]
    enc = (time.perf_counter() - t) / len(frames)

    def decode(i: int) -> np.ndarray:
        with av.open(io.BytesIO(blobs[i // gop]), format="h264") as src:
            for k, frame in enumerate(src.decode(video=0)):
                if k == i % gop:
                    return frame.to_ndarray(format="rgb24")
        raise RuntimeError("frame not in its chunk")

    return blobs, enc, decode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    clean = render_frames(args.frames, 480, 640, seed=args.seed)
    noisy = add_sensor_noise(clean, 3.0, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    picks = rng.integers(0, args.frames, 16)
    candidates = {f"jpeg q={q}": (lambda q=q: jpeg(noisy, q)) for q in (50, 70, 85, 95)}
    candidates.update({f"h264 crf={c} g={g}": (lambda c=c, g=g: h264(noisy, c, g)) for c in (20, 26) for g in (8, 16)})
    t = table(f"lossy codecs, {args.frames} frames 480x640, renders + noise sigma 3 (one thread, {cpu_kind()})",
              ["codec", "KB/frame", "MB/min (3 cams, 30 fps)", "PSNR vs noisy dB", "PSNR vs clean dB",
               "encode ms/frame", "core share (90 fps)", "random frame ms"])
    raw = noisy[0].nbytes
    t.add_row("raw", f"{raw / 1e3:.0f}", f"{raw * FRAMES_PER_MINUTE / 1e6:,.0f}", "inf", f"{psnr(noisy, clean):.1f}",
              "-", "-", "-")
    for name, run in candidates.items():
        blobs, enc_s, decode = run()
        size = sum(len(b) for b in blobs) / args.frames
        decoded = np.stack([decode(i) for i in range(args.frames)])
        t0 = time.perf_counter()
        for i in picks:
            decode(int(i))
        dec_ms = (time.perf_counter() - t0) / len(picks) * 1e3
        t.add_row(name, f"{size / 1e3:.0f}", f"{size * FRAMES_PER_MINUTE / 1e6:,.0f}", f"{psnr(decoded, noisy):.1f}",
                  f"{psnr(decoded, clean):.1f}", f"{enc_s * 1e3:.1f}", f"{enc_s * 90:.0%}", f"{dec_ms:.1f}")
    make_console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
