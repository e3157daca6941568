"""The keyboard: key presses from a terminal (`TerminalKeys`), the MuJoCo viewer's key callback,
or a test writing into a pseudo-terminal.

Keys (defaults, `KeyMap`): t take over · r recovery done · c correction done · 1 left arm · 2 right
arm · b both · w/s +x/-x · a/d +y/-y · q/e up/down · g toggle the selected grippers.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import threading
import tty
from dataclasses import dataclass, field

import numpy as np

from robo_rl.errors import RoboRLError
from robo_rl.hardware.teleop import ARMS, TeleopInput


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
    keys_help = "keys: t take over, r recovery done, c correction done, 1/2/b arm, w/s a/d q/e move, g gripper"

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
