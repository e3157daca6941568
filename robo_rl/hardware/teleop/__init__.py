"""Teleop devices for a human operator: a keyboard, gamepads and a SpaceMouse.

A device turns key presses, stick deflections or cap pushes into a `TeleopInput` each control
tick: end-effector moves per arm (metres, world frame), gripper targets (0 closed, 1 open), and
the RaC events a human signals with a key or button ("take_over", "recovery_done",
"correction_done"). What the robot does with the moves (inverse kinematics in the twin, a
Cartesian controller on real arms) is the consumer's business: this package needs no MuJoCo and no
ROS 2, only the standard library and numpy (pygame for `PygameGamepad`, imported when used).

World frame: the operator stands behind the robot; +x is away from them, +y to their left, +z up.

    KeyboardTeleop   key presses from any source: a terminal (`TerminalKeys`), the MuJoCo
                     viewer's key callback, or a test writing into a pseudo-terminal  keyboard.py
    LinuxJoystick    a gamepad through the Linux joystick interface (/dev/input/js*), read
                     without any extra package                            make_teleop("gamepad")
    PygameGamepad    a gamepad through SDL (pygame's joystick module): Linux, macOS, Windows;
                     `pip install pygame` or the `teleop` extra           make_teleop("pygame")
                                                                          gamepad.py
    SpaceMouse       a 3Dconnexion SpaceMouse read from Linux hidraw (/dev/hidraw*), standard
                     library only; `find_spacemouse()` locates it     make_teleop("spacemouse")
                                                                          spacemouse.py
The gamepads and the SpaceMouse share `PadState` (pad.py); `make_teleop` opens a device by name
from the one registry (registry.py): a new device is its own module plus one line there. Each
module's docstring gives its device's default keys, buttons and axes.

Here: the types every device shares (`TeleopInput`, the `TeleopDevice` protocol, ARMS, EVENTS),
and every public name of the modules, so `from robo_rl.hardware.teleop import X` works for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


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


# The devices import the shared types above from this package: they come after them.
from robo_rl.hardware.teleop.gamepad import (DEFAULT_JS_PATH, JS_AXIS, JS_BUTTON, JS_EVENT, JS_INIT,  # noqa: E402
                                             LinuxJoystick, PadMap, PygameGamepad, import_pygame)
from robo_rl.hardware.teleop.keyboard import KeyboardTeleop, KeyMap, TerminalKeys, strip_escapes  # noqa: E402
from robo_rl.hardware.teleop.pad import MAX_POLL_GAP_S, PAD_ACTIONS, PadState, check_pad_mapping  # noqa: E402
from robo_rl.hardware.teleop.registry import TELEOP_DEVICES, TELEOP_KINDS, make_teleop  # noqa: E402
from robo_rl.hardware.teleop.spacemouse import (BUTTONS, HID_AXES, LOGITECH_SPACE_PRODUCTS, ROTATION,  # noqa: E402
                                                SPACEMOUSE_UDEV_HINT, SPACEMOUSE_VENDORS, TRANSLATION, SpaceMouse,
                                                SpaceMouseMap, find_spacemouse)

__all__ = [
    "ARMS", "EVENTS", "TeleopInput", "TeleopDevice",
    "KeyMap", "KeyboardTeleop", "TerminalKeys", "strip_escapes",
    "PAD_ACTIONS", "MAX_POLL_GAP_S", "check_pad_mapping", "PadState",
    "JS_EVENT", "JS_BUTTON", "JS_AXIS", "JS_INIT", "DEFAULT_JS_PATH", "PadMap", "LinuxJoystick", "import_pygame",
    "PygameGamepad",
    "SPACEMOUSE_VENDORS", "LOGITECH_SPACE_PRODUCTS", "SPACEMOUSE_UDEV_HINT", "TRANSLATION", "ROTATION", "BUTTONS",
    "HID_AXES", "SpaceMouseMap", "find_spacemouse", "SpaceMouse",
    "TELEOP_DEVICES", "TELEOP_KINDS", "make_teleop",
]
