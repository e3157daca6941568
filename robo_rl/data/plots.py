"""PNG summaries of an episode store (`robo-rl dataset info PATH --plots`).

- episode_lengths.png: how long episodes are, in steps and in seconds;
- segments.png: the share of steps per Segment label, over the store and per episode, with the
  episodes' success labels marked (steps with a value that is no Segment get an "unknown" bar);
- actions.png: one histogram per action dimension (a sample of at most MAX_ACTION_ROWS rows, read
  as a few contiguous ranges, so a store of any size plots in seconds);
- success.png: success rate by task, when any episode is labelled.

The numbers each plot draws come from a function of their own (`segment_shares`, `action_sample`,
`success_by_task`), so they can be checked without looking at pixels. Drawn with matplotlib's Agg
backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from robo_rl.data.schema import SEGMENT_KEY, Segment
from robo_rl.data.store import EpisodeStore

MAX_ACTION_ROWS = 200_000   # rows sampled for the action histograms
ACTION_RANGE_ROWS = 4096    # contiguous rows per read when sampling: whole chunks, few reads
MAX_ACTION_PANELS = 32      # action dimensions drawn (the first ones)
MAX_BARS = 200              # per-episode bars; more episodes are grouped into this many bars
SEGMENT_COLOURS = {Segment.TELEOP: "tab:blue", Segment.POLICY: "tab:grey", Segment.RECOVERY: "tab:orange",
                   Segment.CORRECTION: "tab:red", Segment.SCRIPTED: "tab:green"}
UNKNOWN = "unknown"         # the bar of segment values that are no Segment (validate names them)
UNKNOWN_COLOUR = "black"


class SegmentShares(NamedTuple):
    """Who produced each step, as `segments.png` draws it."""

    labels: list[str]        # Segment names in value order, then UNKNOWN if any step holds another value
    counts: np.ndarray       # (episodes, labels) steps per label
    overall: dict[str, float]  # label -> share of all steps (0 for every label of a store without steps)
    per_episode: np.ndarray  # (episodes, labels) share of each episode's steps (rows of 0 for empty episodes)
    success: list[bool | None]  # each episode's success label


def dataset_plots(store: EpisodeStore, out_dir: Path) -> list[Path]:
    """Write the store's PNG summaries into `out_dir` (created); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = Path(store.location).name
    written = [_episode_lengths(store, out_dir, title), _segments(store, out_dir, title)]
    action_key = _action_key(store)
    if action_key is not None and store.n_steps:
        written.append(_actions(store, action_key, out_dir, title))
    if any(m.success is not None for m in store.metas):
        written.append(_success(store, out_dir, title))
    return written


def save_figure(fig, path: Path, tight: bool = True) -> Path:
    """Write `fig` as a PNG at `path` and free it (also used by robo_rl.learn.plots)."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _episode_lengths(store: EpisodeStore, out_dir: Path, title: str) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    lengths = store.episode_lengths
    fps = store.schema.fps
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lengths, bins=min(50, max(1, len(np.unique(lengths)))), color="tab:blue", edgecolor="white")
    ax.set_xlabel("episode length (steps)")
    ax.set_ylabel("episodes")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    seconds = ax.secondary_xaxis("top", functions=(lambda steps: steps / fps, lambda s: s * fps))
    seconds.set_xlabel("episode length (seconds)")
    mean = f", mean {lengths.mean():.0f} steps ({lengths.mean() / fps:.1f} s)" if len(lengths) else ""
    ax.set_title(f"{title}: {store.n_episodes} episodes{mean} at {fps:g} fps", fontsize="medium")
    return save_figure(fig, out_dir / "episode_lengths.png")


def segment_shares(store: EpisodeStore) -> SegmentShares:
    """The share of steps per segment label, over the store and per episode, and each episode's success."""
    n_known = len(Segment)
    values = store.read(SEGMENT_KEY).astype(np.int64)
    unknown = values >= n_known
    labels = [s.name for s in Segment] + ([UNKNOWN] if unknown.any() else [])
    columns = np.where(unknown, n_known, values)  # every unknown value into the one extra column
    episode_of_step = np.repeat(np.arange(store.n_episodes), store.episode_lengths)
    counts = np.bincount(episode_of_step * len(labels) + columns,
                         minlength=store.n_episodes * len(labels)).reshape(store.n_episodes, len(labels))
    total = counts.sum(0)
    overall = dict(zip(labels, (total / max(int(total.sum()), 1)).tolist()))
    per_episode = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    return SegmentShares(labels, counts, overall, per_episode, [m.success for m in store.metas])


