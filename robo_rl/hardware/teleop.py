"""Teleop devices for a human operator: a keyboard, gamepads and a SpaceMouse.

A device turns key presses, stick deflections or cap pushes into a `TeleopInput` each control
tick: end-effector moves per arm (metres, world frame), gripper targets (0 closed, 1 open), and
the RaC events a human signals with a key or button ("take_over", "recovery_done",
"correction_done"). What the robot does with the moves (inverse kinematics in the twin, a
Cartesian controller on real arms) is the consumer's business: this module needs no MuJoCo and no
ROS 2, only the standard library and numpy (pygame for `PygameGamepad`, imported when used).

World frame: the operator stands behind the robot; +x is away from them, +y to their left, +z up.

    KeyboardTeleop   key presses from any source: a terminal (`TerminalKeys`), the MuJoCo
                     viewer's key callback, or a test writing into a pseudo-terminal
    LinuxJoystick    a gamepad through the Linux joystick interface (/dev/input/js*), read
                     without any extra package                            make_teleop("gamepad")
    PygameGamepad    a gamepad through SDL (pygame's joystick module): Linux, macOS, Windows;
                     `pip install pygame` or the `teleop` extra           make_teleop("pygame")
    SpaceMouse       a 3Dconnexion SpaceMouse read from Linux hidraw (/dev/hidraw*), standard
                     library only; `find_spacemouse()` locates it     make_teleop("spacemouse")

Keyboard (defaults): t take over · r recovery done · c correction done · 1 left arm · 2 right
arm · b both · w/s +x/-x · a/d +y/-y · q/e up/down · g toggle the selected grippers.
Gamepad, both kinds (Xbox layout, `PadMap`): A take over · B recovery done · X correction done ·
Y next arm · left stick x/y · right stick vertical: up/down · LB/RB toggle the left/right gripper.
Sticks move the selected arm at up to `max_speed` m/s, integrated over the real time between polls.
SpaceMouse (`SpaceMouseMap`): the cap moves the selected arm like a stick, at up to `max_speed`
m/s at full deflection: push it away from you +x, to the left +y, lift it +z. Buttons (left =
bit 0, right = bit 1 of the HID button report):
    left click (press and release)   toggle the selected arm's gripper
    right click                      next arm
    both buttons together            take over
    hold left for 0.6 s              recovery done
    hold right for 0.6 s             correction done
A click acts on release, so the first button of a chord or a long hold never also clicks.
Rotations (tilt, twist) are parsed but move nothing: TeleopInput has no rotation yet.
"""

from __future__ import annotations

import os
import select
import stat
import struct
import sys
import termios
import threading
import time
import tty
from dataclasses import dataclass, field
from pathlib import Path
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
    # arm -> 6 joint positions + gripper 0..1, followed one to one (leader arms; no IK)
    joints: dict[str, np.ndarray] = field(default_factory=dict)


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



# What a gamepad button or a SpaceMouse gesture can do: a RaC event, switch arm, toggle a gripper
# ("grip" toggles the selected arm's).
PAD_ACTIONS = EVENTS + ("next_arm", "grip_left", "grip_right", "grip")
MAX_POLL_GAP_S = 0.1  # a stalled consumer must not turn one late poll into a long jump


def check_pad_mapping(device: str, actions: dict[int, str], axes: dict[int, tuple[int, float]]) -> None:
    """ConfigError naming the first button action or axis target a pad mapping cannot do."""
    for number, action in actions.items():
        if action not in PAD_ACTIONS:
            raise ConfigError(f"{device}: button {number} action {action!r} unknown; choose from {', '.join(PAD_ACTIONS)}")
    for number, (xyz, _sign) in axes.items():
        if xyz not in (0, 1, 2):
            raise ConfigError(f"{device}: axis {number} maps to xyz index {xyz}; expected 0 (x), 1 (y) or 2 (z)")


