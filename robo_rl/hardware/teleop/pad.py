"""What the gamepads and the SpaceMouse share: axis deflections and button actions -> TeleopInput."""

from __future__ import annotations

import time

import numpy as np

from robo_rl.errors import ConfigError
from robo_rl.hardware.teleop import ARMS, EVENTS, TeleopInput


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
