"""PNG curves of a training run, drawn from the JSON lines the training loops append.

    run_dir/metrics.jsonl  one row per log interval: {"step": ..., "loss": ..., "lr": ...} (Learner)
                           or {"step": ..., "critic/loss": ..., "actor/q": ..., ...} (OfflineLoop)
    run_dir/evals.jsonl    one row per evaluation: {"step": ..., "success_rate": ..., "ci95_low": ...}

-> run_dir/plots/loss.png         every training metric against step, one panel each (at most
                                  MAX_PANELS, losses first); train_/heldout_ pairs share a panel;
                                  log y where every value is positive
-> run_dir/plots/eval_success.png success rate against step, with the 95% band where logged

Missing files, rows without a key, and a last line cut short by a crash are all taken in stride:
what can be plotted is, and nothing to plot writes nothing. `read_curves` returns exactly the
series the plots draw.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from robo_rl.data.plots import save_figure

MAX_PANELS = 12
NOT_METRICS = {"step", "time_s", "eval_time_s", "scheduled_steps"}  # bookkeeping, not learning (as are *_per_s rates)
SPLIT_PREFIXES = ("train_", "heldout_", "val_")  # train_td_error / heldout_td_error: one panel


class Curves(NamedTuple):
    """What the plots of a run draw."""

    panels: dict[str, dict[str, tuple[list[float], list[float]]]]  # panel -> metric -> (steps, finite values)
    evals: list[dict[str, Any]]  # evaluations with a finite success_rate, by step


def read_curves(run_dir: Path) -> Curves:
    """The series of run_dir's metrics.jsonl and evals.jsonl that `training_plots` draws."""
    run_dir = Path(run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    panels = {title: {key: _series(metrics, key) for key in keys} for title, keys in metric_panels(metrics).items()}
    evals = sorted((r for r in read_jsonl(run_dir / "evals.jsonl")
                    if _is_number(r.get("success_rate")) and math.isfinite(r["success_rate"])),
                   key=lambda r: r["step"])
    return Curves(panels, evals)


def training_plots(run_dir: Path) -> list[Path]:
    """Write run_dir/plots/*.png from the run's metrics.jsonl and evals.jsonl; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    curves = read_curves(run_dir)
    if not curves.panels and not curves.evals:
        return []
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if curves.panels:
        written.append(_loss_plot(curves.panels, out / "loss.png", run_dir.name))
    if curves.evals:
        written.append(_success_plot(curves.evals, out / "eval_success.png", run_dir.name))
    return written


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file that have a numeric step; [] when the file is missing."""
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash mid-write (or a blank one)
                continue
            if isinstance(row, dict) and _is_number(row.get("step")):
                rows.append(row)
    return rows


def metric_panels(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Panel title -> the metric keys drawn in it, in the order first seen, losses first."""
    keys = dict.fromkeys(k for row in rows for k, v in row.items()
                         if _is_number(v) and k not in NOT_METRICS and not k.endswith("_per_s"))
    panels: dict[str, list[str]] = {}
    for key in keys:
        panels.setdefault(_panel_title(key), []).append(key)
    titles = sorted(panels, key=lambda t: "loss" not in t)  # stable: otherwise first-seen order
    return {t: panels[t] for t in titles[:MAX_PANELS]}


def _panel_title(key: str) -> str:
    for prefix in SPLIT_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix):]
    return key


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows holding a finite `key` (a diverged run logs NaN or inf)."""
    pairs = [(float(r["step"]), float(r[key])) for r in rows if _is_number(r.get(key)) and math.isfinite(r[key])]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _loss_plot(panels: dict[str, dict[str, tuple[list[float], list[float]]]], path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    cols = min(3, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.0 * n_rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        values = []
        for key, (steps, ys) in series.items():
            ax.plot(steps, ys, label=key, linewidth=1.2, marker="." if len(ys) < 30 else None)
            values += ys
        if values and min(values) > 0:
            ax.set_yscale("log")
        ax.set_title(panel, fontsize="medium")
        ax.set_xlabel("step")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k, not 20000: narrow panels stay legible
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title}: training metrics")
    return save_figure(fig, path)


def _success_plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    banded = [r for r in rows if _is_number(r.get("ci95_low")) and _is_number(r.get("ci95_high"))]
    steps, low, high = ([r[k] for r in banded] for k in ("step", "ci95_low", "ci95_high"))
    if len(banded) >= 2:
        ax.fill_between(steps, low, high, alpha=0.2, label="95% interval")
    elif banded:  # one evaluation: a band needs two points
        r = banded[0]
        # a Wilson bound at 0% or 100% can sit a rounding error past the rate: matplotlib refuses that
        below, above = max(0.0, r["success_rate"] - low[0]), max(0.0, high[0] - r["success_rate"])
        ax.errorbar(steps, [r["success_rate"]], yerr=[[below], [above]], capsize=4, color="tab:blue", alpha=0.5,
                    label="95% interval")
    ax.plot([r["step"] for r in rows], [r["success_rate"] for r in rows], marker="o", label="success rate")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("success rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    best = max(rows, key=lambda r: r["success_rate"])
    ax.set_title(f"{title}: last {rows[-1]['success_rate']:.0%}, best {best['success_rate']:.0%} "
                 f"(step {best['step']})", fontsize="medium")
    return save_figure(fig, path)


def print_training_plots(run_dir: Path) -> None:
    """Draw the run's loss and success curves into run_dir/plots/ and say which files."""
    try:
        written = training_plots(run_dir)
    except Exception as e:  # noqa: BLE001 - the run is saved; a drawing failure must not turn it into an error
        print(f"plots: not drawn ({type(e).__name__}: {e})")
        return
    if written:
        print("plots: " + ", ".join(str(p) for p in written))
