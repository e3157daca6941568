"""The one list of the teleop devices `make_teleop` opens by name: name -> builder(options, max_speed).
A new device is its own module plus one line in TELEOP_DEVICES. (Leader arms need ROS 2 and the
session's transport: robo_rl/cli/session.py wires them beside these.)"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from robo_rl.errors import ConfigError
from robo_rl.hardware.teleop import TeleopDevice
from robo_rl.hardware.teleop.gamepad import DEFAULT_JS_PATH, LinuxJoystick, PygameGamepad
from robo_rl.hardware.teleop.keyboard import KeyboardTeleop, TerminalKeys
from robo_rl.hardware.teleop.spacemouse import SpaceMouse, find_spacemouse

TELEOP_DEVICES: dict[str, Callable[[Mapping[str, Any], float], TeleopDevice]] = {
    # keyboard: this terminal; step_m
    "keyboard": lambda o, max_speed: KeyboardTeleop(step_m=o.get("step_m", 0.005), source=TerminalKeys()),
    # gamepad: Linux js; path=/dev/input/js0, max_speed
    "gamepad": lambda o, max_speed: LinuxJoystick(o.get("path") or DEFAULT_JS_PATH, max_speed=max_speed),
    # pygame: SDL gamepad; index=0, max_speed
    "pygame": lambda o, max_speed: PygameGamepad(int(o.get("index", 0)), max_speed=max_speed),
    # spacemouse: hidraw; path (default find_spacemouse()), max_speed
    "spacemouse": lambda o, max_speed: SpaceMouse(o.get("path") or find_spacemouse(), max_speed=max_speed),
}
TELEOP_KINDS = tuple(TELEOP_DEVICES)


def make_teleop(kind: str, **options) -> TeleopDevice:
    """The device `kind` of TELEOP_DEVICES, opened with `options` (see the registry's comments);
    options a kind does not use are ignored."""
    max_speed = float(options.get("max_speed", 0.10))
    build = TELEOP_DEVICES.get(kind)
    if build is None:
        raise ConfigError(f"teleop device {kind!r} unknown; choose one of {', '.join(TELEOP_KINDS)}")
    return build(options, max_speed)
