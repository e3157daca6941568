"""Errors a user can cause. Each says what was wrong, where, and what was expected.

The CLI prints these as one line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class RoboRLError(Exception):
    """Base class for every user-facing error in robo_rl."""


class SchemaError(RoboRLError):
    """A value does not match the store's schema (key, shape, dtype, NaN/inf, time order)."""


class StoreError(RoboRLError):
    """A path is not a usable store: missing, locked, too new, or damaged beyond repair."""


class ConfigError(RoboRLError):
    """A command-line or config value is not acceptable."""
