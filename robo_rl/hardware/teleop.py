"""Teleop devices for a human operator: a keyboard and a gamepad.

A device turns key presses or stick deflections into a `TeleopInput` each control tick:
end-effector moves per arm (metres, world frame), gripper targets (0 closed, 1 open), and the
RaC events a human signals with a key or button ("take_over", "recovery_done",
"correction_done"). What the robot does with the moves (inverse kinematics in the twin, a
Cartesian controller on real arms) is the consumer's business: this module needs no MuJoCo and no
ROS 2, only the standard library and numpy.

    KeyboardTeleop   key presses from any source: a terminal (`TerminalKeys`), the MuJoCo
                     viewer's key callback, or a test writing into a pseudo-terminal
    LinuxJoystick    a gamepad through the Linux joystick interface (/dev/input/js*), read
                     without any extra package

Keyboard (defaults): t take over · r recovery done · c correction done · 1 left arm · 2 right
arm · b both · w/s +x/-x · a/d +y/-y · q/e up/down · g toggle the selected grippers.
Gamepad (Xbox layout): A take over · B recovery done · X correction done · Y next arm ·
left stick x/y · right stick vertical: up/down · LB/RB toggle the left/right gripper.
"""

from __future__ import annotations

import os
import select
import struct
import sys
import termios
import threading
import time
import tty
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError

ARMS = ("left", "right")
EVENTS = ("take_over", "recovery_done", "correction_done")


@dataclass
class TeleopInput:
    """What the human asked for since the last poll."""

    delta: dict[str, np.ndarray] = field(default_factory=dict)  # arm -> xyz move (m, world frame)
    grip: dict[str, float] = field(default_factory=dict)  # arm -> new gripper target, if it changed
    events: list[str] = field(default_factory=list)  # in the order they were signalled


class TeleopDevice(Protocol):
    name: str

    def poll(self) -> TeleopInput:
        """Everything signalled since the previous poll; never blocks."""
        ...

    def close(self) -> None: ...


