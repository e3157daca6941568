"""Everything is in pyproject.toml; this only puts the top-level sim/, hardware/ and configs/
into a built wheel, as robo_rl/_data/<name>, where robo_rl/assets.py finds them once installed."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ASSET_DIRS = ("sim", "hardware", "configs")  # robo_rl/assets.py reads the same three


class BuildWithAssets(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads them from the checkout
            return
        for name in ASSET_DIRS:
            target = Path(self.build_lib) / "robo_rl" / "_data" / name
            shutil.copytree(Path(__file__).parent / name, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildWithAssets})
