"""A command run on a pseudo-terminal, as a person at a keyboard would run it: keys written to
it arrive one by one in cbreak mode, and its output is read back (for tests of interactive verbs)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time


class PtySession:
    def __init__(self, args: list[str], env: dict | None = None, cwd: str | None = None):
        self.master, slave = pty.openpty()
        env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1", **(env or {})}
        env.pop("DISPLAY", None)  # no viewer window in tests
        # its own process group, as a shell gives a foreground job: Ctrl-C goes to the whole group
        self.proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=cwd, close_fds=True, start_new_session=True)
        os.close(slave)
        self.output = ""
        self._seen = 0  # expect() searches only past its previous match

    def read(self, timeout_s: float = 0.1) -> str:
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            ready = select.select([self.master], [], [], max(left, 0))[0]
            if not ready:
                break
            try:
                data = os.read(self.master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            self.output += data.decode(errors="replace")
        return self.output

    def expect(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        """The next match of `pattern` after the previous expect()'s, waiting for the output."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            m = re.compile(pattern).search(self.read(0.2), self._seen)
            if m:
                self._seen = m.end()
                return m
            if self.proc.poll() is not None:
                self.read(0.2)
                break
        raise AssertionError(f"never saw {pattern!r}; output:\n{self.output[-3000:]}")

    def send(self, keys: str, gap_s: float = 0.03) -> None:
        for k in keys:
            os.write(self.master, k.encode())
            time.sleep(gap_s)

    def interrupt(self) -> None:
        """Ctrl-C as a terminal sends it: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout_s: float = 60.0) -> int:
        end = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < end:
            self.read(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
            raise AssertionError(f"did not exit within {timeout_s} s; output:\n{self.output[-3000:]}")
        self.read(0.2)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)
