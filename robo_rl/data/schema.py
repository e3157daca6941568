"""What an episode store holds: keys with shape and dtype, rate, robot, cameras, segment labels.

The schema is written into the store's root attributes at creation and checked on every append,
so a bad value is refused before it reaches disk.
"""

from __future__ import annotations

import enum
import functools
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from robo_rl.errors import SchemaError

# Bump when the on-disk layout changes; a store with a higher number is refused, not misread.
SCHEMA_VERSION = 1

# Keys every store has besides the user's; they are written by the store itself.
TIMESTAMP_KEY = "timestamp"
SEGMENT_KEY = "segment"
IMAGE_PREFIX = "obs/images/"


class Segment(enum.IntEnum):
    """Who produced a step. RaC's labels are RECOVERY and CORRECTION (Hu et al. 2025, arXiv 2509.07953)."""

    TELEOP = 0
    POLICY = 1
    RECOVERY = 2
    CORRECTION = 3
    SCRIPTED = 4

    @classmethod
    def parse(cls, value: "Segment | int | str") -> "Segment":
        if isinstance(value, Segment):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                names = ", ".join(s.name for s in cls)
                raise SchemaError(f"unknown segment label {value!r}; expected one of {names}") from None
        try:
            return cls(int(value))
        except ValueError:
            raise SchemaError(f"unknown segment label {value!r}; expected 0..{len(cls) - 1}") from None


