"""Table output and machine facts shared by the bench scripts (run as `python bench/<name>.py`, so this folder is on
sys.path)."""

from __future__ import annotations

import os
from pathlib import Path

from robo_rl.learn.recipes import cpu_flags  # noqa: F401  (the bench scripts import it from here)


def make_console(width: int = 150):
    from rich.console import Console

    return Console(width=max(Console().width, width), emoji=False)  # names such as "camera_move:top:1" stay text


def table(title: str, columns: list[str]):
    """A Markdown-style table: first column left-aligned, numbers right-aligned."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.MARKDOWN, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


def cpu_kind() -> str:
    """The CPU's model name and its widest vector kind, printed beside every timing (the same
    code ran 2-5x slower on AVX2-only machines than on AVX512-BF16 ones)."""
    flags = cpu_flags()
    kind = "AVX512-BF16" if "avx512_bf16" in flags else ("AVX-512" if "avx512f" in flags else "AVX2")
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {kind}"


def steal_seconds() -> float | None:
    """CPU time the hypervisor gave to other machines while ours wanted it (all cores; Linux
    /proc/stat), or None where not known: on a shared VM, a stall of tens of ms can be this."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