class PadState:
    """Axis deflections and button actions -> TeleopInput, shared by the gamepads and the
    SpaceMouse: axes move the selected arm at up to `max_speed` m/s, integrated over the real
    time between polls, and actions queue events, switch arm or toggle grippers."""

    def __init__(self, axes: dict[int, tuple[int, float]], deadzone: float, max_speed: float):
        self.axes, self.deadzone, self.max_speed = axes, float(deadzone), float(max_speed)
        self.axis_values: dict[int, float] = {}  # axis number -> deflection in [-1, 1]
        self.selected = "right"
        self.gripper = {arm: 1.0 for arm in ARMS}  # the consumer syncs it at takeover: keep this dict
        self._pending = TeleopInput()
        self._last_poll: float | None = None

    def set_axis(self, number: int, value: float) -> None:
        self.axis_values[number] = min(1.0, max(-1.0, float(value)))

    def act(self, action: str | None) -> None:
        if action is None:
            return
        if action in EVENTS:
            self._pending.events.append(action)
        elif action == "next_arm":
            self.selected = "left" if self.selected == "right" else "right"
        elif action in ("grip", "grip_left", "grip_right"):
            arm = self.selected if action == "grip" else action.split("_")[1]
            self.gripper[arm] = 0.0 if self.gripper[arm] >= 0.5 else 1.0
            self._pending.grip[arm] = self.gripper[arm]

    def take(self) -> TeleopInput:
        """Everything since the last take, with the held deflections integrated over the time since."""
        now = time.monotonic()
        dt = 0.0 if self._last_poll is None else min(now - self._last_poll, MAX_POLL_GAP_S)
        self._last_poll = now
        move = np.zeros(3)
        for number, (xyz, sign) in self.axes.items():
            v = self.axis_values.get(number, 0.0)
            if abs(v) > self.deadzone:
                move[xyz] += sign * v * self.max_speed * dt
        out, self._pending = self._pending, TeleopInput()
        if move.any():
            out.delta[self.selected] = move
        return out


# Linux joystick API (linux/joystick.h): struct js_event { u32 time_ms; s16 value; u8 type; u8 number; }
JS_EVENT = struct.Struct("<IhBB")
JS_BUTTON, JS_AXIS, JS_INIT = 0x01, 0x02, 0x80
DEFAULT_JS_PATH = "/dev/input/js0"