def _segments(store: EpisodeStore, out_dir: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    shares = segment_shares(store)
    labels, counts = shares.labels, shares.counts
    colours = [SEGMENT_COLOURS[Segment[name]] if name != UNKNOWN else UNKNOWN_COLOUR for name in labels]
    # Many episodes: neighbours share a bar, so the figure stays readable and quick to draw.
    groups = np.array_split(np.arange(store.n_episodes), min(MAX_BARS, store.n_episodes)) if store.n_episodes else []
    bar_counts = np.array([counts[g].sum(0) for g in groups]).reshape(-1, len(labels))
    bar_shares = bar_counts / np.maximum(bar_counts.sum(1, keepdims=True), 1)
    fig, (overall, per_episode) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1, 3]})
    overall.bar(labels, [shares.overall[name] for name in labels], color=colours)
    overall.set_ylabel("share of steps")
    overall.set_ylim(0, 1)
    overall.tick_params(axis="x", labelrotation=45)
    overall.set_title("all steps")
    x = np.arange(len(groups))
    bottom = np.zeros(len(groups))
    total = counts.sum(0)
    for c, name in enumerate(labels):
        if total[c]:
            per_episode.bar(x, bar_shares[:, c], bottom=bottom, width=1.0, color=colours[c], label=name)
            bottom += bar_shares[:, c]
    success = [[shares.success[int(i)] for i in g] for g in groups]
    rate = np.array([np.mean([v for v in g if v is not None]) if any(v is not None for v in g) else np.nan
                     for g in success])
    labelled = ~np.isnan(rate)
    if labelled.any():
        marks = per_episode.scatter(x[labelled], np.full(labelled.sum(), 1.04), c=rate[labelled], cmap="RdYlGn",
                                    vmin=0, vmax=1, marker="v", s=18, clip_on=False)
        fig.colorbar(marks, ax=per_episode, pad=0.01, label="success (marker above the bar)")
    per_episode.set_xlim(-0.5, max(len(groups), 1) - 0.5)
    per_episode.set_ylim(0, 1)
    per_episode.set_ylabel("share of the episode's steps")
    per_episode.set_xlabel("episode" if len(groups) == store.n_episodes
                           else f"episodes, {store.n_episodes / max(len(groups), 1):.1f} per bar")
    per_episode.set_title("per episode", pad=14)  # room for the success markers
    if total.any():
        per_episode.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(labels), fontsize="small",
                           frameon=False)
    fig.suptitle(f"{title}: who produced each step")
    return save_figure(fig, out_dir / "segments.png")


def _action_key(store: EpisodeStore) -> str | None:
    keys = store.schema.lowdim_keys
    if "action" in keys:
        return "action"
    return next((k for k in keys if k.startswith("action")), None)


def action_sample(store: EpisodeStore, key: str, max_rows: int | None = None,
                  range_rows: int | None = None) -> np.ndarray:
    """At most `max_rows` (MAX_ACTION_ROWS) rows of `key`, all of them if the store holds no more,
    else as evenly spread, non-overlapping contiguous ranges of `range_rows` (ACTION_RANGE_ROWS)
    rows from the first row to the last; flattened per step, as float64."""
    max_rows = MAX_ACTION_ROWS if max_rows is None else max_rows
    range_rows = min(ACTION_RANGE_ROWS if range_rows is None else range_rows, max_rows)
    n = store.n_steps
    if n <= max_rows:
        rows = store.read(key)
    else:
        starts = np.linspace(0, n - range_rows, max(1, max_rows // range_rows)).astype(np.int64)
        rows = np.concatenate([store.read(key, int(s), int(s) + range_rows) for s in starts])
    return rows.reshape(len(rows), -1).astype(np.float64)


def _actions(store: EpisodeStore, key: str, out_dir: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    sample = action_sample(store, key)
    dims = min(sample.shape[1], MAX_ACTION_PANELS)
    cols = min(dims, 7)  # 7: one ALOHA arm (6 joints + gripper) per row
    rows = -(-dims // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.1 * cols, 1.7 * rows + 0.6), squeeze=False)
    # fixed margins: tight_layout over dozens of panels costs a second
    fig.subplots_adjust(left=0.03, right=0.98, bottom=0.08, top=1 - 0.6 / (1.7 * rows + 0.6), wspace=0.25, hspace=0.6)
    for d, ax in enumerate(axes.flat):
        if d >= dims:
            ax.axis("off")
            continue
        counts, edges = np.histogram(sample[:, d], bins=50)
        ax.stairs(counts, edges, fill=True, color="tab:purple")  # one artist, not 50 bars: a big grid draws fast
        ax.set_title(f"{key}[{d}]", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.set_yticks([])
    shown = f", first {dims} of {sample.shape[1]} dims" if dims < sample.shape[1] else ""
    fig.suptitle(f"{title}: {key} over {len(sample)} of {store.n_steps} steps{shown}")
    return save_figure(fig, out_dir / "actions.png", tight=False)


def success_by_task(store: EpisodeStore) -> dict[str, tuple[int, int]]:
    """Task ("(none)" for none) -> (successful, labelled) episodes, over episodes with a success label."""
    by_task: dict[str, tuple[int, int]] = {}
    for m in store.metas:
        if m.success is not None:
            ok, n = by_task.get(m.task or "(none)", (0, 0))
            by_task[m.task or "(none)"] = (ok + bool(m.success), n + 1)
    return by_task


def _success(store: EpisodeStore, out_dir: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    by_task = success_by_task(store)
    tasks = sorted(by_task)
    rates = [succeeded / labelled for succeeded, labelled in (by_task[t] for t in tasks)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(tasks) + 2), 3.5))
    bars = ax.bar(tasks, rates, color="tab:green")
    for bar, t in zip(bars, tasks):
        ax.annotate(f"{by_task[t][0]}/{by_task[t][1]}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize="small")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("success rate (labelled episodes)")
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_title(f"{title}: success by task")
    return save_figure(fig, out_dir / "success.png")
