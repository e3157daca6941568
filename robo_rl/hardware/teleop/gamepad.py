"""Gamepads: `LinuxJoystick` (/dev/input/js*, no extra package) and `PygameGamepad` (SDL, any OS).

Both kinds (Xbox layout, `PadMap`): A take over · B recovery done · X correction done ·
Y next arm · left stick x/y · right stick vertical: up/down · LB/RB toggle the left/right gripper.
Sticks move the selected arm at up to `max_speed` m/s, integrated over the real time between polls.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field

from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.hardware.teleop import TeleopInput
from robo_rl.hardware.teleop.pad import PadState, check_pad_mapping


# Linux joystick API (linux/joystick.h): struct js_event { u32 time_ms; s16 value; u8 type; u8 number; }
JS_EVENT = struct.Struct("<IhBB")
JS_BUTTON, JS_AXIS, JS_INIT = 0x01, 0x02, 0x80
DEFAULT_JS_PATH = "/dev/input/js0"
GAMEPAD_HELP = "gamepad: A take over, B recovery done, X correction done, Y arm, sticks move, LB/RB grippers"


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
    keys_help = GAMEPAD_HELP

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
    keys_help = GAMEPAD_HELP

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
