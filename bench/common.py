"""Table output shared by the bench scripts (run as `python bench/<name>.py`, so this folder is on
sys.path)."""

from __future__ import annotations


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
