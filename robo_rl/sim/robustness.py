"""The robustness report behind `robo-rl eval shifts=[...]`: one policy evaluated in the nominal
room and in each shifted room (robo_rl/sim/room.py) on the same seeds, so every row differs from
the nominal one only by how the room looks. Writes shifts.json (every condition's summary) and
shifts.png (success with its 95% interval per condition, and the curves when a curve was asked for).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from robo_rl.sim.room import Room

CURVES = {"light": (r"light:([\d.]+)$", "light, times the scene's", True),
          "camera_move": (r"camera_move:(\w+:)?([\d.-]+)$", "camera moved (cm)", False)}


def shift_report(rooms: list[Room], evaluate: Callable[[Room | None, str], Any], out: Path) -> list[dict[str, Any]]:
    """`evaluate(room, name)` -> an EvalSummary, for None (the nominal room) and each of `rooms`.
    Returns one row per condition (nominal first) and writes shifts.json and shifts.png to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for room in [None, *rooms]:
        name = "nominal" if room is None else room.name
        summary = evaluate(room, name).to_dict()
        rows.append({"shift": name, "room": "as recorded" if room is None else room.describe(), **summary})
        nominal = rows[0]["success_rate"]
        rows[-1]["change_points"] = round(100 * (rows[-1]["success_rate"] - nominal), 1)
        (out / "shifts.json").write_text(json.dumps(rows, indent=1))  # after every condition: a crash keeps what ran
    plot_report(rows, out / "shifts.png")
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["shift"], r["room"], f"{r['success_rate']:.0%} ({r['successes']}/{r['episodes']})",
             f"[{r['ci95_low']:.0%}, {r['ci95_high']:.0%}]", "" if r["shift"] == "nominal" else f"{r['change_points']:+.0f}"]
            for r in rows]


def curve_points(rows: list[dict[str, Any]], kind: str) -> list[tuple[float, dict[str, Any]]]:
    """(the shift's amount, row) for every row of one curve kind, the nominal row at its amount."""
    pattern, _, _ = CURVES[kind]
    points = [(float(m.groups()[-1]), r) for r in rows if (m := re.match(pattern, r["shift"]))]
    if points:
        points.append((1.0 if kind == "light" else 0.0, rows[0]))
    return sorted(points, key=lambda p: p[0])


def plot_report(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {k: pts for k in CURVES if len(pts := curve_points(rows, k)) >= 3}
    fig, axes = plt.subplots(1, 1 + len(curves), figsize=(6 + 4 * len(curves), 0.45 * len(rows) + 1.8), squeeze=False)
    ax = axes[0][0]
    names = [r["shift"] for r in rows][::-1]
    rates = [100 * r["success_rate"] for r in rows][::-1]
    err = [[100 * (r["success_rate"] - r["ci95_low"]) for r in rows][::-1],
           [100 * (r["ci95_high"] - r["success_rate"]) for r in rows][::-1]]
    ax.barh(names, rates, xerr=err, color=["#888" if n == "nominal" else "#4a7ab0" for n in names], capsize=3)
    ax.axvline(rates[-1], color="#444", lw=0.8, ls="--")
    ax.set_xlim(0, 100)
    ax.set_xlabel("success (%), 95% interval")
    ax.set_title(f"{rows[0].get('task', '')}: each shift on the nominal row's seeds", fontsize=9)
    for ax, (kind, pts) in zip(axes[0][1:], curves.items()):
        xs = [p[0] for p in pts]
        ys = [100 * p[1]["success_rate"] for p in pts]
        ax.errorbar(xs, ys, yerr=[[100 * (p[1]["success_rate"] - p[1]["ci95_low"]) for p in pts],
                                  [100 * (p[1]["ci95_high"] - p[1]["success_rate"]) for p in pts]], marker="o", capsize=3)
        if CURVES[kind][2]:
            ax.set_xscale("log")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_ylim(0, 100)
        ax.set_xlabel(CURVES[kind][1])
        ax.set_ylabel("success (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
