"""Episodes in the Rerun viewer (rerun-sdk, an optional dependency: `pip install 'robo_rl[viz]'`).

`RerunLogger` writes one recording: to an .rrd file (`save=`, for machines without a display;
open it later with `rerun FILE.rrd`) or to a viewer it spawns (`spawn=True`). Entities:

    meta                  the episode's facts (robot, fps, task, success, source, ...) as markdown
    obs/qpos, action, ... one entity per low-dimensional key, a vector of scalars per step (one
                          line per joint, named after the joints when known)
    obs/images/<camera>   camera frames (JPEG at `jpeg_quality`, or raw with jpeg_quality=None)
    segment/id            the segment label as a number (0 TELEOP, 1 POLICY, 2 RECOVERY, ...)
    segment/label         a text-log entry at each change of label: the policy / recovery /
                          correction spans show on the timeline
    events                session events of a live run (episode started, saved, ...)

on two timelines: `step` (the step index) and `time` (seconds since the episode's first step).
`log_episode` sends a stored episode column-wise (one call per key, not per step); `LiveView`
logs a running control loop from a background thread without ever blocking it.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from robo_rl.data.codecs import encode_jpeg
from robo_rl.data.schema import IMAGE_PREFIX, SEGMENT_KEY, TIMESTAMP_KEY, EpisodeMeta, Schema, Segment
from robo_rl.errors import ConfigError

if TYPE_CHECKING:
    from robo_rl.data.store import EpisodeStore

log = logging.getLogger(__name__)

NEEDS_RERUN = "the Rerun viewer needs rerun-sdk: pip install 'robo_rl[viz]' (or pip install rerun-sdk)"
JOINT_KEYS = ("obs/qpos", "obs/qvel", "action")  # keys with one value per joint: their lines get joint names
SEGMENT_ID = "segment/id"
SEGMENT_LABEL = "segment/label"
MAX_CELL = 400  # characters of one metadata value shown (a long intervention list is cut)
READ_CHUNK = 64  # stored frames read and sent per batch: a long episode is never held in memory whole

# The label colours of robo-rl video: humans blue, the policy green, RaC's recovery orange and
# correction red, scripted experts purple.
SEGMENT_COLOURS = {Segment.TELEOP: (30, 110, 230), Segment.POLICY: (30, 160, 70), Segment.RECOVERY: (245, 130, 0),
                   Segment.CORRECTION: (220, 40, 40), Segment.SCRIPTED: (140, 70, 170)}
UNKNOWN_COLOUR = (110, 110, 110)


def import_rerun() -> Any:
    """The rerun module, or a one-line ConfigError saying how to install it."""
    try:
        import rerun
    except ImportError:
        raise ConfigError(NEEDS_RERUN) from None
    return rerun


def has_display() -> bool:
    """Whether a viewer window can open here (on Linux: an X11 or Wayland display is set)."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def segment_name(value: int) -> str:
    try:
        return Segment(int(value)).name
    except ValueError:
        return f"SEGMENT {int(value)}"


