"""PNG summaries: of a store (`dataset info --plots`) and of a training run's metrics and evals."""

from __future__ import annotations

import json
from pathlib import Path

import math

import numpy as np
import pytest
from conftest import robo_rl_cli
from episodes import make_episode, small_schema

from robo_rl.data.plots import action_sample, dataset_plots, segment_shares, success_by_task
from robo_rl.data.schema import Segment
from robo_rl.data.store import EpisodeStore
from robo_rl.learn.plots import metric_panels, read_curves, read_jsonl, training_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_drawn(path: Path) -> None:
    """A real PNG with something on it (not one flat colour)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.var() > 0, path


@pytest.fixture
def small_store(tmp_path):
    schema = small_schema(cameras=False)
    with EpisodeStore.create(tmp_path / "demos", schema) as store:
        for e in range(7):
            store.add_episode(*make_episode(e, schema))
    return tmp_path / "demos"


def test_dataset_plots_write_every_summary(small_store, tmp_path):
    with EpisodeStore.open(small_store) as store:
        written = dataset_plots(store, tmp_path / "out" / "plots")
        # the numbers drawn, against the store's own columns
        shares = segment_shares(store)
        assert shares.labels == [s.name for s in Segment]  # no unknown values: no unknown bar
        seg = store.read("segment")
        assert shares.overall == pytest.approx({s.name: float(np.mean(seg == s)) for s in Segment})
        for i in range(store.n_episodes):
            ep = store.episode(i)["segment"]
            assert shares.per_episode[i] == pytest.approx([np.mean(ep == s) for s in Segment])
            assert shares.counts[i].tolist() == [int(np.sum(ep == s)) for s in Segment]
        assert shares.success == [bool(e % 2) for e in range(7)]
        assert np.array_equal(action_sample(store, "action"), store.read("action").astype(np.float64))
        expect: dict[str, tuple[int, int]] = {}
        for e in range(7):  # make_episode: task e % 3, success e odd
            ok, n = expect.get(f"task{e % 3}", (0, 0))
            expect[f"task{e % 3}"] = (ok + e % 2, n + 1)
        assert success_by_task(store) == expect
    assert [p.name for p in written] == ["episode_lengths.png", "segments.png", "actions.png", "success.png"]
    for p in written:
        assert p.parent == tmp_path / "out" / "plots"
        assert_drawn(p)


def test_dataset_plots_sample_a_big_store_in_ranges_and_skip_success_without_labels(tmp_path, monkeypatch):
    import robo_rl.data.plots as plots

    monkeypatch.setattr(plots, "MAX_ACTION_ROWS", 64)  # pretend the store is huge: sampled reads
    monkeypatch.setattr(plots, "ACTION_RANGE_ROWS", 16)
    monkeypatch.setattr(plots, "MAX_BARS", 3)  # more episodes than bars: grouped
    schema = small_schema(cameras=False)
    with EpisodeStore.create(tmp_path / "s", schema) as store:
        for e in range(5):
            data, ts, seg, meta = make_episode(e, schema)
            meta.success = None
            store.add_episode(data, ts, seg, meta)
    with EpisodeStore.open(tmp_path / "s") as store:
        sample = action_sample(store, "action")
        assert sample.shape == (64, 14)
        # four ranges of 16 contiguous rows, in order, the first from row 0 and the last to the last row
        full = store.read("action").astype(np.float64)
        starts = [int(np.flatnonzero((full == sample[16 * r]).all(1))[0]) for r in range(4)]
        assert starts[0] == 0 and starts[-1] == store.n_steps - 16 and all(np.diff(starts) >= 16)
        for r, start in enumerate(starts):
            assert np.array_equal(sample[16 * r: 16 * r + 16], full[start: start + 16])
        assert segment_shares(store).success == [None] * 5
        assert success_by_task(store) == {}
        written = dataset_plots(store, tmp_path / "plots")
    assert [p.name for p in written] == ["episode_lengths.png", "segments.png", "actions.png"]
    for p in written:
        assert_drawn(p)


def test_unknown_segment_values_get_their_own_bar(small_store, tmp_path):
    with EpisodeStore.open(small_store, mode="a") as store:
        seg = store.array("segment")
        seg[3] = 7  # values no Segment has (validate reports them): never counted as SCRIPTED
        seg[5] = 200
    with EpisodeStore.open(small_store) as store:
        values = store.read("segment")
        shares = segment_shares(store)
        assert shares.labels == [s.name for s in Segment] + ["unknown"]
        assert shares.overall["unknown"] == pytest.approx(2 / store.n_steps)
        assert shares.overall["SCRIPTED"] == pytest.approx(np.mean(values == Segment.SCRIPTED))
        assert shares.counts[:, -1].sum() == 2 and shares.counts.sum() == store.n_steps
        assert_drawn(dataset_plots(store, tmp_path / "plots")[1])


def test_info_plots_cli_writes_beside_the_store(small_store):
    r = robo_rl_cli("dataset", "info", str(small_store), "--plots")
    assert r.returncode == 0, r.stdout + r.stderr
    out = small_store.with_name("demos.plots")
    assert f"plots: 4 PNG file(s) in {out}" in r.stdout
    for name in ("episode_lengths.png", "segments.png", "actions.png", "success.png"):
        assert_drawn(out / name)
    # json=true: the plots are drawn too, and stdout stays one JSON document
    other = small_store.with_name("json.plots")
    r = robo_rl_cli("dataset", "info", str(small_store), "--plots", "json=true", f"out={other}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["episodes"] == 7
    assert f"plots: 4 PNG file(s) in {other}" in r.stderr
    for name in ("episode_lengths.png", "segments.png", "actions.png", "success.png"):
        assert_drawn(other / name)


def write_jsonl(path: Path, rows: list[dict], torn_tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn_tail)


def test_training_plots_of_a_behaviour_cloning_run(tmp_path):
    run = tmp_path / "r1-flow"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"step": s, "loss": 2.0 / s, "lr": 3e-4 * min(1, s / 500), "steps_per_s": 5.5,
                                         "time_s": s / 5.5} for s in range(50, 2001, 50)],
                torn_tail='{"step": 2050, "loss": 0.00')  # a crash mid-write
    write_jsonl(run / "evals.jsonl", [{"success_rate": sr, "ci95_low": max(0, sr - 0.1), "ci95_high": min(1, sr + 0.1),
                                       "mean_length": 300.0, "step": s, "eval_time_s": 100.0}
                                      for s, sr in ((500, 0.1), (1000, 0.4), (2000, 0.55))])
    assert len(read_jsonl(run / "metrics.jsonl")) == 40
    curves = read_curves(run)
    steps = [float(s) for s in range(50, 2001, 50)]  # the torn row at 2050 is not among them
    assert list(curves.panels) == ["loss", "lr"]
    assert curves.panels["loss"] == {"loss": (steps, [2.0 / s for s in steps])}
    assert curves.panels["lr"]["lr"] == (steps, [3e-4 * min(1, s / 500) for s in steps])
    assert [(r["step"], r["success_rate"]) for r in curves.evals] == [(500, 0.1), (1000, 0.4), (2000, 0.55)]
    written = training_plots(run)
    assert written == [run / "plots" / "loss.png", run / "plots" / "eval_success.png"]
    for p in written:
        assert_drawn(p)


def test_one_evaluation_at_100_percent_is_drawn(tmp_path):
    """A single evaluation whose Wilson bound lands a rounding error above its 100% rate (as a
    50/50 run's did) still gets its plot, with the scheduled-steps row of a timed run ignored."""
    run = tmp_path / "r-timed"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"step": 510, "scheduled_steps": 7633, "steps_per_s": 21.8},
                                        {"step": 550, "loss": 0.1, "lr": 3e-4, "steps_per_s": 20.0, "time_s": 27.0}])
    write_jsonl(run / "evals.jsonl", [{"success_rate": 1.0, "ci95_low": 0.929, "ci95_high": 1.0000000000000002,
                                       "step": 7235, "eval_time_s": 26.0}])
    assert list(read_curves(run).panels) == ["loss", "lr"]
    for p in training_plots(run):
        assert_drawn(p)


