"""Errors a user can cause. Each says what was wrong, where, and what was expected.

The CLI prints these as one line and exits non-zero; anything else is a bug and keeps its traceback.
"""


# What to do when this machine cannot render offscreen (robo_rl/cli/main.py picks a backend before
# mujoco is imported; robo_rl/sim/robot.py's new_renderer reports a renderer that cannot start).
INSTALL_GL = ("install EGL (apt install libegl1 libgl1-mesa-dri) or OSMesa (apt install libosmesa6), "
              "or run on a desktop with a display")


class RoboRLError(Exception):
    """Base class for every user-facing error in robo_rl."""


class SchemaError(RoboRLError):
    """A value does not match the store's schema (key, shape, dtype, NaN/inf, time order)."""


class StoreError(RoboRLError):
    """A path is not a usable store: missing, locked, too new, or damaged beyond repair."""


class ConfigError(RoboRLError):
    """A command-line or config value is not acceptable."""
