"""MP4 (H.264) files of camera frames, written with PyAV: OpenCV cannot encode H.264 here."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError


class Mp4Writer:
    """H.264 (libx264) in MP4, yuv420p, constant frame rate; written to a .partial file and moved
    into place when complete, so a crash never leaves a truncated video under the final name."""

    def __init__(self, path: Path, fps: float, crf: int, preset: str):
        try:
            import av
        except ImportError:  # pragma: no cover - av is a dependency
            raise RoboRLError("writing video needs PyAV: pip install av") from None
        if "libx264" not in av.codecs_available:
            raise RoboRLError("this PyAV build has no libx264 encoder; install the PyPI wheel (pip install av)")
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.rate = Fraction(fps).limit_denominator(1001)
        self.crf, self.preset = crf, preset
        self._av = av
        self._container = None
        self._stream = None
        self.frames = 0

    def write(self, img: np.ndarray) -> None:
        av = self._av
        if self._container is None:
            h, w = img.shape[:2]
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._container = av.open(str(self.partial), mode="w", format="mp4")
            s = self._container.add_stream("libx264", rate=self.rate)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            s.options = {"crf": str(self.crf), "preset": self.preset}
            self._stream = s
            self.size = (h, w)
        elif img.shape[:2] != self.size:
            raise ConfigError(f"frame {self.frames} is {img.shape[1]}x{img.shape[0]}, earlier frames "
                              f"{self.size[1]}x{self.size[0]}; a video has one size")
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
        frame.pts = self.frames
        frame.time_base = 1 / self.rate
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        if self._container is None:
            raise ConfigError("no frames to write")
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - we are already failing; keep the first error
                pass
        self.partial.unlink(missing_ok=True)


def probe(path: Path) -> dict[str, Any]:
    """What the written file says about itself (container metadata, no decoding)."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {"codec": s.codec_context.name, "pix_fmt": s.codec_context.pix_fmt, "width": s.codec_context.width,
                "height": s.codec_context.height, "frames": s.frames, "fps": float(s.average_rate or 0),
                "duration_s": float(c.duration / 1e6) if c.duration else None}


# ---------------------------------------------------------------------- the verb
