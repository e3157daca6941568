"""A 3Dconnexion SpaceMouse read from Linux hidraw (/dev/hidraw*), standard library only;
`find_spacemouse()` locates it.

The cap (`SpaceMouseMap`) moves the selected arm like a stick, at up to `max_speed` m/s at full
deflection: push it away from you +x, to the left +y, lift it +z. Buttons (left = bit 0, right =
bit 1 of the HID button report):
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
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.hardware.teleop import TeleopInput
from robo_rl.hardware.teleop.pad import PadState, check_pad_mapping


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
    keys_help = ("SpaceMouse: both buttons take over, hold left recovery done, hold right correction done, "
                 "left click gripper, right click arm, push the cap to move")

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