def observation_values(obs: Any, action: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A robot Observation (qpos, qvel, images, extra) and the executed command as store-named values."""
    values = {"obs/qpos": obs.qpos, "obs/qvel": obs.qvel, **obs.extra}
    values.update({f"{IMAGE_PREFIX}{cam}": img for cam, img in obs.images.items()})
    if action is not None:
        values["action"] = action
    return values


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception as `Type: first line of its message`, at most `limit` characters."""
    text = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def _markdown_table(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    lines = [f"# {title}", "", "| | |", "|---|---|"]
    for key, value in rows:
        text = str(value).replace("|", "/").replace("\n", " ")
        lines.append(f"| {key} | {text if len(text) <= MAX_CELL else text[:MAX_CELL] + ' ...'} |")
    return "\n".join(lines)


class RerunLogger:
    """One Rerun recording (an explicit RecordingStream: no global state) and how robo_rl's
    episodes map onto it. Give exactly one sink: `save` (an .rrd path) or `spawn=True` (start a
    viewer; needs a display)."""

    def __init__(self, recording_id: str, *, save: str | os.PathLike | None = None, spawn: bool = False,
                 app_id: str = "robo_rl", jpeg_quality: int | None = 90, joint_names: Sequence[str] | None = None):
        if (save is not None) == bool(spawn):
            raise ConfigError("the Rerun logger needs one sink: save=FILE.rrd or spawn=true")
        if jpeg_quality is not None and not 1 <= int(jpeg_quality) <= 100:
            raise ConfigError(f"jpeg_quality={jpeg_quality}: JPEG quality is 1..100 (or null for raw frames)")
        if spawn and not has_display():
            raise ConfigError("no display to open the Rerun viewer on (DISPLAY / WAYLAND_DISPLAY unset); "
                              "write a file instead with --save x.rrd (view_save=x.rrd live), then `rerun x.rrd` "
                              "on a machine with a display")
        self.rr = rr = import_rerun()
        self.rec = rr.RecordingStream(app_id, recording_id=recording_id)
        if save is not None:
            try:
                Path(save).parent.mkdir(parents=True, exist_ok=True)
                self.rec.save(str(save))  # before anything is logged, or it is lost
            except (OSError, RuntimeError) as e:
                raise ConfigError(f"cannot write the Rerun recording to {save}: {e}") from None
            self.sink = str(save)
        else:
            try:
                self.rec.spawn(connect=True)
            except Exception as e:  # no `rerun` binary, it failed to start, or its port is taken
                raise ConfigError(f"could not start the Rerun viewer: {one_line(e)}; write a file instead with "
                                  "--save x.rrd (view_save=x.rrd live)") from None
            self.sink = "the Rerun viewer"
        self.jpeg_quality = None if jpeg_quality is None else int(jpeg_quality)
        self.joint_names = list(joint_names) if joint_names else None
        self._styled: set[str] = set()
        self._last_segment: int | None = None

    # ------------------------------------------------------------------ static facts
    def log_meta(self, schema: Schema, meta: EpisodeMeta | None = None, title: str = "episode",
                 extra_rows: Sequence[tuple[str, Any]] = ()) -> None:
        """The episode's facts as one markdown document, and each low-dimensional key's line names."""
        rows: list[tuple[str, Any]] = [("robot", schema.robot), ("fps", f"{schema.fps:g}"),
                                       ("cameras", ", ".join(schema.cameras) or "none")]
        if meta is not None:
            rows += [("task", meta.task or "-"), ("success", meta.success), ("source", meta.source or "-"),
                     ("operator", meta.operator or "-"),
                     ("start time", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.start_time))),
                     ("notes", meta.notes or "-")]
            # init_state is hundreds of numbers: useful to replay, noise to read
            rows += [(f"extra: {k}", v) for k, v in meta.extra.items() if k != "init_state"]
        self.log_document(title, [*rows, *extra_rows])
        for key in schema.lowdim_keys:
            self._style(key, int(np.prod(schema.keys[key].shape, dtype=np.int64)))
        self._style_segment()

    def log_document(self, title: str, rows: Sequence[tuple[str, Any]]) -> None:
        """Facts as a markdown table at `meta` (static: it holds on every timeline)."""
        self.rec.log("meta", self.rr.TextDocument(_markdown_table(title, rows), media_type=self.rr.MediaType.MARKDOWN),
                     static=True)

    def _style(self, key: str, width: int) -> None:
        """Name each line of a key's vector (static, once per entity)."""
        if key in self._styled:
            return
        self._styled.add(key)
        if key in JOINT_KEYS and self.joint_names and len(self.joint_names) == width:
            names = list(self.joint_names)
        else:
            names = [key.rsplit("/", 1)[-1]] if width == 1 else [f"{key.rsplit('/', 1)[-1]}[{j}]" for j in range(width)]
        self.rec.log(key, self.rr.SeriesLines(names=names), static=True)

    def _style_segment(self) -> None:
        if SEGMENT_ID not in self._styled:
            self._styled.add(SEGMENT_ID)
            legend = " ".join(f"{s.value} {s.name.lower()}" for s in Segment)
            self.rec.log(SEGMENT_ID, self.rr.SeriesLines(names=[f"segment ({legend})"]), static=True)

    def _label(self, segment: int) -> Any:
        colour = SEGMENT_COLOURS.get(int(segment), UNKNOWN_COLOUR)
        return self.rr.TextLog(segment_name(segment), level="INFO", color=colour)

    # ------------------------------------------------------------------ one step (live)
    def log_step(self, step: int, t_seconds: float, values: Mapping[str, Any], segment: int | None = None) -> None:
        """One step on the `step` and `time` timelines: each value by key (images under
        obs/images/), and the segment label, with a text-log entry when it changed."""
        rr, rec = self.rr, self.rec
        rec.set_time("step", sequence=int(step))
        rec.set_time("time", duration=float(t_seconds))
        for key, value in values.items():
            arr = np.asarray(value)
            if key.startswith(IMAGE_PREFIX):
                rec.log(key, self._image(arr))
            else:
                flat = arr.astype(np.float64).reshape(-1)
                self._style(key, flat.size)
                rec.log(key, rr.Scalars(flat))
        if segment is not None:
            self._style_segment()
            rec.log(SEGMENT_ID, rr.Scalars(float(segment)))
            if segment != self._last_segment:
                rec.log(SEGMENT_LABEL, self._label(segment))
                self._last_segment = int(segment)

    def _image(self, frame: np.ndarray) -> Any:
        if self.jpeg_quality is None:
            return self.rr.Image(frame[..., 0] if frame.shape[-1] == 1 else frame)
        return self.rr.EncodedImage(contents=encode_jpeg(frame, self.jpeg_quality), media_type="image/jpeg")

    def mark(self, text: str, step: int | None = None, t_seconds: float | None = None) -> None:
        """A session event (episode started, saved, discarded) on the `events` text log."""
        if step is not None:
            self.rec.set_time("step", sequence=int(step))
        if t_seconds is not None:
            self.rec.set_time("time", duration=float(t_seconds))
        self.rec.log("events", self.rr.TextLog(text, level="INFO"))

    # ------------------------------------------------------------------ a stored episode
    def log_episode(self, store: "EpisodeStore", i: int) -> dict[str, int]:
        """Episode `i` of `store`, sent column-wise. Returns {"steps": T, "entities": n}."""
        rr, rec = self.rr, self.rec
        schema = store.schema
        start, end = store.episode_range(i)
        n = end - start
        low = store.episode(i, [*schema.lowdim_keys, TIMESTAMP_KEY, SEGMENT_KEY])
        ts = low[TIMESTAMP_KEY]
        seconds = ts - ts[0]  # a committed episode has at least one step
        steps = np.arange(n, dtype=np.int64)

        def times(sel: Any = slice(None)) -> list[Any]:
            return [rr.TimeColumn("step", sequence=steps[sel]), rr.TimeColumn("time", duration=seconds[sel])]

        self.log_meta(schema, store.meta(i), title=f"episode {i} of {store.location}",
                      extra_rows=[("steps", n), ("duration", f"{n / schema.fps:.2f} s")])
        for key in schema.lowdim_keys:
            values = low[key].astype(np.float64).reshape(n, -1)
            rec.send_columns(key, indexes=times(),
                             columns=rr.Scalars.columns(scalars=values).partition(lengths=[values.shape[1]] * n))
        seg = low[SEGMENT_KEY].astype(np.int64)
        rec.send_columns(SEGMENT_ID, indexes=times(), columns=rr.Scalars.columns(scalars=seg.astype(np.float64)))
        changes = np.flatnonzero(np.diff(seg, prepend=-1))  # always holds step 0
        rec.send_columns(SEGMENT_LABEL, indexes=times(changes), columns=rr.TextLog.columns(
            text=[segment_name(s) for s in seg[changes]], level=["INFO"] * len(changes),
            color=[SEGMENT_COLOURS.get(int(s), UNKNOWN_COLOUR) for s in seg[changes]]))
        self._last_segment = int(seg[-1])
        for key in schema.image_keys:
            self._send_frames(store, key, start, end, times)
        return {"steps": n, "entities": len(schema.keys) + 3}  # + meta, segment/id, segment/label

    def _send_frames(self, store: "EpisodeStore", key: str, start: int, end: int, times: Any) -> None:
        rr, rec = self.rr, self.rec
        h, w, c = store.schema.keys[key].shape
        if self.jpeg_quality is None:  # raw: the format once (static), then only the pixel buffers
            fmt = rr.components.ImageFormat(width=w, height=h, color_model="RGB" if c == 3 else "L",
                                            channel_datatype="U8")
            rec.log(key, rr.Image.from_fields(format=fmt), static=True)
        for s in range(start, end, READ_CHUNK):
            e = min(end, s + READ_CHUNK)
            frames = store.read(key, s, e)
            sel = slice(s - start, e - start)
            if self.jpeg_quality is None:
                columns = rr.Image.columns(buffer=frames.reshape(e - s, -1))
            else:
                columns = rr.EncodedImage.columns(blob=[encode_jpeg(f, self.jpeg_quality) for f in frames],
                                                  media_type=["image/jpeg"] * (e - s))
            rec.send_columns(key, indexes=times(sel), columns=columns)

    def close(self) -> None:
        """Send everything still buffered and end the recording (an .rrd gets its footer)."""
        self.rec.flush()
        self.rec.disconnect()