@dataclass
class KeyMap:
    take_over: str = "t"
    recovery_done: str = "r"
    correction_done: str = "c"
    left: str = "1"
    right: str = "2"
    both: str = "b"
    gripper: str = "g"
    moves: dict[str, tuple[int, float]] = field(default_factory=lambda: {
        "w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "q": (2, 1.0), "e": (2, -1.0)})


class KeyboardTeleop:
    """Key presses -> TeleopInput. Terminals report presses, not releases, so each press (and each
    auto-repeat while a key is held) moves the selected arms by `step_m`."""

    name = "keyboard"

    def __init__(self, keys: KeyMap | None = None, step_m: float = 0.005, source: "TerminalKeys | None" = None):
        self.keys = keys or KeyMap()
        self.step_m = float(step_m)
        self.source = source
        self.selected: tuple[str, ...] = ("right",)
        self.gripper = {arm: 1.0 for arm in ARMS}  # starts open; synced by the consumer at takeover
        self._pending = TeleopInput()
        self._lock = threading.Lock()  # the viewer's key callback runs on the viewer's thread

    def press(self, key: str) -> None:
        """One key press (a character; case does not matter)."""
        with self._lock:
            self._press(key)

    def _press(self, key: str) -> None:
        k, km = key.lower(), self.keys
        p = self._pending
        events = {km.take_over: "take_over", km.recovery_done: "recovery_done", km.correction_done: "correction_done"}
        if k in events:
            p.events.append(events[k])
        elif k in (km.left, km.right, km.both):
            self.selected = {km.left: ("left",), km.right: ("right",), km.both: ARMS}[k]
        elif k == km.gripper:
            for arm in self.selected:
                self.gripper[arm] = 0.0 if self.gripper[arm] >= 0.5 else 1.0
                p.grip[arm] = self.gripper[arm]
        elif k in km.moves:
            axis, sign = km.moves[k]
            for arm in self.selected:
                d = p.delta.setdefault(arm, np.zeros(3))
                d[axis] += sign * self.step_m

    def poll(self) -> TeleopInput:
        if self.source is not None:
            for key in self.source.read():
                self.press(key)
        with self._lock:
            out, self._pending = self._pending, TeleopInput()
        return out

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


class TerminalKeys:
    """Non-blocking single-key reads from a terminal (stdin by default) in cbreak mode: keys
    arrive as typed, without Enter, and the terminal is restored on close."""

    def __init__(self, fd: int | None = None):
        self.fd = sys.stdin.fileno() if fd is None else fd
        if not os.isatty(self.fd):
            raise RoboRLError("keyboard teleop needs a terminal (stdin is not a TTY); run it in a terminal, not a pipe")
        self._saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)

    def read(self) -> str:
        """The keys typed since the last read, without escape sequences: an arrow key arrives as
        ESC [ C, and its letter must not count as the key `c`."""
        chars = []
        while select.select([self.fd], [], [], 0)[0]:
            data = os.read(self.fd, 64)
            if not data:
                break
            chars.append(data.decode(errors="ignore"))
        return strip_escapes("".join(chars))

    def close(self) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None


def strip_escapes(text: str) -> str:
    """`text` without terminal escape sequences (CSI `ESC [ ... final` and SS3 `ESC O x`)."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "\x1b":
            out.append(text[i])
            i += 1
            continue
        i += 1
        if i < len(text) and text[i] == "[":
            i += 1
            while i < len(text) and not "\x40" <= text[i] <= "\x7e":
                i += 1
            i += 1  # the final byte
        elif i < len(text) and text[i] == "O":
            i += 2
    return "".join(out)


# Linux joystick API (linux/joystick.h): struct js_event { u32 time_ms; s16 value; u8 type; u8 number; }
JS_EVENT = struct.Struct("<IhBB")
JS_BUTTON, JS_AXIS, JS_INIT = 0x01, 0x02, 0x80


@dataclass
class PadMap:
    buttons: dict[int, str] = field(default_factory=lambda: {0: "take_over", 1: "recovery_done", 2: "correction_done",
                                                             3: "next_arm", 4: "grip_left", 5: "grip_right"})
    # axis number -> (xyz index, sign); sticks read +down and +right, the robot's +x is forward
    axes: dict[int, tuple[int, float]] = field(default_factory=lambda: {1: (0, -1.0), 0: (1, -1.0), 4: (2, -1.0)})
    deadzone: float = 0.12


class LinuxJoystick:
    """A gamepad through /dev/input/js*: sticks move the selected arm at up to `max_speed` m/s,
    buttons send events and toggle grippers. Reads without blocking; a device that disappears
    mid-run raises a RoboRLError instead of leaving the arm moving on a stale deflection."""

    name = "gamepad"

    def __init__(self, path: str = "/dev/input/js0", pad: PadMap | None = None, max_speed: float = 0.10):
        self.path, self.pad, self.max_speed = path, pad or PadMap(), float(max_speed)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise RoboRLError(f"gamepad: cannot open {path} ({e.strerror}); plug one in or pass its js device path") from None
        self.axis_values: dict[int, float] = {}
        self.selected = "right"
        self.gripper = {arm: 1.0 for arm in ARMS}
        self._buf = b""
        self._last_poll: float | None = None

    def _read_events(self) -> list[tuple[int, int, int]]:
        try:
            while True:
                data = os.read(self.fd, JS_EVENT.size * 64)
                if not data:
                    break
                self._buf += data
        except BlockingIOError:
            pass
        except OSError as e:
            raise RoboRLError(f"gamepad {self.path}: read failed ({e.strerror}); was it unplugged?") from None
        n = len(self._buf) // JS_EVENT.size
        events = [JS_EVENT.unpack_from(self._buf, i * JS_EVENT.size)[1:] for i in range(n)]
        self._buf = self._buf[n * JS_EVENT.size:]
        return events

    def poll(self) -> TeleopInput:
        out = TeleopInput()
        for value, kind, number in self._read_events():
            if kind & JS_AXIS:
                self.axis_values[number] = value / 32767.0
            elif kind & JS_BUTTON and value == 1 and not kind & JS_INIT:
                action = self.pad.buttons.get(number)
                if action in EVENTS:
                    out.events.append(action)
                elif action == "next_arm":
                    self.selected = "left" if self.selected == "right" else "right"
                elif action in ("grip_left", "grip_right"):
                    arm = action.split("_")[1]
                    self.gripper[arm] = 0.0 if self.gripper[arm] >= 0.5 else 1.0
                    out.grip[arm] = self.gripper[arm]
        now = time.monotonic()
        dt = 0.0 if self._last_poll is None else min(now - self._last_poll, 0.1)
        self._last_poll = now
        move = np.zeros(3)
        for number, (axis, sign) in self.pad.axes.items():
            v = self.axis_values.get(number, 0.0)
            if abs(v) > self.pad.deadzone:
                move[axis] += sign * v * self.max_speed * dt
        if move.any():
            out.delta[self.selected] = move
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def make_teleop(kind: str, **options) -> TeleopDevice:
    """keyboard (this terminal) or gamepad (options: path=/dev/input/js0, max_speed)."""
    if kind == "keyboard":
        return KeyboardTeleop(step_m=options.get("step_m", 0.005), source=TerminalKeys())
    if kind == "gamepad":
        return LinuxJoystick(options.get("path", "/dev/input/js0"), max_speed=options.get("max_speed", 0.10))
    raise ConfigError(f"teleop device {kind!r} unknown; choose keyboard or gamepad")
