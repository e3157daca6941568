"""`robo-rl sim-bridge` in another process, for the tests that talk ROS 2 (DDS) to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def start_bridge(domain: int, *args: str) -> subprocess.Popen:
    """The bridge on `domain` (overrides in `args`), once it says it is serving."""
    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", "sim-bridge", f"domain_id={domain}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    assert "sim-bridge: serving aloha" in line, line + proc.stderr.read()
    return proc


def stop_bridge(proc: subprocess.Popen) -> str:
    """Ctrl-C it and return what it printed ("" if it was already collected, or had to be killed)."""
    if proc.returncode is not None:
        return ""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=15)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return ""
