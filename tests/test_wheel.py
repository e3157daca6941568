"""A plain `pip install .` (a wheel, not editable) is a working robo_rl: the wheel carries the
twin's models, the robot descriptions and the configs, and the installed package finds them
with no checkout in sight. Built from a copy of the sources, installed into a fresh venv
outside the checkout; that venv borrows only the third-party packages of the one running
the tests (a path line, so the checkout's editable install is not seen)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = ("robo_rl", "sim", "hardware", "configs", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_a_wheel_installed_outside_the_checkout_finds_its_models_and_configs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["MUJOCO_GL"] = env.get("MUJOCO_GL", "egl")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", src], tmp_path, env)
    wheels = list((tmp_path / "dist").glob("robo_rl-*.whl"))
    assert len(wheels) == 1

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp_path, env).strip())
    # every site-packages this interpreter reads (its venv's, and any that venv itself borrows), as plain paths
    borrowed = [p for p in sys.path if p.endswith("site-packages")] or [sysconfig.get_paths()["purelib"]]
    (site / "third_party.pth").write_text("\n".join(borrowed) + "\n")
    _run([*pip, "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheels[0]], tmp_path, env)

    where = _run([venv / "bin" / "python", "-c", "import robo_rl, robo_rl.assets as a; "
                  "print(robo_rl.__file__); print(*(a.asset_dir(n) for n in a.ASSET_DIRS), sep='\\n')"],
                 tmp_path, env).split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's copy, not the checkout's
    assert (Path(where[1]) / "aloha.xml").is_file() and (Path(where[3]) / "collect.yaml").is_file()

    store = tmp_path / "demos"
    out = _run([venv / "bin" / "robo-rl", "collect", "task=transfer_cube", "episodes=1", f"out={store}"], tmp_path, env)
    assert (store / "zarr.json").is_file(), out
    info = _run([venv / "bin" / "robo-rl", "dataset", "info", store], tmp_path, env)
    assert "transfer_cube" in info and "episodes" in info, info