class LiveView:
    """A control loop's steps logged to Rerun from a background thread.

    `step()` copies the values onto a bounded queue and returns at once; the thread encodes and
    logs them. Drop policy: when the queue is full (the viewer or the encoder is slower than the
    loop), the step is dropped and counted in `dropped`, never waited for: the fixed-rate loop
    must not stall for a picture. The step counter still advances, so a drop shows as a gap on the
    `step` timeline, and a segment change inside a gap is logged at the next step that gets
    through. The episode store, not the viewer, is the record of what happened.

    A logging error does not reach the loop: from the first one on, the thread only drains the
    queue, the steps it takes count as dropped, and `close()` / `summary()` report the error.
    """

    def __init__(self, logger: RerunLogger, queue_size: int = 64):
        self.logger = logger
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, int(queue_size)))
        self.steps = 0     # step() calls: logged + dropped (+ the few still queued before close)
        self.logged = 0
        self._full = 0     # dropped by step() on a full queue (the loop's thread)
        self._skipped = 0  # taken off the queue after a logging error, not logged (the logging thread)
        self.error: str | None = None  # the first logging error, one line
        self.t0 = time.monotonic()
        self._closed: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name="rerun-live", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Steps not logged: the queue was full, or logging had failed. Two counters, one per
        thread, so that neither increment races the other."""
        return self._full + self._skipped

    def step(self, values: Mapping[str, Any], segment: int | None = None, t: float | None = None) -> bool:
        """Queue one step (time `t` in seconds, default: since this view opened). False if dropped."""
        index = self.steps
        self.steps += 1
        if self.queue.full():  # dropped before the copy: a step the viewer cannot take costs nothing
            self._full += 1
            return False
        t = time.monotonic() - self.t0 if t is None else float(t)
        # a copy: the caller may reuse its buffers while this step waits in the queue
        item = ("step", index, t, {k: np.array(v) for k, v in values.items()}, None if segment is None else int(segment))
        try:
            self.queue.put_nowait(item)
            return True
        except queue.Full:
            self._full += 1
            return False

    def mark(self, text: str) -> None:
        """A session event (episode started, saved, ...). Called between episodes, outside the
        control loop, so it waits for room rather than being dropped."""
        self.queue.put(("mark", self.steps, time.monotonic() - self.t0, text, None))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            kind, index, t, payload, segment = item
            if self.error is not None:  # logging failed before: drain only, so step() never blocks
                self._skipped += kind == "step"
                continue
            try:
                if kind == "step":
                    self.logger.log_step(index, t, payload, segment)
                    self.logged += 1
                else:
                    self.logger.mark(payload, index, t)
            except BaseException as e:  # the thread must live on to drain, or close() would wait forever
                self._skipped += kind == "step"
                self.error = f"logging failed at step {index}: {one_line(e)}"
                log.warning("live Rerun view: %s; later steps are not shown", self.error)

    def close(self) -> dict[str, Any]:
        """Log what is queued, end the recording, and return {"steps", "logged", "dropped",
        "error"}. Never raises (it runs in a session's cleanup): a failure is in `error`."""
        if self._closed is None:
            self.queue.put(None)
            self._thread.join()
            try:
                self.logger.close()
            except Exception as e:
                self.error = self.error or f"closing the recording failed: {one_line(e)}"
                log.warning("live Rerun view: %s", self.error)
            self._closed = {"steps": self.steps, "logged": self.logged, "dropped": self.dropped, "error": self.error}
        return self._closed

    def summary(self) -> str:
        why = self.error if self.error is not None else "the viewer fell behind" if self.dropped else ""
        return (f"{self.logged} of {self.steps} steps logged to {self.logger.sink}, {self.dropped} dropped"
                + (f" ({why})" if why else ""))
