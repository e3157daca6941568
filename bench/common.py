"""Table output and machine facts shared by the bench scripts (run as `python bench/<name>.py`, so this folder is on
sys.path)."""

from __future__ import annotations

from pathlib import Path


def make_console(width: int = 150):
    from rich.console import Console

    return Console(width=max(Console().width, width))


def table(title: str, columns: list[str]):
    """A Markdown-style table: first column left-aligned, numbers right-aligned."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.MARKDOWN, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
