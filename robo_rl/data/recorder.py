"""Recorder: write episodes from a control loop without ever blocking it.

The control loop's process only validates a step and copies it into a shared-memory ring (a few
tens of microseconds). A separate writer process drains the ring, compresses camera frames and
commits episodes to the EpisodeStore. A separate process rather than a thread because
compression and zarr's Python-level work would otherwise hold the GIL for milliseconds at a time,
and a 50 Hz loop would feel every one of them.

Crash behaviour:
- the control process dies (any signal): the writer finishes and commits every episode whose
  `end_episode` was called, drops the one still open, and exits;
- the writer dies: the store keeps every committed episode (see store.py); the next call in the
  control process raises StoreError saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numcodecs.blosc
import numpy as np
import zarr

from robo_rl.data.schema import EpisodeMeta, Schema, Segment
from robo_rl.data.store import DEFAULT_IMAGE_CODEC, DEFAULT_IMAGE_QUALITY, EpisodeStore
from robo_rl.errors import SchemaError, StoreError

# Control words in the shared header.
_PRODUCED, _CONSUMED, _COMMITTED, _FAILED = range(4)
_HEADER = 8  # int64 slots
_TIMING_WINDOW = 1 << 16  # add_step timings kept for stats(): the last ~22 min at 50 Hz


@dataclass
class RecorderStats:
    steps: int
    episodes_ended: int
    episodes_committed: int
    stalls: int  # times add_step waited because the ring was full (writer behind)
    blocked_p50_ms: float
    blocked_p99_ms: float
    blocked_max_ms: float
    end_p99_ms: float  # time end_episode kept the caller


class _Ring:
    """Fixed-size arrays in one memory-mapped file shared by both processes."""

    def __init__(self, path: str, schema: Schema, slots: int, create: bool):
        self.path = path
        self.slots = slots
        layout = [("header", (_HEADER,), "int64"), ("timestamp", (slots,), "float64"), ("segment", (slots,), "uint8"),
                  ("same_frame", (slots, max(1, len(schema.image_keys))), "bool")]  # per camera: the previous step's frame
        layout += [(k, (slots, *s.shape), s.dtype) for k, s in schema.keys.items()]
        offsets, total = [], 0
        for _, shape, dtype in layout:
            total = -(-total // 64) * 64  # cache-line align each array
            offsets.append(total)
            total += int(np.prod(shape)) * np.dtype(dtype).itemsize
        if create:
            with open(path, "wb") as f:
                f.truncate(total)
        self._mm = np.memmap(path, dtype=np.uint8, mode="r+", shape=(total,))
        if create:
            self._mm[:] = 0  # touch every page now, not on the first lap of the control loop
        self.arrays: dict[str, np.ndarray] = {}
        for (name, shape, dtype), off in zip(layout, offsets):
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            # plain arrays, not np.memmap views: every slice of a memmap runs Python code
            self.arrays[name] = self._mm[off : off + n].view(dtype).view(np.ndarray).reshape(shape)
        self.header = self.arrays.pop("header")


def _sample(frame: np.ndarray) -> bytes:
    """Eight whole rows of a frame, as bytes: enough to tell a new picture (every row changes,
    sensor noise alone sees to it) at a few contiguous cache lines each (a strided pixel grid cost
    ~0.1 ms per 640x480 frame in cache misses); bytes compare in one call (np.array_equal is a
    dozen numpy calls, each slow in a loop that sleeps between steps)."""
    return frame[:: max(1, len(frame) // 8)].tobytes()


class _FrameCopier:
    """The control process's thread that copies camera frames into the ring and then publishes
    their step, in order. A frame whose sparse sample changed between `add_step` and its copy was
    written into by the caller: the step is not published and the recorder fails loudly."""

    def __init__(self, ring: "_Ring", header: np.ndarray):
        import queue
        import threading

        self.ring, self.header = ring, header
        self.error = ""
        self._queue: Any = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="recorder-frame-copier", daemon=True)
        self._thread.start()

    def put(self, slot: int, frames: Any, produced: int) -> None:
        self._queue.put((slot, frames, produced))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        arrays = self.ring.arrays
        while True:
            item = self._queue.get()
            if item is None or self.error:
                return
            slot, frames, produced = item
            for key, frame, sample in frames:
                arrays[key][slot] = frame
                if _sample(arrays[key][slot]) != sample:
                    self.error = (f"a frame of '{key}' changed after add_step handed it over (its array was "
                                  "written into); pass Recorder(..., snapshots=False) to copy frames in add_step")
                    return
            self.header[_PRODUCED] = produced


class _Inbox:
    """JSON-line messages from the control process on stdin; EOF means it is gone."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = b""
        self.eof = False
        self.messages: list[tuple] = []

    def pump(self, timeout: float) -> None:
        if self.eof:
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        while ready:
            data = os.read(self.fd, 1 << 16)
            if not data:
                self.eof = True
                break
            self.buf += data
            ready, _, _ = select.select([self.fd], [], [], 0)
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            m = json.loads(line)
            self.messages.append((m["kind"], m["at"], m["payload"]))