@dataclass(frozen=True)
class KeySpec:
    """One per-step array: its name inside the store, per-step shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    # the parsed dtype, set from `dtype`: equality, repr and the stored schema leave it out
    _np_dtype: np.dtype = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*", self.name):
            raise SchemaError(f"key {self.name!r}: names are '/'-separated words of letters, digits, _ . -")
        if self.name in (TIMESTAMP_KEY, SEGMENT_KEY):
            raise SchemaError(f"key {self.name!r} is reserved: the store writes it itself")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        try:
            object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        except TypeError:
            raise SchemaError(f"key {self.name!r}: unknown dtype {self.dtype!r}") from None
        if self.is_image and (len(self.shape) != 3 or self.shape[2] not in (1, 3) or self.dtype != "uint8"):
            raise SchemaError(f"key {self.name!r}: images are uint8 (H, W, 3) or (H, W, 1), got {self.shape} {self.dtype}")
        object.__setattr__(self, "_np_dtype", np.dtype(self.dtype))  # checked every step: not parsed again

    @property
    def is_image(self) -> bool:
        return self.name.startswith(IMAGE_PREFIX)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self._np_dtype.itemsize

    def check(self, value: Any, where: str | Callable[[], str]) -> np.ndarray:
        """Return `value` as an array of this key's dtype, or raise naming `where` and the key.
        `where` may be a function giving the place, called only to word an error."""
        if type(value) is np.ndarray and value.dtype == self._np_dtype and value.shape == self.shape:
            # The common case, taken every step of a control loop that records: an array already
            # of the right kind. A float needs one reduction, not two: a sum is finite only when
            # every element is (an overflowing sum falls back to the exact test).
            if value.dtype.kind != "f" or math.isfinite(np.add.reduce(value, axis=None)):
                return value
        where = where() if callable(where) else where
        arr = np.asarray(value)
        if arr.shape != self.shape:
            raise SchemaError(f"{where}: key '{self.name}' has shape {arr.shape}, expected {self.shape}")
        return self._cast(arr, where)

    def check_block(self, value: Any, where: str) -> np.ndarray:
        """Like `check` for a whole block of steps (T, *shape)."""
        arr = np.asarray(value)
        if arr.shape[1:] != self.shape or arr.ndim != len(self.shape) + 1:
            raise SchemaError(f"{where}: key '{self.name}' has shape {arr.shape}, expected (T, {', '.join(map(str, self.shape))})")
        arr = self._cast(arr, where)
        return arr

    def _cast(self, arr: np.ndarray, where: str) -> np.ndarray:
        want = self._np_dtype
        if arr.dtype != want:
            # Same-kind casts (float64 -> float32, int -> float) are what users mean; anything
            # else (float -> uint8 image, bool -> float) is a bug upstream and is refused.
            ok = np.can_cast(arr.dtype, want, casting="same_kind") or (
                arr.dtype.kind in "iu" and want.kind == "f"
            )
            if not ok or (want.kind in "iu" and arr.dtype.kind not in "iub"):
                raise SchemaError(f"{where}: key '{self.name}' has dtype {arr.dtype}, expected {want}")
            arr = arr.astype(want)
        if want.kind == "f" and not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise SchemaError(f"{where}: key '{self.name}' holds NaN or inf at index {tuple(int(i) for i in bad)}")
        return arr


@dataclass
class Schema:
    """The keys a store holds plus its rate, robot and camera names."""

    keys: dict[str, KeySpec]
    fps: float
    robot: str = "unknown"
    cameras: list[str] = field(default_factory=list)
    version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.fps or self.fps <= 0:
            raise SchemaError(f"schema: fps must be positive, got {self.fps}")
        image_cams = sorted(k[len(IMAGE_PREFIX):] for k in self.keys if k.startswith(IMAGE_PREFIX))
        if not self.cameras:
            self.cameras = image_cams
        elif sorted(self.cameras) != image_cams:
            raise SchemaError(f"schema: cameras {sorted(self.cameras)} do not match image keys {image_cams}")

    @classmethod
    def build(cls, keys: Mapping[str, Any], fps: float, robot: str = "unknown", cameras: list[str] | None = None) -> "Schema":
        """Keys as {name: (shape, dtype)} or {name: "(14,) float32"}."""
        specs = {}
        for name, spec in keys.items():
            if isinstance(spec, KeySpec):
                specs[name] = spec
                continue
            if isinstance(spec, str):
                shape, dtype = parse_key_spec(name, spec)
            else:
                shape, dtype = spec
            specs[name] = KeySpec(name, tuple(shape), dtype)
        return cls(keys=specs, fps=float(fps), robot=robot, cameras=list(cameras or []))

    # Worked out once: the Recorder asks for them every step of the control loop. A schema's keys
    # are not changed after it is built.
    @functools.cached_property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(k for k, s in self.keys.items() if s.is_image)

    @functools.cached_property
    def lowdim_keys(self) -> tuple[str, ...]:
        return tuple(k for k, s in self.keys.items() if not s.is_image)

    def to_json(self) -> dict:
        return {
            "schema_version": self.version,
            "fps": self.fps,
            "robot": self.robot,
            "cameras": list(self.cameras),
            "keys": {k: {"shape": list(s.shape), "dtype": s.dtype} for k, s in self.keys.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "store") -> "Schema":
        version = int(d.get("schema_version", -1))
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"{where}: written by schema version {version}, this robo_rl reads up to {SCHEMA_VERSION}; upgrade robo_rl"
            )
        if version < 1:
            raise SchemaError(f"{where}: no robo_rl schema version in the store's attributes")
        keys = {k: KeySpec(k, tuple(v["shape"]), v["dtype"]) for k, v in d["keys"].items()}
        return cls(keys=keys, fps=float(d["fps"]), robot=d.get("robot", "unknown"), cameras=list(d.get("cameras", [])), version=version)

    def check_step(self, step: Mapping[str, Any], where: str | Callable[[], str]) -> dict[str, np.ndarray]:
        """The step's values as arrays of the schema's dtypes, or a SchemaError naming `where` (a
        string, or a function giving it, called only to word an error)."""
        if len(step) == len(self.keys):  # the usual step: the schema's keys, each once
            try:
                return {k: spec.check(step[k], where) for k, spec in self.keys.items()}
            except KeyError:
                pass  # a key missing: worded below
        where = where() if callable(where) else where
        missing = [k for k in self.keys if k not in step]
        extra = [k for k in step if k not in self.keys]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"unknown {extra} (schema has {list(self.keys)})")
            raise SchemaError(f"{where}: " + "; ".join(parts))
        return {k: self.keys[k].check(step[k], where) for k in self.keys}


def parse_key_spec(name: str, text: str) -> tuple[tuple[int, ...], str]:
    """Parse '(14,) float32' into ((14,), 'float32')."""
    m = re.fullmatch(r"\s*\(([\d,\s]*)\)\s*([A-Za-z0-9_]+)\s*", text)
    if not m:
        raise SchemaError(f"key {name!r}: spec {text!r} is not like '(14,) float32'")
    shape = tuple(int(p) for p in m.group(1).replace(" ", "").split(",") if p)
    return shape, m.group(2)


@dataclass
class EpisodeMeta:
    """Per-episode facts. `notes` is free-form; `extra` carries what later tools add (e.g. RaC)."""

    task: str = ""
    success: bool | None = None
    source: str = ""
    operator: str = ""
    start_time: float = field(default_factory=time.time)
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EpisodeMeta":
        known = {k: d[k] for k in ("task", "success", "source", "operator", "start_time", "notes", "extra") if k in d}
        return cls(**known)