@dataclass
class PadMap:
    """Xbox layout. Linux's joystick driver and SDL number an Xbox pad's buttons and axes alike."""

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

    def __init__(self, path: str | None = DEFAULT_JS_PATH, pad: PadMap | None = None, max_speed: float = 0.10):
        self.path, self.pad = path or DEFAULT_JS_PATH, pad or PadMap()
        check_pad_mapping(f"gamepad {self.path}", self.pad.buttons, self.pad.axes)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise RoboRLError(f"gamepad: cannot open {self.path} ({e.strerror}); plug one in or pass its js device path") from None
        self.state = PadState(self.pad.axes, self.pad.deadzone, max_speed)
        self._buf = b""

    @property
    def selected(self) -> str:
        return self.state.selected

    @property
    def gripper(self) -> dict[str, float]:
        return self.state.gripper

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
        for value, kind, number in self._read_events():
            if kind & JS_AXIS:
                self.state.set_axis(number, value / 32767.0)
            elif kind & JS_BUTTON and value == 1 and not kind & JS_INIT:
                self.state.act(self.pad.buttons.get(number))
        return self.state.take()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def import_pygame():
    """pygame, or a RoboRLError saying how to install it (it is an optional dependency)."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # no banner on stdout at import
    try:
        import pygame
    except ImportError:
        raise RoboRLError("teleop=pygame needs pygame: pip install pygame (or pip install -e '.[teleop]')") from None
    return pygame


class PygameGamepad:
    """A gamepad through SDL (pygame's joystick module), for macOS and Windows too: the same
    `PadMap` and behaviour as `LinuxJoystick`. No window is opened; SDL's event queue needs its
    video subsystem, so on a Linux machine without a display SDL gets its dummy video driver."""

    name = "gamepad"

    def __init__(self, index: int = 0, pad: PadMap | None = None, max_speed: float = 0.10):
        self.pad = pad or PadMap()
        check_pad_mapping(f"gamepad {index}", self.pad.buttons, self.pad.axes)
        pygame = self._pygame = import_pygame()
        headless = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if headless:
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # a user's own choice stands
        # the MuJoCo viewer's window has the focus, not us: SDL must still deliver the pad's events
        os.environ.setdefault("SDL_JOYSTICK_ALLOW_BACKGROUND_EVENTS", "1")
        try:
            pygame.display.init()
            pygame.joystick.init()
        except pygame.error as e:
            raise RoboRLError(f"gamepad: SDL did not start ({e}); on Linux without a display set SDL_VIDEODRIVER=dummy") from None
        count = pygame.joystick.get_count()
        if count == 0:
            raise RoboRLError("no gamepad found by SDL; plug one in (check the OS lists it) or use teleop=keyboard")
        if not 0 <= int(index) < count:
            names = ", ".join(f"{i}: {pygame.joystick.Joystick(i).get_name()}" for i in range(count))
            raise ConfigError(f"gamepad index {index} out of range; SDL sees {count} ({names})")
        self.index = int(index)
        self.joystick = pygame.joystick.Joystick(self.index)
        self.instance_id = self.joystick.get_instance_id()
        self.device_name = self.joystick.get_name()
        self.state = PadState(self.pad.axes, self.pad.deadzone, max_speed)
        for number in self.pad.axes:
            if number < self.joystick.get_numaxes():
                self.state.set_axis(number, self.joystick.get_axis(number))
        self._removed = False

    @property
    def selected(self) -> str:
        return self.state.selected

    @property
    def gripper(self) -> dict[str, float]:
        return self.state.gripper

    def poll(self) -> TeleopInput:
        pg = self._pygame
        if self._removed:
            raise RoboRLError(f"gamepad {self.device_name!r} was unplugged")
        for ev in pg.event.get((pg.JOYAXISMOTION, pg.JOYBUTTONDOWN, pg.JOYDEVICEREMOVED)):
            if getattr(ev, "instance_id", None) != self.instance_id:
                continue  # another pad
            if ev.type == pg.JOYDEVICEREMOVED:
                self._removed = True
                raise RoboRLError(f"gamepad {self.device_name!r} was unplugged (SDL reported it removed)")
            if ev.type == pg.JOYAXISMOTION:
                self.state.set_axis(ev.axis, ev.value)
            else:
                self.state.act(self.pad.buttons.get(ev.button))
        # the joystick events nobody reads would otherwise pile up in SDL's queue
        pg.event.clear((pg.JOYBUTTONUP, pg.JOYHATMOTION, pg.JOYBALLMOTION, pg.JOYDEVICEADDED), pump=False)
        return self.state.take()

    def close(self) -> None:
        if self.joystick is not None:
            self.joystick.quit()
            self.joystick = None


# 3Dconnexion SpaceMouse over Linux hidraw. Its HID input reports (the first byte of each is the
# report id): 1 = translation x, y, z as little-endian int16 (6 bytes; newer models append
# rotation, 12 bytes), 2 = rotation rx, ry, rz (6 bytes), 3 = buttons bitmask. Axes read about
# +-350 at full deflection: +x right, +y toward you, +z pushing down (the HID convention).
SPACEMOUSE_VENDORS = {0x256F: "3Dconnexion", 0x046D: "Logitech"}
# Logitech-era 3Dconnexion devices share Logitech's vendor id with its mice: known products
LOGITECH_SPACE_PRODUCTS = {0xC603, 0xC605, 0xC606, 0xC621, 0xC623, 0xC625, 0xC626, 0xC627, 0xC628, 0xC629, 0xC62B}
SPACEMOUSE_UDEV_HINT = ("allow your user with a udev rule, e.g. /etc/udev/rules.d/99-spacemouse.rules: "
                        'KERNEL=="hidraw*", ATTRS{idVendor}=="256f", MODE="0660", TAG+="uaccess" '
                        "(046d for a Logitech-era one), then sudo udevadm control --reload && sudo udevadm trigger")
TRANSLATION, ROTATION, BUTTONS = 1, 2, 3
HID_AXES = struct.Struct("<3h")


@dataclass
class SpaceMouseMap:
    """How a SpaceMouse drives the arms. Axis numbers: 0-2 translation x y z, 3-5 rotation
    rx ry rz, as the device reports them; buttons are bits of the button report."""

    # axis -> (xyz index, sign): away from you (-y) is +x, right (+x) is -y, lifting (-z) is +z
    axes: dict[int, tuple[int, float]] = field(default_factory=lambda: {1: (0, -1.0), 0: (1, -1.0), 2: (2, -1.0)})
    deadzone: float = 0.10          # fraction of full scale; a resting hand leans on the cap
    full_scale: float = 350.0
    clicks: dict[int, str] = field(default_factory=lambda: {0: "grip", 1: "next_arm"})  # on release
    holds: dict[int, str] = field(default_factory=lambda: {0: "recovery_done", 1: "correction_done"})
    hold_s: float = 0.6
    chord: tuple[int, ...] = (0, 1)  # these buttons down together: `chord_action`; () for none
    chord_action: str = "take_over"
    # Byte streams only (a pipe, a relay): hidraw hands over one whole report per read, so there
    # the sizes come from the reads. "auto": learnt from the first read starting a report 1.
    layout: str = "auto"            # "split" (6-byte report 1, rotation in report 2) | "combined" (12)
    button_bytes: int = 2


def find_spacemouse(sysfs_root: str | os.PathLike = "/sys/class/hidraw", dev_root: str | os.PathLike = "/dev") -> str:
    """The /dev/hidrawN of the first SpaceMouse the kernel lists: 3Dconnexion's vendor id 256f,
    or a Logitech-era (046d) SpaceNavigator/SpaceMouse/SpaceExplorer/SpacePilot."""
    root = Path(sysfs_root)
    if not root.is_dir():
        raise RoboRLError(f"no SpaceMouse found: {root} does not exist (the SpaceMouse reader needs Linux hidraw)")

    def number(p: Path) -> tuple[int, str]:
        digits = p.name.removeprefix("hidraw")
        return (int(digits) if digits.isdigit() else 1 << 30, p.name)

    for node in sorted(root.iterdir(), key=number):
        try:
            uevent = (node / "device" / "uevent").read_text(errors="replace")
        except OSError:
            continue
        fields = dict(line.split("=", 1) for line in uevent.splitlines() if "=" in line)
        try:
            _bus, vendor, product = (int(part, 16) for part in fields.get("HID_ID", "").split(":"))
        except ValueError:
            continue
        name = fields.get("HID_NAME", "").lower()
        if vendor == 0x256F:
            found = not any(other in name for other in ("cadmouse", "keyboard"))  # 3Dconnexion's plain mice
        elif vendor == 0x046D:
            found = product in LOGITECH_SPACE_PRODUCTS or any(w in name for w in ("spacemouse", "spacenavigator", "3dconnexion"))
        else:
            found = False
        if not found:
            continue
        dev = Path(dev_root) / node.name
        what = f"{fields.get('HID_NAME', 'SpaceMouse')} ({vendor:04x}:{product:04x})"
        if not dev.exists():
            raise RoboRLError(f"{node.name} is a {what} but {dev} does not exist; is udev running?")
        if not os.access(dev, os.R_OK):
            raise RoboRLError(f"{dev} is a {what} but this user cannot read it; {SPACEMOUSE_UDEV_HINT}")
        return str(dev)
    raise RoboRLError(f"no SpaceMouse found: no device under {root} has 3Dconnexion's vendor id 256f (or is a "
                      "Logitech-era SpaceNavigator); plug it in, or pass path=/dev/hidrawN")


class SpaceMouse:
    """A 3Dconnexion SpaceMouse (Compact, Wireless, Pro, Enterprise) from Linux hidraw, with the
    standard library only: the cap moves the selected arm, buttons click, hold and chord (see the
    module docstring). Reads without blocking. A hidraw node that goes away (EIO/ENODEV), or a
    byte stream whose writer hangs up after sending, raises a RoboRLError: a stale deflection
    must not keep the arm moving."""

    name = "spacemouse"

    def __init__(self, path: str, mapping: SpaceMouseMap | None = None, max_speed: float = 0.10):
        self.path, self.map = str(path), mapping or SpaceMouseMap()
        m = self.map
        actions = {**{f"{b} click": a for b, a in m.clicks.items()}, **{f"{b} hold": a for b, a in m.holds.items()}}
        if m.chord:
            actions["chord"] = m.chord_action
        check_pad_mapping(f"spacemouse {self.path}", actions, m.axes)
        if m.layout not in ("auto", "split", "combined"):
            raise ConfigError(f"spacemouse: layout {m.layout!r} unknown; choose auto, split or combined")
        if self.path.startswith("/dev/input/"):  # e.g. the gamepad's default path left in a config
            raise ConfigError(f"spacemouse: {self.path} is an input-event node, not hidraw; pass path=/dev/hidrawN "
                              "or path=null to find the SpaceMouse")
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except PermissionError:
            raise RoboRLError(f"spacemouse: {self.path} exists but cannot be opened (permission denied); "
                              f"{SPACEMOUSE_UDEV_HINT}") from None
        except OSError as e:
            raise RoboRLError(f"spacemouse: cannot open {self.path} ({e.strerror}); plug it in or pass its /dev/hidrawN path") from None
        # a hidraw node is a character device and returns exactly one report per read; anything
        # else (a FIFO, a pipe) is a byte stream that must be cut into reports by their sizes
        self.one_report_per_read = stat.S_ISCHR(os.fstat(self.fd).st_mode)
        self.state = PadState(m.axes, m.deadzone, max_speed)
        self.layout = None if m.layout == "auto" else m.layout
        self.buttons = 0
        self._buf = b""
        self._got_bytes = False
        self._down_since: dict[int, float] = {}  # button bit -> when it went down
        self._spent: set[int] = set()  # buttons whose press already acted (chord, hold): their release does not click

    @property
    def selected(self) -> str:
        return self.state.selected

    @property
    def gripper(self) -> dict[str, float]:
        return self.state.gripper

    @property
    def translation(self) -> np.ndarray:
        """The latest x, y, z deflection in [-1, 1] as the device reports it."""
        return np.array([self.state.axis_values.get(i, 0.0) for i in range(3)])

    @property
    def rotation(self) -> np.ndarray:
        """The latest rx, ry, rz deflection in [-1, 1]; parsed, unused by the default mapping."""
        return np.array([self.state.axis_values.get(i, 0.0) for i in range(3, 6)])

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 64 if self.one_report_per_read else 4096)
            except BlockingIOError:
                return
            except OSError as e:
                raise RoboRLError(f"spacemouse {self.path}: read failed ({e.strerror}); was it unplugged?") from None
            if not data:
                # a FIFO reads empty before any writer opens it; after data, empty means it hung up
                if self._got_bytes:
                    raise RoboRLError(f"spacemouse {self.path}: the device closed (end of stream); was it unplugged?")
                return
            self._got_bytes = True
            if self.one_report_per_read:
                self._report(data[0], data[1:])
                continue
            if self.layout is None and not self._buf and data[0] in (TRANSLATION, ROTATION):
                # at a report boundary: only split models send report 2, and a read of exactly
                # one 13-byte report 1 is a combined one
                self.layout = "combined" if data[0] == TRANSLATION and len(data) == 13 else "split"
            self._buf += data
            self._cut_reports()

    def _cut_reports(self) -> None:
        sizes = {TRANSLATION: 12 if self.layout == "combined" else 6, ROTATION: 6, BUTTONS: self.map.button_bytes}
        at = 0
        while at < len(self._buf):
            report_id = self._buf[at]
            if report_id not in sizes:
                bad, self._buf = self._buf, b""
                raise RoboRLError(f"spacemouse {self.path}: report id {report_id} at byte {at} of {bad[:16].hex()} is "
                                  "not 1, 2 or 3; a byte stream must carry whole reports (set SpaceMouseMap.layout)")
            end = at + 1 + sizes[report_id]
            if end > len(self._buf):
                break  # the rest comes with a later read
            self._report(report_id, self._buf[at + 1:end])
            at = end
        self._buf = self._buf[at:]

    def _report(self, report_id: int, payload: bytes) -> None:
        scale = self.map.full_scale
        if report_id == TRANSLATION and len(payload) >= 6:
            for i, v in enumerate(HID_AXES.unpack_from(payload)):
                self.state.set_axis(i, v / scale)
            if len(payload) >= 12:
                for i, v in enumerate(HID_AXES.unpack_from(payload, 6)):
                    self.state.set_axis(3 + i, v / scale)
        elif report_id == ROTATION and len(payload) >= 6:
            for i, v in enumerate(HID_AXES.unpack_from(payload)):
                self.state.set_axis(3 + i, v / scale)
        elif report_id == BUTTONS:
            self._buttons(int.from_bytes(payload, "little"))
        # other reports (a wireless model's battery level, LEDs) carry nothing to act on

    def _buttons(self, mask: int) -> None:
        now, m = time.monotonic(), self.map
        changed, self.buttons = mask ^ self.buttons, mask
        for bit in range(changed.bit_length()):
            if not changed >> bit & 1:
                continue
            if mask >> bit & 1:
                self._down_since[bit] = now
                if bit not in m.holds and bit not in m.chord:  # nothing else it could become: act at once
                    self.state.act(m.clicks.get(bit))
                    self._spent.add(bit)
            else:
                since = self._down_since.pop(bit, now)
                if bit not in self._spent:
                    held = now - since >= m.hold_s and bit in m.holds  # released before a poll saw the hold
                    self.state.act(m.holds[bit] if held else m.clicks.get(bit))
                self._spent.discard(bit)
        if m.chord and all(mask >> bit & 1 for bit in m.chord) and not self._spent & set(m.chord):
            self.state.act(m.chord_action)
            self._spent.update(m.chord)

    def _check_holds(self) -> None:
        now = time.monotonic()
        for bit, since in self._down_since.items():
            if bit in self.map.holds and bit not in self._spent and now - since >= self.map.hold_s:
                self.state.act(self.map.holds[bit])
                self._spent.add(bit)

    def poll(self) -> TeleopInput:
        self._read()
        self._check_holds()
        return self.state.take()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


TELEOP_KINDS = ("keyboard", "gamepad", "pygame", "spacemouse")


def make_teleop(kind: str, **options) -> TeleopDevice:
    """keyboard (this terminal; step_m), gamepad (Linux js; path=/dev/input/js0, max_speed),
    pygame (SDL gamepad; index=0, max_speed) or spacemouse (hidraw; path, default
    find_spacemouse(), max_speed). Options a kind does not use are ignored."""
    max_speed = float(options.get("max_speed", 0.10))
    if kind == "keyboard":
        return KeyboardTeleop(step_m=options.get("step_m", 0.005), source=TerminalKeys())
    if kind == "gamepad":
        return LinuxJoystick(options.get("path") or DEFAULT_JS_PATH, max_speed=max_speed)
    if kind == "pygame":
        return PygameGamepad(int(options.get("index", 0)), max_speed=max_speed)
    if kind == "spacemouse":
        return SpaceMouse(options.get("path") or find_spacemouse(), max_speed=max_speed)
    raise ConfigError(f"teleop device {kind!r} unknown; choose one of {', '.join(TELEOP_KINDS)}")