def test_training_plots_of_an_offline_rl_run(tmp_path):
    run = tmp_path / "cube1-fql"
    run.mkdir()
    rows = []
    for s in range(250, 5001, 250):
        row = {"step": s, "critic/loss": 0.1 + 0.01 * s / 250, "critic/q": -s / 250, "actor/bc_flow": 0.5 - s / 20000,
               "actor/distill": 0.05 / (s / 250), "actor/q": -s / 250, "updates_per_s": 2.8}
        if s % 1000 == 0:  # held-out TD error only every 1000 updates: rows with missing keys
            row.update(train_td_error=0.09, heldout_td_error=0.05 + s / 1e4, td_overfitting=False)
        rows.append(row)
    rows.append({"step": 5250, "critic/loss": float("nan"), "critic/q": float("inf")})  # a diverging critic
    write_jsonl(run / "metrics.jsonl", rows)
    panels = metric_panels(read_jsonl(run / "metrics.jsonl"))
    assert list(panels)[0] == "critic/loss" and panels["td_error"] == ["train_td_error", "heldout_td_error"]
    assert "updates_per_s" not in panels and "td_overfitting" not in panels and len(panels) == 6
    write_jsonl(run / "evals.jsonl", [{"step": s, "success_rate": sr, "episodes": 50, "task2": sr}
                                      for s, sr in ((4000, 0.48), (2000, 0.0), (4500, float("nan")))])
    curves = read_curves(run)
    assert curves.panels["td_error"] == {  # rows without the key are skipped, not zero
        "train_td_error": ([1000.0, 2000.0, 3000.0, 4000.0, 5000.0], [0.09] * 5),
        "heldout_td_error": ([1000.0, 2000.0, 3000.0, 4000.0, 5000.0], [0.05 + s / 1e4 for s in range(1000, 5001, 1000)])}
    loss_steps, loss = curves.panels["critic/loss"]["critic/loss"]  # the NaN at 5250 is left out
    assert loss_steps == [float(s) for s in range(250, 5001, 250)] and all(math.isfinite(v) for v in loss)
    assert [(r["step"], r["success_rate"]) for r in curves.evals] == [(2000, 0.0), (4000, 0.48)]  # by step, NaN out
    written = training_plots(run)
    assert [p.name for p in written] == ["loss.png", "eval_success.png"]
    for p in written:
        assert_drawn(p)


def test_training_plots_with_nothing_to_plot(tmp_path):
    assert training_plots(tmp_path) == []
    write_jsonl(tmp_path / "metrics.jsonl", [], torn_tail='{"step": 1')
    (tmp_path / "evals.jsonl").write_text('{"step": 100, "mean_length": 3}\n')  # no success_rate
    assert training_plots(tmp_path) == [] and not (tmp_path / "plots").exists()
    write_jsonl(tmp_path / "evals.jsonl", [{"step": 100, "success_rate": 0.5}])  # evals alone: one plot
    assert [p.name for p in training_plots(tmp_path)] == ["eval_success.png"]


def test_a_store_without_steps_plots_without_failing(tmp_path):
    with EpisodeStore.create(tmp_path / "empty", small_schema(cameras=False)) as store:
        written = dataset_plots(store, tmp_path / "plots")
    assert [p.name for p in written] == ["episode_lengths.png", "segments.png"]
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in written)
