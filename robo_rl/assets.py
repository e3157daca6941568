"""Where the package's own files are: the twin's MuJoCo models (sim/), the robot descriptions
(hardware/) and the verbs' configs (configs/).

In a checkout they sit at the top of the repository, where users read and edit them. A wheel
carries a copy inside the package, as robo_rl/_data/<name> (setup.py copies them at build time).
One lookup serves both: the checkout's folder when this module runs from a checkout, else the
installed copy."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

ASSET_DIRS = ("sim", "hardware", "configs")
_CHECKOUT = Path(__file__).resolve().parents[1]


def asset_dir(name: str) -> Path:
    """The folder `name` (one of ASSET_DIRS) in this checkout or in the installed package."""
    if name not in ASSET_DIRS:
        raise ValueError(f"asset_dir: {name!r} is not one of {ASSET_DIRS}")
    in_checkout = _CHECKOUT / name
    if (_CHECKOUT / "pyproject.toml").is_file() and in_checkout.is_dir():
        return in_checkout
    return Path(str(resources.files("robo_rl") / "_data" / name))
