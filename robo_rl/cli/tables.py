"""Results tables for the terminal (rich when it is there, plain text otherwise)."""

from __future__ import annotations

from typing import Any, Sequence


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a (remote)"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency, this is belt and braces
        print(title)
        for r in rows:
            print("  " + "  ".join(str(c) for c in r))
        return
    table = Table(title=title, show_header=any(header), title_justify="left")
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*(str(c) for c in r))
    Console(width=120, emoji=False).print(table)  # ":top:" is a camera shift, not an emoji


def print_episodes(who: str, episodes: Sequence[dict]) -> None:
    """Episodes as the twin reported them (seed, success, furthest stage, ticks; `reason` when
    known), one row each, under the success rate with its 95% Wilson interval."""
    from robo_rl.sim.rollout import wilson_interval

    wins = sum(bool(e["success"]) for e in episodes)
    lo, hi = wilson_interval(wins, len(episodes))
    with_reason = all("reason" in e for e in episodes)
    rows = [[str(i + 1), str(e["seed"]), "yes" if e["success"] else "no", str(e["stage"]), str(e["ticks"]),
             *([e["reason"]] if with_reason else [])] for i, e in enumerate(episodes)]
    print_table(f"{who}: {wins}/{len(episodes)} episodes succeeded ({wins / len(episodes):.0%}, 95% CI [{lo:.0%}, {hi:.0%}])",
                ["episode", "seed", "success", "furthest stage", "ticks", *(["ended by"] if with_reason else [])], rows)


def print_summary(summary: Any, title: str) -> None:
    """An evaluation summary (robo_rl.sim.rollout.EvalSummary) as a two-column table."""
    from pathlib import Path

    d = summary.to_dict()
    rows = [["success", f"{d['success_rate']:.1%} ({d['successes']}/{d['episodes']})"],
            ["95% Wilson interval", f"[{d['ci95_low']:.1%}, {d['ci95_high']:.1%}]"],
            ["mean episode length", f"{d['mean_length']:.0f} steps"]]
    rows += [[f"reached {name}", f"{share:.0%}"] for name, share in d["stage_reach"].items()]
    if d["disturbed"]["episodes"]:
        rows += [["success when disturbed", f"{d['disturbed']['successes']}/{d['disturbed']['episodes']} episodes"]]
    rows += [["wall time", f"{d['wall_s']:.0f} s"]]
    if d["videos"]:
        rows += [["videos", str(Path(d["videos"][0]).parent)]]
    print_table(title, ["", ""], rows)
