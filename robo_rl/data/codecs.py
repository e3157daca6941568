"""Image and video codecs: every decode and encode of camera frames in one place. Frames are uint8
HWC RGB unless a function says otherwise. PyAV (`av`) and OpenCV (`cv2`) are imported where they
are used, so importing this module costs neither (Ros2Robot imports the ROS image decoder).

Still images
    rgb_from_raw, rgb_from_compressed, rgb_from_message   sensor_msgs/Image and CompressedImage (JPEG,
                                                          PNG) -> RGB: bag import and live ROS 2 cameras
    decode_image     a LeRobot `image` cell (PNG or JPEG bytes) -> the declared (H, W, C)
    decode_jpeg      an ACT/ALOHA HDF5 JPEG row (zero-padded) -> HWC in its recorded channel order
    encode_jpeg      RGB -> JPEG bytes (OpenCV, a quality): the Rerun viewer, the store's JPEG frames
    decode_frame_jpeg, jpeg_frames_codec   the store's lossy frames (a zarr v3 codec), psnr
    JpegEncoder      RGB -> JPEG bytes (PyAV's mjpeg), one encoder per camera: the sim bridge
Video
    ENCODERS, canonical_codec, encode_mp4   one episode's frames -> an mp4 in memory (AV1 or H.264,
                                            LeRobot's settings): the LeRobot export
    Mp4Writer, probe                        frames -> an H.264 mp4 file, and what a written one says
    VideoReader                             an mp4's frames by presentation time (LeRobot import)
"""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError


# ---------------------------------------------------------------------- ROS image messages
RAW_CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}


def rgb_from_raw(encoding: str, height: int, width: int, step: int, data: Any) -> np.ndarray:
    """A sensor_msgs/Image's pixels as uint8 HWC RGB (a copy: `data` may be a message buffer)."""
    channels = RAW_CHANNELS.get(encoding)
    if channels is None:
        raise ConfigError(f"image encoding {encoding!r} unsupported; use one of {sorted(RAW_CHANNELS)}")
    buf = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else np.asarray(data, np.uint8).reshape(-1)
    if height <= 0 or width <= 0 or step < width * channels or buf.size < height * step:
        raise ConfigError(f"a {width}x{height} {encoding} image with step {step} needs step >= {width * channels} and "
                          f"{height * step} bytes; it has {buf.size}")
    px = buf[:height * step].reshape(height, step)[:, :width * channels].reshape(height, width, channels)
    if channels == 1:
        return np.repeat(px, 3, axis=2)
    return (px[..., 2::-1] if encoding.startswith("bgr") else px[..., :3]).copy()


def rgb_from_compressed(data: Any, fmt: str = "") -> np.ndarray:
    """A sensor_msgs/CompressedImage (JPEG or PNG, told apart by their first bytes) as uint8 HWC RGB."""
    import av

    raw = bytes(data)
    codec = "mjpeg" if raw[:2] == b"\xff\xd8" else "png" if raw[:8] == b"\x89PNG\r\n\x1a\n" else None
    if codec is None:
        raise ConfigError(f"compressed image (format {fmt!r}) is neither JPEG nor PNG")
    try:
        frames = av.CodecContext.create(codec, "r").decode(av.Packet(raw))
    except av.FFmpegError as e:
        raise ConfigError(f"compressed image (format {fmt!r}) does not decode as {codec}: {e}") from None
    if not frames:
        raise ConfigError(f"compressed image (format {fmt!r}) holds no complete {codec} picture")
    return frames[0].to_ndarray(format="rgb24")


def rgb_from_message(msg: Any) -> np.ndarray:
    """Either image message (ours or rosbags'; told apart by Image's `encoding`) as uint8 HWC RGB."""
    if hasattr(msg, "encoding"):
        return rgb_from_raw(msg.encoding, int(msg.height), int(msg.width), int(msg.step), msg.data)
    return rgb_from_compressed(msg.data, msg.format)