def _threads(pid: int) -> list[int]:
    """The thread ids of process `pid` (Linux: /proc/PID/task), or just the pid elsewhere."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def _writer_main(store_path: str, ring_path: str, slots: int) -> int:
    """The writer process: drain the ring into the store, commit on 'end' messages."""
    out = sys.stdout
    # A terminal's Ctrl-C goes to the whole foreground process group: it is the control process's
    # to act on. The writer must not stop mid-drain; it ends when the control process closes its
    # stdin (or dies), after committing every ended episode. (SIGKILL of the group still takes it.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Leave the CPU to the control loop first; compress with one thread so a 2-core machine keeps
    # a core for the loop. SCHED_IDLE (this process and the threads it starts) yields a core the
    # moment the loop wakes; a nice level still let the writer delay the loop's ticks by
    # milliseconds under three cameras' JPEG encoding (bench/data.py, real cameras).
    os.nice(10)
    with contextlib.suppress(AttributeError, OSError):  # Linux only
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    numcodecs.blosc.set_nthreads(1)
    zarr.config.set({"threading.max_workers": 1})
    try:
        store = EpisodeStore.open(store_path, mode="a")
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}", file=out, flush=True)
        return 1
    ring = _Ring(ring_path, store.schema, slots, create=False)
    header = ring.header
    print("ready", file=out, flush=True)
    inbox = _Inbox(sys.stdin.fileno())
    messages = inbox.messages
    writer = None
    keys = list(store.schema.keys)
    images = list(store.schema.image_keys)
    try:
        while True:
            # Read the step count BEFORE the messages: every message is sent before the steps
            # that follow it, so all messages that precede these steps are now in the pipe.
            produced = int(header[_PRODUCED])
            idle = not messages and header[_CONSUMED] == produced
            inbox.pump(0.002 if idle else 0.0)
            consumed = int(header[_CONSUMED])
            # Messages carry the step count at which they were sent: handle them in that order.
            while messages and messages[0][1] <= consumed:
                kind, _, payload = messages.pop(0)
                if kind == "start":
                    writer = store.begin_episode(EpisodeMeta.from_json(payload))
                elif kind == "end":
                    if writer is not None:
                        success, updates = payload
                        writer.commit(success=success, **updates)
                        header[_COMMITTED] += 1
                    writer = None
                elif kind == "discard":
                    if writer is not None:
                        writer.discard()
                    writer = None
                elif kind == "close":
                    return 0
            limit = min(produced, messages[0][1]) if messages else produced
            while consumed < limit:
                slot = consumed % slots
                # camera frames are handed over in place: the writer copies them into its own
                # buffers (a fresh copy per frame cost page faults: bench/data.py, real cameras);
                # a frame the loop marked as the previous step's again was never copied to the ring
                step = {k: v[slot] if k in images else v[slot].copy() for k, v in ring.arrays.items() if k in keys}
                same = [k for c, k in enumerate(images) if ring.arrays["same_frame"][slot, c]]
                ts = float(ring.arrays["timestamp"][slot])
                seg = int(ring.arrays["segment"][slot])
                if writer is not None:
                    writer.add(step, ts, seg, checked=True, same_frames=same)
                consumed += 1
                header[_CONSUMED] = consumed  # the slot is free once the writer has its copy
            if inbox.eof and consumed == int(header[_PRODUCED]) and (not messages or messages[0][1] > consumed):
                # The control process is gone and everything it sent is handled (or the steps a
                # message waits for never arrived: it died with frames still to copy). An episode
                # it never ended, or whose steps did not all arrive, is not committed.
                if writer is not None:
                    writer.discard()
                return 0
    except Exception as e:
        header[_FAILED] = 1
        print(f"error: {type(e).__name__}: {e}", file=out, flush=True)
        return 1
    finally:
        store.close()


class Recorder:
    """Record episodes into an EpisodeStore from a control loop.

        rec = Recorder("data/demos/x", schema)        # creates the store if it does not exist
        rec.start_episode(EpisodeMeta(task="transfer_cube", source="teleop"))
        rec.add_step({"obs/qpos": q, "action": a, "obs/images/top": img}, timestamp=t, segment="teleop")
        rec.end_episode(success=True)                 # returns at once; commit happens behind
        rec.close()                                   # waits for the writer to finish
    """

    def __init__(
        self,
        path: str | os.PathLike,
        schema: Schema | None = None,
        ring_seconds: float = 4.0,
        image_codec: str = DEFAULT_IMAGE_CODEC,
        overwrite: bool = False,
        start_timeout: float = 60.0,
        image_quality: int = DEFAULT_IMAGE_QUALITY,
        train_image_size: tuple[int, int] | None = None,
        snapshots: bool = True,
    ):
        """`image_codec`, `image_quality`, `train_image_size`: how a new store keeps camera frames
        (EpisodeStore.create); an existing store keeps its own. `snapshots`: camera frames handed
        to `add_step` are never written into afterwards (a camera's newest-frame snapshot, a
        render), so they are copied off the caller's thread; False copies them in `add_step`,
        for a caller that reuses its frame arrays."""
        path = str(path)
        if schema is not None:  # create it, or check that the existing store holds this schema
            EpisodeStore.open_or_create(path, schema, overwrite=overwrite, image_codec=image_codec,
                                        image_quality=image_quality, train_image_size=train_image_size).close()
        with EpisodeStore.open(path, mode="r") as probe:
            self.schema = probe.schema
            self._first_episode = probe.n_episodes
        self.path = path
        self._slots = max(8, int(ring_seconds * self.schema.fps))
        shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, ring_path = tempfile.mkstemp(prefix="robo_rl_ring_", dir=shm_dir)
        os.close(fd)
        self._ring = _Ring(ring_path, self.schema, self._slots, create=True)
        # A plain subprocess, not multiprocessing: nothing of the caller's __main__ is re-imported
        # and nothing (torch threads, camera handles) is forked.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "robo_rl.data.recorder", path, ring_path, str(self._slots)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        ready, _, _ = select.select([self._proc.stdout], [], [], start_timeout)
        first = self._proc.stdout.readline().decode().strip() if ready else ""
        if first != "ready":
            self._proc.kill()
            self._proc.wait(5)
            self._cleanup_ring()
            why = first or f"no answer within {start_timeout:.0f} s"
            raise StoreError(f"{path}: recorder could not start its writer: {why}")
        # Both processes have the ring mapped now: unlink its name so no file is left in /dev/shm
        # whoever dies first; the memory is freed when the last mapping goes.
        self._cleanup_ring()
        self._header = self._ring.header
        self._produced = 0
        self._open = False
        self._ended = 0
        self._last_ts: float | None = None
        # Camera frames are copied into the ring by a thread (numpy copies without the GIL), so
        # the loop is not held ~0.5 ms per 640x480 frame: it hands over the arrays, which must
        # then not be written into (camera snapshots, renders); one that is, is caught.
        self._copier = _FrameCopier(self._ring, self._header) if snapshots and self.schema.image_keys else None
        # Timings of the latest steps only, so hours of recording do not grow memory.
        self._blocked = np.zeros(_TIMING_WINDOW)
        self._end_times: list[float] = []
        self._stalls = 0
        self._closed = False

    # ------------------------------------------------------------------ control loop side
    def start_episode(self, meta: EpisodeMeta | None = None) -> None:
        self._check_alive()
        if self._open:
            raise StoreError(f"{self.path}: an episode is already open; end_episode() or discard_episode() first")
        self._send("start", (meta or EpisodeMeta()).to_json())
        self._open = True
        self._last_ts = None
        self._step_in_episode = 0
        self._last_frames: dict[str, tuple[np.ndarray, bytes]] = {}  # camera -> (array, a sparse sample)

    def add_step(self, step: Mapping[str, Any], timestamp: float, segment: Segment | int | str = Segment.TELEOP) -> None:
        """Validate and hand over one step. Raises SchemaError for bad input; nothing is written then."""
        t0 = time.perf_counter()
        if not self._open:
            raise StoreError(f"{self.path}: add_step before start_episode")
        values = self.schema.check_step(step, self._where)  # worded only for an error
        ts = float(timestamp)
        if not math.isfinite(ts):
            raise SchemaError(f"{self._where()}: timestamp is {ts}, expected a finite time in seconds")
        if self._last_ts is not None and ts < self._last_ts:
            raise SchemaError(f"{self._where()}: timestamp {ts:.6f} goes backwards (previous step {self._last_ts:.6f})")
        seg = int(Segment.parse(segment))
        header = self._header
        if header[_FAILED] or (self._copier is not None and self._copier.error):
            self._check_alive()
        if self._produced - header[_CONSUMED] >= self._slots:
            self._stalls += 1
            while self._produced - header[_CONSUMED] >= self._slots:
                self._check_alive()
                time.sleep(0.0002)
        slot = self._produced % self._slots
        arrays = self._ring.arrays
        same = arrays["same_frame"][slot]
        frames = []
        for c, k in enumerate(self.schema.image_keys):
            # A camera slower than the loop hands the same frame array again (a ROS 2 camera's
            # snapshot): that step's frame is not copied. The sparse sample catches an array
            # written into in place, which then counts as a new frame.
            v, last = values[k], self._last_frames.get(k)
            sample = _sample(v)
            same[c] = last is not None and v is last[0] and sample == last[1]
            if not same[c]:
                self._last_frames[k] = (v, sample)
                frames.append((k, v, sample))
        for k in self.schema.lowdim_keys:
            arrays[k][slot] = values[k]
        arrays["timestamp"][slot] = ts
        arrays["segment"][slot] = seg
        self._produced += 1
        if self._copier is not None and frames:
            self._copier.put(slot, frames, self._produced)  # publishes the step once its frames are in
        else:
            for k, v, _ in frames:
                arrays[k][slot] = v
            if self._copier is not None:
                self._copier.put(slot, (), self._produced)  # in order behind the steps still copying
            else:
                header[_PRODUCED] = self._produced  # publish after the data is in place
        self._last_ts = ts
        self._step_in_episode += 1
        self._blocked[(self._produced - 1) % _TIMING_WINDOW] = time.perf_counter() - t0

    def _where(self) -> str:
        return f"{self.path}: episode {self._first_episode + self._ended} step {self._step_in_episode}"

    def end_episode(self, success: bool | None = None, **meta_updates: Any) -> int:
        """Close the open episode; it is committed in the background. Returns its episode index."""
        t0 = time.perf_counter()
        self._check_alive()
        if not self._open:
            raise StoreError(f"{self.path}: end_episode without an open episode")
        if self._step_in_episode == 0:
            raise SchemaError(f"{self.path}: cannot end an empty episode; discard_episode() instead")
        unknown = sorted(set(meta_updates) - {f.name for f in dataclasses.fields(EpisodeMeta)})
        if unknown:  # refuse it here: the writer would fail on it, and with it every later episode
            raise SchemaError(f"{self.path}: end_episode: unknown episode field(s) {unknown}; free-form facts go in extra={{...}}")
        json.dumps(meta_updates)  # refuse what cannot be stored before the writer sees it
        self._send("end", (success, meta_updates))
        self._open = False
        index = self._first_episode + self._ended
        self._ended += 1
        self._end_times.append(time.perf_counter() - t0)
        return index

    def discard_episode(self) -> None:
        if self._open:
            self._send("discard", None)
            self._open = False

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every ended episode is committed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._header[_COMMITTED] < self._ended:
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise StoreError(f"{self.path}: writer still committing after {timeout} s")
            time.sleep(0.005)

    def close(self) -> None:
        """Drop an unfinished episode, wait for commits, stop the writer."""
        if self._closed:
            return
        # The recording is over, so the writer no longer yields to a control loop. At SCHED_IDLE
        # it gets no CPU while other processes keep both cores busy, and the wait for it to exit
        # ran out (a demo beside two training runs); at the normal policy it finishes at once.
        for task in _threads(self._proc.pid):
            with contextlib.suppress(AttributeError, OSError):  # Linux only
                os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
        try:
            if self._proc.poll() is None:
                self.discard_episode()
                self.flush()
                self._send("close", None)
        finally:
            self._closed = True
            if self._copier is not None:
                self._copier.stop()
            try:
                self._proc.stdin.close()
                self._proc.wait(60)
                self._check_error(raise_it=True)
            finally:
                self._proc.stdout.close()
                self._cleanup_ring()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def committed(self) -> int:
        return int(self._header[_COMMITTED])

    def stats(self) -> RecorderStats:
        b = self._blocked[: min(self._produced, _TIMING_WINDOW)] * 1e3
        b = b if len(b) else np.zeros(1)
        e = np.array(self._end_times[-_TIMING_WINDOW:] or [0.0]) * 1e3
        return RecorderStats(
            steps=self._produced,
            episodes_ended=self._ended,
            episodes_committed=self.committed,
            stalls=self._stalls,
            blocked_p50_ms=float(np.percentile(b, 50)),
            blocked_p99_ms=float(np.percentile(b, 99)),
            blocked_max_ms=float(b.max()),
            end_p99_ms=float(np.percentile(e, 99)),
        )

    # ------------------------------------------------------------------ internals
    def _send(self, kind: str, payload: Any) -> None:
        line = json.dumps({"kind": kind, "at": self._produced, "payload": payload}) + "\n"
        try:
            self._proc.stdin.write(line.encode())
        except BrokenPipeError:
            self._check_alive()
            raise

    def _check_error(self, raise_it: bool) -> None:
        if not self._header[_FAILED] and self._proc.poll() in (None, 0):
            return
        ready, _, _ = select.select([self._proc.stdout], [], [], 0.5)
        msg = self._proc.stdout.readline().decode().strip() if ready else ""
        if msg and raise_it:
            raise StoreError(f"{self.path}: recorder writer failed: {msg.removeprefix('error: ')}")

    def _check_alive(self) -> None:
        if self._closed:
            raise StoreError(f"{self.path}: recorder is closed")
        if self._copier is not None and self._copier.error:
            raise StoreError(f"{self.path}: {self._copier.error}")
        self._check_error(raise_it=True)
        if self._proc.poll() is not None:
            raise StoreError(
                f"{self.path}: recorder writer process died (exit code {self._proc.returncode}); "
                f"committed episodes are safe, the open one is lost"
            )

    def _cleanup_ring(self) -> None:
        Path(self._ring.path).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_writer_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