# ---------------------------------------------------------------------- still images
def decode_image(cell: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """An `image` feature's cell ({bytes, path} with PNG or JPEG bytes) as uint8 (H, W, C), C the
    declared 3 (RGB; gray and alpha images are converted) or 1 (gray)."""
    import cv2

    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if not data:
        raise ConfigError(f"{where}: no image bytes in the cell (path {cell.get('path') if isinstance(cell, dict) else None!r}); "
                          "LeRobot embeds the PNG in the parquet")
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except (cv2.error, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: does not decode as an image ({e})") from None
    if img is None:
        raise ConfigError(f"{where}: does not decode as an image (not a PNG or JPEG OpenCV reads)")
    if img.dtype != np.uint8:  # a 16-bit PNG: its high byte
        img = (img >> 8).astype(np.uint8) if img.dtype == np.uint16 else img.astype(np.uint8)
    if img.ndim == 2:
        img = img[..., None]
    channels = img.shape[2]
    if shape[2] == 3:
        conversion = {1: cv2.COLOR_GRAY2RGB, 3: cv2.COLOR_BGR2RGB, 4: cv2.COLOR_BGRA2RGB}.get(channels)
    else:
        conversion = {1: None, 3: cv2.COLOR_BGR2GRAY, 4: cv2.COLOR_BGRA2GRAY}.get(channels, -1)
    if conversion == -1 or (conversion is None and channels != shape[2]):
        raise ConfigError(f"{where}: image has {channels} channels; expected {shape[2]}")
    rgb = img if conversion is None else cv2.cvtColor(img, conversion)
    rgb = rgb.reshape(*rgb.shape[:2], shape[2])
    if rgb.shape != shape:
        raise ConfigError(f"{where}: image is {rgb.shape[1]}x{rgb.shape[0]}; info.json declares "
                          f"{shape[1]}x{shape[0]}")
    return rgb


def decode_jpeg(row: np.ndarray, where: str, dataset: str, step: int) -> np.ndarray:
    """One zero-padded JPEG row as HWC in its recorded channel order. The padding is not cut off
    with /compress_len: its rows follow the recorder's camera list, which the file does not keep,
    and the decoder stops at the JPEG's end marker anyway (act-plus-plus reads it the same way)."""
    import cv2

    frame = cv2.imdecode(np.ascontiguousarray(row, dtype=np.uint8), cv2.IMREAD_COLOR)
    if frame is None:
        raise ConfigError(f"{where}: {dataset} frame {step}: JPEG does not decode")
    return frame


def resize_rgb(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An HWC frame resized to (height, width) by area averaging (OpenCV). The one resize between
    a camera and a policy: the store's training-size copies and the robot's live frames go through
    it alike, so a policy sees at deployment what it was trained on."""
    import cv2

    h, w = int(size[0]), int(size[1])
    if img.shape[:2] == (h, w):
        return img
    src = np.ascontiguousarray(img)
    fh, fw = img.shape[0] // h, img.shape[1] // w
    if fh >= 2 and fw >= 2 and img.shape[0] % fh == 0 and img.shape[1] % fw == 0:
        # whole-factor area averaging first (OpenCV's fast path), then the rest: 640x480 -> 96x96
        # in 0.5 ms instead of 1.2 ms (AMD EPYC, AVX2)
        src = cv2.resize(src, (img.shape[1] // fw, img.shape[0] // fh), interpolation=cv2.INTER_AREA)
    out = cv2.resize(src, (w, h), interpolation=cv2.INTER_AREA)
    return out.reshape(h, w, *img.shape[2:])  # OpenCV drops a trailing channel axis of 1


def encode_jpeg(frame: np.ndarray, quality: int) -> bytes:
    import cv2

    img = frame[..., 0] if frame.shape[-1] == 1 else cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)  # cv2 writes BGR
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ConfigError(f"could not JPEG-encode a frame of shape {frame.shape}")
    return buf.tobytes()


class JpegEncoder:
    """RGB frames -> JPEG bytes (PyAV's mjpeg), one encoder per camera."""

    def __init__(self, height: int, width: int):
        import av

        self._av = av
        self._ctx = av.CodecContext.create("mjpeg", "w")
        self._ctx.width, self._ctx.height, self._ctx.pix_fmt = width, height, "yuvj420p"
        self._ctx.time_base = Fraction(1, 1000)
        self._pts = 0

    def encode(self, rgb: np.ndarray) -> bytes:
        frame = self._av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuvj420p")
        frame.pts = self._pts
        self._pts += 1
        return b"".join(bytes(p) for p in self._ctx.encode(frame))


# ---------------------------------------------------------------------- video: encode
# Codec names accepted -> (PyAV encoder, options beside crf and g). LeRobot's encoder uses g=2 (a
# keyframe every other frame, for fast random access) and svt-av1 preset 12; so do we. H.264 goes
# without B-frames: Rerun's LeRobot reader (and other streaming decoders) cannot play them untranscoded.
ENCODERS = {"libsvtav1": ("libsvtav1", {"preset": "12"}), "h264": ("libx264", {"bf": "0"})}
CODEC_ALIASES = {"av1": "libsvtav1", "svtav1": "libsvtav1", "libx264": "h264"}
CRF_RANGE = {"libsvtav1": (0, 63), "h264": (0, 51)}
GOP = 2


def canonical_codec(codec: str) -> str:
    name = CODEC_ALIASES.get(str(codec).lower(), str(codec).lower())
    if name not in ENCODERS:
        raise ConfigError(f"codec {codec!r} unknown; choose one of {', '.join(ENCODERS)}")
    return name


def encode_mp4(frames: Iterator[np.ndarray], fps: int, codec: str, crf: int, height: int, width: int) -> bytes:
    """One episode's frames as an mp4 in memory; a fresh encoder, so its first frame is a keyframe."""
    import av

    encoder, options = ENCODERS[codec]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(encoder, rate=fps, options={**options, "crf": str(crf), "g": str(GOP)})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        k = 0
        for block in frames:
            for img in block:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
                frame.pts = k
                k += 1
                for packet in stream.encode(frame):
                    container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


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


# ---------------------------------------------------------------------- video: decode
SEEK_AHEAD_S = 2.0  # a video time further ahead than this is sought, not decoded up to


class VideoReader:
    """Frames of one mp4 by presentation time, decoded with PyAV (AV1 through libdav1d, H.264, ...).
    Reading goes forward through the file; a time behind the decoder, or far ahead of it, seeks to
    the keyframe before it first."""

    def __init__(self, path: Path, feature: str, fps: float, shape: tuple[int, ...] | None = None):
        import av

        self.path, self.feature, self.shape = path, feature, shape
        self.half_frame = 0.5 / fps  # a frame matches a time when its pts is within half a period
        try:
            self._container = av.open(str(path))
        except (av.FFmpegError, OSError) as e:
            raise ConfigError(f"{path}: {feature}: cannot open as a video ({e})") from None
        if not self._container.streams.video:
            self._container.close()
            raise ConfigError(f"{path}: {feature}: holds no video stream")
        self._stream = self._container.streams.video[0]
        self._stream.thread_type = "AUTO"
        self._av = av
        self._frames: Iterator[Any] = self._container.decode(self._stream)
        self._frame = None  # the newest decoded frame

    def _seek(self, t: float) -> None:
        # to the keyframe before a point a second early: frames before `t` are decoded and skipped
        self._container.seek(max(0, int((t - 1.0) / self._stream.time_base)), stream=self._stream, backward=True)
        self._frames = self._container.decode(self._stream)
        self._frame = None

    def frame_at(self, t: float, where: str) -> np.ndarray:
        """The frame shown at `t` seconds, as uint8 (H, W, 3) RGB."""
        behind = self._frame.time if self._frame is not None else 0.0
        if behind > t + self.half_frame or t - behind > SEEK_AHEAD_S:
            self._seek(t)
        while self._frame is None or self._frame.time < t - self.half_frame:
            try:
                self._frame = next(self._frames)
            except StopIteration:
                last = f"its last frame is at {self._frame.time:.3f} s" if self._frame is not None else "it has no frame there"
                raise ConfigError(f"{self.path}: {self.feature}: {where} needs the frame at {t:.3f} s, but the "
                                  f"video ends before it ({last}); it has fewer frames than the episode has steps") from None
            except self._av.FFmpegError as e:
                raise ConfigError(f"{self.path}: {self.feature}: does not decode near {t:.3f} s ({e})") from None
            if self._frame.time is None:
                raise ConfigError(f"{self.path}: {self.feature}: a frame without a presentation time")
        if self._frame.time > t + self.half_frame:
            raise ConfigError(f"{self.path}: {self.feature}: {where} needs the frame at {t:.3f} s; the nearest is at "
                              f"{self._frame.time:.3f} s")
        rgb = self._frame.to_ndarray(format="rgb24")
        if self.shape is not None and rgb.shape != self.shape:
            raise ConfigError(f"{self.path}: {self.feature}: frames are {rgb.shape[1]}x{rgb.shape[0]}; info.json "
                              f"features.{self.feature}.shape declares {self.shape[1]}x{self.shape[0]}")
        return rgb

    def close(self) -> None:
        self._container.close()


# ---------------------------------------------------------------------- the store's lossy frames
def _zarr_jpeg_codec():
    """JpegFrames, built on first use: zarr's codec classes are only needed by the store."""
    from dataclasses import dataclass

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.common import parse_named_configuration

    @dataclass(frozen=True)
    class JpegFrames(ArrayBytesCodec):
        """A chunk of camera frames (N, H, W, 3) uint8 as N independent JPEGs (OpenCV's
        libjpeg-turbo, 4:2:0 at `quality`): a frame decodes alone, so a random read stays one
        frame's work. Layout: N as uint32, N uint32 lengths, the N JPEG streams. A frame of zeros
        (the store's row for a repeated frame) is a stream of length 0. Chosen by measurement for
        real cameras (bench/lossy_codecs.py, docs/results.md)."""

        is_fixed_size = False
        quality: int = 85

        def __init__(self, *, quality: int = 85) -> None:
            object.__setattr__(self, "quality", int(quality))

        @classmethod
        def from_dict(cls, data):
            _, config = parse_named_configuration(data, JPEG_CODEC_NAME, require_configuration=False)
            return cls(**(config or {}))

        def to_dict(self):
            return {"name": JPEG_CODEC_NAME, "configuration": {"quality": self.quality}}

        def _encode_sync(self, chunk_array, chunk_spec):
            frames = np.asarray(chunk_array.as_numpy_array())
            blobs = [encode_jpeg(f, self.quality) if f.any() else b"" for f in frames]
            header = np.array([len(blobs), *(len(b) for b in blobs)], dtype="<u4").tobytes()
            return chunk_spec.prototype.buffer.from_bytes(header + b"".join(blobs))

        async def _encode_single(self, chunk_array, chunk_spec):
            return self._encode_sync(chunk_array, chunk_spec)

        def _decode_sync(self, chunk_bytes, chunk_spec):
            raw = chunk_bytes.to_bytes()
            n = int(np.frombuffer(raw, "<u4", 1)[0])
            lengths = np.frombuffer(raw, "<u4", n, 4)
            at = 4 * (n + 1)
            out = np.zeros(chunk_spec.shape, dtype=np.uint8)
            for i, length in enumerate(lengths):
                if length:
                    out[i] = decode_frame_jpeg(raw[at:at + int(length)]).reshape(out.shape[1:])
                at += int(length)
            return chunk_spec.prototype.nd_buffer.from_numpy_array(out)

        async def _decode_single(self, chunk_bytes, chunk_spec):
            return self._decode_sync(chunk_bytes, chunk_spec)

        def compute_encoded_size(self, input_byte_length, chunk_spec):
            raise NotImplementedError("JPEG sizes depend on the frames")

    return JpegFrames


JPEG_CODEC_NAME = "robo_rl.jpeg_frames"
_JPEG_CLASS = None


def jpeg_frames_codec(quality: int = 85):
    """The store's lossy frame codec (a zarr v3 array-to-bytes codec, registered with zarr on
    first use so a store written with it opens anywhere robo_rl is imported)."""
    global _JPEG_CLASS
    if _JPEG_CLASS is None:
        from zarr.registry import register_codec

        _JPEG_CLASS = _zarr_jpeg_codec()
        register_codec(JPEG_CODEC_NAME, _JPEG_CLASS)
    if not 1 <= int(quality) <= 100:
        raise ConfigError(f"image_quality={quality}: JPEG quality is 1..100")
    return _JPEG_CLASS(quality=quality)


def decode_frame_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes -> an RGB frame (OpenCV)."""
    import cv2

    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise RoboRLError("a stored JPEG frame does not decode (the store is damaged)")
    return bgr[..., ::-1]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images or stacks, dB (inf when equal)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float(10 * np.log10(255.0 ** 2 / mse)) if mse > 0 else float("inf")
