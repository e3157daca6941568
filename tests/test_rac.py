"""RaC's intervention state machine: transitions, labels, the END rule, ignored events, and a
switch of control without a jump in the commanded joints."""

import numpy as np
import pytest

from robo_rl.data.schema import Segment
from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.rac import InterventionConfig, InterventionController, OperatorEvent, Phase


class ScriptedKeys:
    """A human at a keyboard, as a script: {tick: event} and a fixed far-away leader-arm pose."""

    name = "keys"

    def __init__(self, events: dict[int, str], pose: np.ndarray):
        self.events, self.pose, self.tick = events, pose, 0

    def signal(self, phase, policy_action):
        kind = self.events.get(self.tick)
        self.tick += 1
        return OperatorEvent(kind, "pressed") if kind else None

    def command(self, phase, last_command):
        return self.pose


def drive(events, mode="rac", ticks=40, max_step=0.05):
    pose = np.full(3, 1.0, np.float32)
    ctl = InterventionController(ScriptedKeys(events, pose), InterventionConfig(mode=mode, max_step=max_step))
    labels, out = [], []
    for k in range(ticks):
        if ctl.done:
            break
        a, label = ctl.step(np.zeros(3, np.float32), time=k * 0.02, stage=k // 10)
        labels.append(label)
        out.append(a)
    return ctl, labels, np.array(out)


def test_rac_transitions_labels_and_end():
    ctl, labels, out = drive({5: "take_over", 12: "recovery_done", 20: "correction_done"})
    assert ctl.done and ctl.phase == Phase.END
    assert labels[:5] == [Segment.POLICY] * 5
    assert labels[5:12] == [Segment.RECOVERY] * 7
    assert labels[12:20] == [Segment.CORRECTION] * 8
    assert len(labels) == 21  # END: the tick the correction ends is the last; no policy step follows
    assert Segment.POLICY not in labels[5:]
    (rec,) = ctl.interventions
    assert (rec.step, rec.stage, rec.reason, rec.recovery_steps, rec.correction_steps) == (5, 0, "pressed", 7, 8)
    assert rec.time == pytest.approx(0.1) and rec.ended == "pressed"
    with pytest.raises(RoboRLError, match="ended"):
        ctl.step(np.zeros(3))


def test_takeover_and_handback_are_smooth():
    """The operator's pose is 1 rad away: the output walks there at max_step per tick, never
    jumps; under HG-DAgger the hand-back to the policy (at 0) is rate-limited the same way."""
    ctl, labels, out = drive({5: "take_over", 30: "recovery_done", 32: "correction_done"}, mode="hg_dagger",
                             ticks=60, max_step=0.05)
    steps = np.abs(np.diff(out, axis=0)).max(axis=1)
    assert steps.max() <= 0.05 + 1e-6
    assert out[5 + 20 - 1, 0] == pytest.approx(1.0)  # caught up after 20 ticks of 0.05, then follows exactly
    assert labels[33] == Segment.POLICY and out[-1, 0] == pytest.approx(0.0)  # control came back, output reached it
    assert not ctl.done and len(ctl.interventions) == 1


def test_events_out_of_phase_are_ignored_and_counted():
    ctl, labels, _ = drive({2: "correction_done", 3: "recovery_done", 4: "take_over", 6: "take_over", 9: "recovery_done",
                            11: "correction_done"})
    assert ctl.done and len(ctl.interventions) == 1
    assert [(s, e) for s, e, _ in ctl.ignored_events] == [(2, "correction_done"), (3, "recovery_done"), (6, "take_over")]


def test_hg_dagger_limit_and_unfinished_intervention():
    ctl, labels, _ = drive({1: "take_over", 2: "recovery_done", 3: "correction_done", 5: "take_over"}, mode="hg_dagger",
                           ticks=10)
    assert len(ctl.interventions) == 2 and ctl.in_control
    ctl.finish()  # time ran out during the second one
    assert ctl.interventions[1].ended == "episode_end"
    pose = np.ones(3, np.float32)
    c = InterventionController(ScriptedKeys({1: "take_over", 2: "recovery_done", 3: "correction_done", 5: "take_over"}, pose),
                               InterventionConfig(mode="hg_dagger", max_interventions=1))
    for k in range(10):
        c.step(np.zeros(3))
    assert len(c.interventions) == 1 and c.ignored_events == [(5, "take_over", "autonomous")]


def test_bad_intervention_config_is_a_one_line_error():
    with pytest.raises(ConfigError, match="mode='dagger'"):
        InterventionConfig(mode="dagger")


# --------------------------------------------------------------------------- data composition
from robo_rl.data.sampler import WindowSampler  # noqa: E402
from robo_rl.data.schema import EpisodeMeta, Schema  # noqa: E402
from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.rac.mixing import CompositionConfig, MixedSampler, composition_weights, pre_takeover_mask  # noqa: E402

P, R, C, T = int(Segment.POLICY), int(Segment.RECOVERY), int(Segment.CORRECTION), int(Segment.TELEOP)


def store_with(path, episodes):
    """A real zarr store whose episodes carry the given per-step labels."""
    store = EpisodeStore.create(path, Schema.build({"obs/qpos": ((2,), "float32"), "action": ((2,), "float32")}, fps=50))
    for labels in episodes:
        n = len(labels)
        store.add_episode({"obs/qpos": np.zeros((n, 2), np.float32), "action": np.full((n, 2), n, np.float32)},
                          np.arange(n) / 50, np.asarray(labels), EpisodeMeta(task="toy"))
    return store


def test_pre_takeover_mask_stays_inside_the_episode():
    seg = np.array([P, P, P, P, R, R, C, P, P, C])
    starts = np.array([0, 8])  # the second episode starts at step 8: its P at 8 precedes C at 9
    mask = pre_takeover_mask(seg, starts, 2)
    assert mask.tolist() == [False, False, True, True, False, False, False, False, True, False]


def test_unfinished_corrections_weigh_nothing():
    # two RaC episodes: the first correction finished its sub-task, the second ran out of time
    inter = np.array([P] * 6 + [R] * 2 + [C] * 2 + [P] * 5 + [R] * 2 + [C] * 3)
    records = [[{"step": 6, "ended": "sub-task done"}], [{"step": 5, "ended": "episode_end"}]]
    src = {"segments": inter, "episode_starts": [0, 10], "interventions": records}
    demo = {"segments": np.full(20, T), "episode_starts": [0], "demo": True}
    _, w = composition_weights([demo, src], CompositionConfig(mode="rac"))
    assert w[6:10].min() > 0 and w[15:20].max() == 0 and w[10:15].max() == 0
    _, w_all = composition_weights([demo, src], CompositionConfig(mode="rac", finished_only=False))
    assert w_all[15:20].min() > 0  # the option off: every operator step trains


def test_the_composition_report_says_how_often_a_round_step_is_drawn_against_a_demo_step():
    # 20 demo steps; a round whose only finished intervention left 4 operator steps: half of each
    # batch on 4 steps draws each of them 5x as often as a demo step
    from robo_rl.rac.mixing import composition_report

    inter = np.array([P] * 6 + [R] * 2 + [C] * 2 + [P] * 5 + [R] * 2 + [C] * 3)
    records = [[{"step": 6, "ended": "sub-task done"}], [{"step": 5, "ended": "episode_end"}]]
    sources = [{"segments": np.full(20, T), "episode_starts": [0], "demo": True},
               {"segments": inter, "episode_starts": [0, 10], "interventions": records}]
    line = composition_report(sources, composition_weights(sources, CompositionConfig(mode="rac")))
    assert "rounds' 4 training steps are 50% of each batch" in line and "demos' 20" in line and "5.0x" in line, line
    line = composition_report(sources, composition_weights(sources, CompositionConfig(mode="rac", demo_share=0.8)))
    assert "20% of each batch" in line and "1.2x" in line, line


def test_no_recovery_after_masks_only_that_takeovers_recovery():
    # a dead end (recovery 6-7, correction 8-9) and a misaligned grasp (recovery 15-16, correction 17-19)
    inter = np.array([P] * 6 + [R] * 2 + [C] * 2 + [P] * 5 + [R] * 2 + [C] * 3)
    records = [[{"step": 6, "reason": "dead end: the expert cannot finish from both_lifted", "ended": "sub-task done"}],
               [{"step": 5, "reason": "right gripper closed without holding peg (misaligned grasp)", "ended": "sub-task done"}]]
    src = {"segments": inter, "episode_starts": [0, 10], "interventions": records}
    demo = {"segments": np.full(20, T), "episode_starts": [0], "demo": True}
    _, w = composition_weights([demo, src], CompositionConfig(mode="rac", no_recovery_after=["dead end"]))
    assert w[6:8].max() == 0 and w[8:10].min() > 0  # the dead end's letting go is out, its correction in
    assert w[15:20].min() > 0  # the other takeover's recovery and correction both train
    assert composition_weights([demo, src], CompositionConfig(mode="rac"))[1].tolist() == w.tolist()  # the default
    _, w_off = composition_weights([demo, src], CompositionConfig(mode="rac", no_recovery_after=[]))
    assert w_off[6:8].min() > 0
    _, w_none = composition_weights([demo, src], CompositionConfig(mode="rac", no_intervention_after="dead end"))
    assert w_none[6:10].max() == 0  # the dead end's recovery and its correction are both out
    assert w_none[15:20].min() > 0  # the misaligned grasp's intervention still trains


def test_successful_rollouts_train_only_the_policys_clean_successes():
    # three rollouts: finished by the policy alone (0-4), finished after a takeover (5-9), failed alone (10-14)
    inter = np.array([P] * 5 + [P] * 2 + [R] + [C] * 2 + [P] * 5)
    records = [[], [{"step": 2, "reason": "no progress", "ended": "sub-task done"}], []]
    src = {"segments": inter, "episode_starts": [0, 5, 10], "interventions": records, "successes": [True, True, False]}
    demo = {"segments": np.full(20, T), "episode_starts": [0], "demo": True}
    _, w = composition_weights([demo, src], CompositionConfig(mode="rac", successful_rollouts=True))
    assert w[0:5].min() > 0  # the clean success trains
    assert w[5:7].max() == 0 and w[10:15].max() == 0  # the policy's steps before a takeover, and a failure, do not
    assert w[7:10].min() > 0
    _, w_off = composition_weights([demo, src], CompositionConfig(mode="rac"))
    assert w_off[0:5].max() == 0  # off by default: RaC trains the operator's steps only


@pytest.mark.parametrize("mode", ["rac", "corrections", "hg_dagger", "sirius", "all"])
def test_composition_weights_masks_and_shares(mode):
    demo = np.full(300, T)
    inter = np.array([P] * 60 + [R] * 20 + [C] * 20 + [P] * 50 + [C] * 50)  # two episodes: 100 + 100
    cfg = CompositionConfig(mode=mode, demo_share=0.4)
    wd, wi = composition_weights([{"segments": demo, "episode_starts": [0], "demo": True},
                                  {"segments": inter, "episode_starts": [0, 100]}], cfg)
    total = wd.sum() + wi.sum()
    assert total == pytest.approx(len(demo) + len(inter), rel=1e-5)  # mean weight 1
    assert wd.sum() / total == pytest.approx(0.4, abs=1e-6)  # the mixing ratio
    rec, cor, pol = wi[inter == R], wi[inter == C], wi[inter == P]
    if mode in ("rac", "hg_dagger"):
        assert pol.max() == 0 and rec.min() > 0 and cor.min() > 0 and (rec.sum() + cor.sum()) / total == pytest.approx(0.6)
    if mode == "corrections":
        assert pol.max() == 0 and rec.max() == 0 and cor.sum() / total == pytest.approx(0.6)
    if mode == "sirius":
        assert (rec.sum() + cor.sum()) / total == pytest.approx(0.5)  # interventions' fixed share
        assert wi[45:60].max() == 0 and wi[0:45].min() > 0  # the 15 steps before the takeover weigh nothing
        assert wi[135:150].max() == 0  # and before the second takeover
    if mode == "all":
        assert wi.min() > 0


def test_bad_compositions_are_one_line_errors():
    with pytest.raises(ConfigError, match="mode='dagger'"):
        CompositionConfig(mode="dagger")
    with pytest.raises(ConfigError, match="> 1"):
        CompositionConfig(demo_share=0.7, intervention_share=0.5)
    with pytest.raises(ConfigError, match="unknown label"):
        CompositionConfig(segment_weights={"RESCUE": 1.0}).label_table()
    with pytest.raises(ConfigError, match="intervention_share"):
        composition_weights([{"segments": np.full(10, T), "demo": True}], CompositionConfig(intervention_share=0.5))


@pytest.mark.parametrize("torch_rng", [False, True])
def test_mixed_sampler_batches_follow_the_shares(tmp_path, torch_rng):
    import torch

    demos = store_with(tmp_path / "demos", [[T] * 40] * 5)
    inter = store_with(tmp_path / "inter", [[P] * 30 + [R] * 10 + [C] * 10] * 2)
    device = "cpu" if torch_rng else None
    sd = WindowSampler(demos, ["obs/qpos"], horizon=4, device=device)
    si = WindowSampler(inter, ["obs/qpos"], horizon=4, device=device)
    wd, wi = composition_weights([{"segments": sd.data["segment"], "episode_starts": sd.start, "demo": True},
                                  {"segments": si.data["segment"], "episode_starts": si.start}],
                                 CompositionConfig(mode="rac", demo_share=0.25))
    sd.reweight(wd)
    si.reweight(wi)
    mixed = MixedSampler([sd, si])
    rng = torch.Generator().manual_seed(0) if torch_rng else np.random.default_rng(0)
    batch = mixed.sample(4000, rng, weighted=True)
    source = np.asarray(batch["source"])
    seg = np.asarray(batch["segment"])
    assert abs((source == 0).mean() - 0.25) < 0.03  # a quarter of each batch from the demos
    assert not (seg[source == 1] == P).any()  # RaC: the policy's own steps are never drawn
    assert set(np.unique(seg[source == 1])) == {R, C}
    with pytest.raises(ConfigError, match="reweight"):
        sd.reweight(np.ones(3))


# --------------------------------------------------------------------------- a tiny round in the twin
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def _cli(*args, timeout=900):
    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=Path(__file__).parents[1])


@pytest.mark.slow  # 57 s (AMD EPYC, AVX2 only); the round's pieces stay in the default run (the tiny `demo` runs, every intervention mode, the operator)
def test_a_tiny_rac_round_end_to_end(tmp_path):
    """collect -> pre-train (a few steps) -> rac: RaC, HG-DAgger and more demos each collect,
    fine-tune from the checkpoint and evaluate; stores carry labels and intervention records,
    HG-DAgger and the demos stop at RaC's operator samples (up to one episode), plots are written."""
    demos, run, out = tmp_path / "demos", tmp_path / "run", tmp_path / "rac"
    r = _cli("collect", "task=transfer_cube", "episodes=2", "cameras=[]", f"out={demos}")
    assert r.returncode == 0, r.stderr
    r = _cli("train", "policy=flow", "task=transfer_cube", f"dataset={demos}", f"run_dir={run}", "learner.steps=10",
             "learner.batch_size=8", "eval.episodes=0", "policy.dit_dim=32", "policy.dit_depth=2")
    assert r.returncode == 0, r.stderr
    r = _cli("rac", f"checkpoint={run / 'checkpoints' / 'last.pt'}", "rounds=1", "episodes_per_round=2", "n_envs=2",
             "finetune.steps=5", "finetune.batch_size=8", "eval.episodes=2", "eval.n_envs=2", f"out={out}",
             "operator_config.patience_s=1.0")  # processes=2: each evaluation's second episode in a spawned process
    assert r.returncode == 0, r.stdout + r.stderr
    assert "HG-DAgger" in r.stdout and "operator samples" in r.stdout
    res = json.loads((out / "results.json").read_text())
    rows = {row["method"]: row for row in res["rows"]}
    assert set(rows) == {"rac", "hg_dagger", "demos", "no_new_data"}
    # the control: one fine-tune on the pre-training demos alone, no operator effort
    assert [row["round"] for row in res["rows"] if row["method"] == "no_new_data"] == [1]
    assert rows["no_new_data"]["operator_samples"] == 0 and rows["no_new_data"]["finetune_steps"] == 5
    assert not (out / "no_new_data" / "data").exists()
    assert 0.0 <= res["base"]["success_rate"] <= 1.0 and len(res["base"]["success_within"]) == 6
    for row in ("eval-base", "rac/round1/eval", "no_new_data/round1/eval"):  # both halves, in episode order
        assert [e["seed"] for e in json.loads((out / row / "eval.json").read_text())["per_episode"]] == [100_000, 100_001]
    for name in ("success_vs_samples", "success_vs_time", "test_time_scaling"):
        assert (out / f"{name}.png").stat().st_size > 1000
    # RaC episodes: POLICY, then RECOVERY, then CORRECTION, and nothing after (END)
    store = EpisodeStore.open(out / "rac" / "data" / "round1")
    assert store.n_episodes == 2
    for e in range(store.n_episodes):
        seg = store.episode(e)["segment"]
        runs = [int(seg[0])] + [int(b) for a, b in zip(seg, seg[1:]) if a != b]
        meta = store.metas[e]
        if meta.extra["interventions"]:
            assert runs == [P, R, C], runs
            rec = meta.extra["interventions"][0]
            assert rec["recovery_steps"] > 0 and rec["correction_steps"] > 0 and rec["reason"]
        else:
            assert runs == [P] and meta.success
    rac_samples = rows["rac"]["operator_samples"]
    assert rac_samples > 0
    # HG-DAgger: no recovery manoeuvre; control came back to the policy after a correction
    hg = EpisodeStore.open(out / "hg_dagger" / "data" / "round1")
    for e, meta in enumerate(hg.metas):  # at most the one held tick per takeover is labelled RECOVERY
        assert (hg.episode(e)["segment"] == R).sum() <= len(meta.extra["interventions"])
    # equal operator effort, up to one episode's worth
    assert rows["hg_dagger"]["operator_samples"] >= rac_samples
    assert rows["demos"]["operator_samples"] >= rac_samples
    demo_store = EpisodeStore.open(out / "demos" / "data" / "round1")
    assert (demo_store.episode(0)["segment"] == T).all()
    assert rows["demos"]["operator_samples"] - rac_samples < max(demo_store.episode_range(e)[1] - demo_store.episode_range(e)[0]
                                                                 for e in range(demo_store.n_episodes))
    # every fine-tune started from the pre-trained checkpoint and wrote its own run
    assert (out / "rac" / "round1" / "checkpoints" / "last.pt").is_file()
    r = _cli("rac", f"checkpoint={run / 'checkpoints' / 'last.pt'}", f"out={out}")
    assert r.returncode == 2 and "already holds a run" in r.stderr


@pytest.mark.slow  # ~80 s; `make demo` runs the same story, and test_a_tiny_rac_round_end_to_end covers its parts
def test_the_demo_runs_the_whole_story_at_toy_size(tmp_path):
    """make demo's command at toy sizes: every stage runs and leaves its files; the table has the
    three rows (pre-trained, the no-new-data control, after RaC) on the same seeds. With
    from_scratch=false the control is fine-tuned on the demos alone from the pre-trained weights."""
    out = tmp_path / "demo"
    r = _cli("demo", "small.demos=2", "small.pretrain_steps=10", "small.episodes_per_round=2", "small.finetune_steps=5",
             "small.eval_episodes=2", "n_envs=2", "threads=1", f"out={out}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pre-trained, control and after RaC" in r.stdout and "recovery manoeuvres" in r.stdout
    assert "vs control" in r.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["recording"]["episodes"] == 2 and res["rounds"][0]["collect"]["episodes"] == 2
    seeds = {k: [e["seed"] for e in json.loads((out / f"eval-{k}" / "eval.json").read_text())["per_episode"]]
             for k in ("pretrained", "after-rac")}
    assert seeds["pretrained"] == seeds["after-rac"]
    assert set(res["verdict"]) >= {"vs_pretrained", "vs_control", "control_vs_pretrained_points", "line"}
    assert (out / "before_after.png").stat().st_size > 1000
    for k in ("pretrained", "after-rac"):
        assert list((out / f"eval-{k}" / "videos").glob("*.mp4")), k
    assert EpisodeStore.open(out / "interventions" / "round1").n_episodes == 2
    # RaC retrained from scratch on demos + interventions for the pre-training's steps; the control
    # (the same on the demos alone) is the pre-training itself, not trained twice
    from robo_rl.policies import read_checkpoint

    rac = read_checkpoint(out / "rac-round1" / "checkpoints" / "last.pt")
    assert rac["finetune"]["stores"] == [str(out / "demos"), str(out / "interventions" / "round1")]
    assert rac["step"] == 10
    assert rac["policy"]["config"]["sample_temperature"] == 0.5  # the CPU sizes' noise scale, kept by the retrain
    assert res["control_is_pretraining"] and res["control"] == res["before"] and not (out / "control").exists()
    # full=auto on a machine without CUDA: the CPU sizes, and their task
    assert res["task"] == "pack_cube_nolid" and "pack_cube_nolid at CPU sizes" in r.stdout
    r = _cli("demo", "small.demos=0", f"out={out}")
    assert r.returncode == 2 and r.stderr.startswith("error:")
    r = _cli("demo", "full=maybe", f"out={tmp_path / 'bad'}")
    assert r.returncode == 2 and "full='maybe'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("demo", "small.sample_temperature=3", f"out={tmp_path / 'bad-temperature'}")
    assert r.returncode == 2 and "sample_temperature=3.0" in r.stderr and not (tmp_path / "bad-temperature").exists()
    out2 = tmp_path / "demo-finetune"
    r = _cli("demo", "small.demos=2", "small.pretrain_steps=10", "small.episodes_per_round=2", "small.finetune_steps=5",
             "small.eval_episodes=2", "n_envs=2", "threads=1", "videos=0", "from_scratch=false", f"out={out2}")
    assert r.returncode == 0, r.stdout + r.stderr
    # processes=2 (the default) on a CPU: the control's fine-tune ran in a second process beside the round's
    assert "beside the round's fine-tune" in r.stdout and "5 fine-tune, control (beside round 1's" in r.stdout
    assert read_checkpoint(out2 / "control" / "checkpoints" / "last.pt")["finetune"]["stores"] == [str(out2 / "demos")]
    assert read_checkpoint(out2 / "rac-round1" / "checkpoints" / "last.pt")["step"] == 5
    seeds = {k: [e["seed"] for e in json.loads((out2 / f"eval-{k}" / "eval.json").read_text())["per_episode"]]
             for k in ("pretrained", "control", "after-rac")}
    assert seeds["pretrained"] == seeds["control"] == seeds["after-rac"]


def test_an_evaluation_in_parts_gives_the_same_rows_in_one_process_or_two(tmp_path, checkpoints):
    """The demo's evaluations: parts of consecutive episodes, each with its own noise seed and one
    thread, give the same episodes whether a part runs here or in a spawned process (the demo's
    processes=2); an error in that process is raised here."""
    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.sim.evaluate import EvaluationProcess, evaluate_with_recoveries, merge_shards, shard_spans

    assert shard_spans(100, 2) == [(0, 50), (50, 50)] and shard_spans(5, 2) == [(0, 2), (2, 3)]
    assert shard_spans(1, 2) == [(0, 1)]
    # the pre-trained row beside RaC's round: every part in the spawned process; and one that fails
    in_child = EvaluationProcess(checkpoints["state"], "cpu", "transfer_cube", {"n_action_steps": 8}, shard_spans(2, 2),
                                 1, 300, tmp_path / "child", videos=1)
    failing = EvaluationProcess(tmp_path / "nowhere.pt", "cpu", "transfer_cube", {"n_action_steps": 8},
                                shard_spans(2, 2), 1, 300, None, videos=0)
    policy = load_policy(read_checkpoint(checkpoints["state"]))
    args = (policy, "transfer_cube", {"n_action_steps": 8}, 2, 1, 300, 2)
    here = evaluate_with_recoveries(*args, tmp_path / "here", videos=1, shards=2, progress=False)
    child_parts = in_child.parts()
    per_episode = json.loads((tmp_path / "here" / "eval.json").read_text())["per_episode"]
    assert [e.__dict__ for e in merge_shards(child_parts).episodes] == per_episode
    assert [e["seed"] for e in per_episode] == [300, 301]
    # its video of episode 300 is made in both places, with as many frames. Not byte for byte:
    # after tests/test_policies.py in this process the arms' pixels differed by up to 0.9 grey
    # levels a frame (mean) in about half the runs, the rows staying equal; the cause is not found
    from robo_rl.data.codecs import probe

    videos = [Path(here["videos"][0]), Path(child_parts[0].videos[0])]
    assert videos[0].name == videos[1].name == "seed300_fail.mp4"
    assert probe(videos[0])["frames"] == probe(videos[1])["frames"] > 0
    # an error in the spawned process is raised here
    with pytest.raises(RoboRLError, match="nowhere.pt"):
        failing.parts()


def test_demos_from_a_store_of_another_task_or_too_short_is_one_line_naming_what_it_holds(tmp_path, capsys):
    from conftest import robo_rl_in_process

    for task, n in (("transfer_cube", 60), ("pack_cube_nolid", 3)):
        store = EpisodeStore.create(tmp_path / task, Schema.build({"obs/qpos": ((14,), "float32"),
                                                                   "action": ((14,), "float32")}, fps=50))
        for _ in range(n):
            store.add_episode({"obs/qpos": np.zeros((5, 14), np.float32), "action": np.zeros((5, 14), np.float32)},
                              np.arange(5) / 50, "TELEOP", EpisodeMeta(task=task))
        code, err = robo_rl_in_process(capsys, "demo", f"demos_from={tmp_path / task}", f"out={tmp_path / ('out-' + task)}")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"holds {n} episodes of ['{task}']" in err and "needs 50 of pack_cube_nolid" in err, err
    # obs=images: a store without the demo's cameras, or with frames of another size, says what it has
    frames = EpisodeStore.create(tmp_path / "frames", Schema.build({"obs/qpos": ((14,), "float32"), "action": ((14,), "float32"),
                                                                   "obs/images/top": ((48, 64, 3), "uint8")}, fps=50))
    frames.add_episode({"obs/qpos": np.zeros((5, 14), np.float32), "action": np.zeros((5, 14), np.float32),
                        "obs/images/top": np.zeros((5, 48, 64, 3), np.uint8)}, np.arange(5) / 50, "TELEOP",
                       EpisodeMeta(task="pack_cube_nolid"))
    for cameras, expected in (("[top,right_wrist]", "has no ['obs/images/right_wrist']; its cameras are ['top']"),
                              ("[top]", "has frames of {'top': [48, 64]}")):
        code, err = robo_rl_in_process(capsys, "demo", "obs=images", f"cameras={cameras}", "small.demos=1",
                                       f"demos_from={tmp_path / 'frames'}", f"out={tmp_path / 'out-frames'}")
        assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    # a camera the twin lacks: one line naming the ones it has, and nothing written
    code, err = robo_rl_in_process(capsys, "demo", "obs=images", "cameras=[top,nose]", f"out={tmp_path / 'out-nose'}")
    assert code == 2 and "no camera 'nose'; its cameras are ['top', 'left_wrist', 'right_wrist']" in err, err
    assert not (tmp_path / "out-nose").exists()
    code, err = robo_rl_in_process(capsys, "demo", "from_scratch=sometimes", f"out={tmp_path / 'out-how'}")
    assert code == 2 and "from_scratch='sometimes'" in err and not (tmp_path / "out-how").exists(), err


@pytest.mark.slow  # ~1.5 min: PackCube's demos and rollouts rendered
def test_the_demo_with_cameras_records_trains_and_rolls_out_on_frames(tmp_path):
    """`demo obs=images`: the demos, RaC's rollouts and the policy all go through the cameras (no
    object poses); the stores hold the frames at the asked size; the policy is `train`'s camera
    recipe, image_policy on top, and its chunks are ensembled."""
    out = tmp_path / "demo"
    r = _cli("demo", "obs=images", "cameras=[top]", "image_size=[32,48]", "small.demos=1", "small.pretrain_steps=5",
             "small.episodes_per_round=1", "small.eval_episodes=1", "n_envs=1", "threads=1", "videos=0",
             "small.finetune_steps=3", "+image_policy.noise_samples=2", "processes=1", f"out={out}")
    assert r.returncode == 0, r.stdout + r.stderr
    from robo_rl.policies import read_checkpoint

    # from_scratch=auto with cameras: RaC fine-tunes the pre-trained weights and the control is trained
    # too, here (processes=1) after the round's fine-tune, in this process
    res = json.loads((out / "results.json").read_text())
    assert not res["control_is_pretraining"] and "control (no new data)" in r.stdout and "beside" not in r.stdout
    assert read_checkpoint(out / "rac-round1" / "checkpoints" / "last.pt")["step"] == 3
    assert read_checkpoint(out / "control" / "checkpoints" / "last.pt")["step"] == 3

    ckpt = read_checkpoint(out / "pretrain" / "checkpoints" / "last.pt")
    config = ckpt["policy"]["config"]
    assert ckpt["obs_keys"] == ["obs/qpos", "obs/images/top"] and config["image_encoder"] == "conv"
    assert (config["n_obs"], config["backbone"], config["aux_chunk_weight"]) == (1, "mlp", 1.0)
    assert config["noise_samples"] == 2  # image_policy wins over the recipe's 4
    assert ckpt["chunking"] == {"mode": "ensemble"}
    for store in (out / "demos", out / "interventions" / "round1"):
        frames = EpisodeStore.open(store).episode(0)["obs/images/top"]
        assert frames.shape[1:] == (32, 48, 3) and frames.std() > 5
    r = _cli("demo", "obs=pixels", f"out={tmp_path / 'x'}")
    assert r.returncode == 2 and "obs='pixels'" in r.stderr


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _stat(int(p.name))[1] == pid]


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) of a process, ("X", 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return "X", 0
    return fields[0], int(fields[1])


def _running(pid: int) -> bool:
    return _stat(pid)[0] not in ("X", "Z")  # a zombie has exited; whoever adopted it has not reaped it yet


def test_a_killed_demo_resumes_where_it_stopped(tmp_path):
    """SIGKILL the demo while it collects RaC rollouts; its second process (the pre-trained policy's
    evaluation, beside the round) exits too; `resume=true` reuses the recorded demos and the
    pre-training, sets the partial rollouts aside and finishes."""
    out = tmp_path / "demo"
    args = ["task=transfer_cube", "small.demos=2", "small.pretrain_steps=10", "small.episodes_per_round=6",  # the shortest task
            "small.finetune_steps=5", "small.eval_episodes=2", "n_envs=1", "threads=1", "videos=0", f"out={out}"]
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", "demo", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"})
    try:
        deadline = time.time() + 300
        while not (out / "interventions" / "round1").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)
        beside = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert beside  # the evaluation's process, and no more running within seconds of the kill
    deadline = time.time() + 10
    while any(_running(pid) for pid in beside) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_running(pid) for pid in beside)
    done = json.loads((out / "stages.json").read_text())["results"]
    assert list(done) == ["1 teleop demos", "2 pre-train"]
    pretrained = (out / "pretrain" / "checkpoints" / "last.pt").read_bytes()
    r = _cli("demo", *args)
    assert r.returncode == 2 and "resume=true" in r.stderr
    r = _cli("demo", *args, "small.finetune_steps=6", "resume=true")
    assert r.returncode == 2 and "small.finetune_steps" in r.stderr
    r = _cli("demo", *args, "resume=true")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["resumed"] == ["1 teleop demos", "2 pre-train"]
    for row in ("before", "control", "after"):  # three rows, each on the 2 evaluation episodes
        assert res[row]["success_rate"] in (0.0, 0.5, 1.0) and res[row]["ci95_low"] <= res[row]["ci95_high"]
    assert all(name in r.stdout for name in ("pre-trained", "control", "after RaC"))
    assert (out / "before_after.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "pretrain" / "checkpoints" / "last.pt").read_bytes() == pretrained
    assert EpisodeStore.open(out / "interventions" / "round1").n_episodes == 6
    assert list((out / "interventions").glob("round1.interrupted-1"))


def test_a_killed_rac_comparison_resumes_where_it_stopped(tmp_path, checkpoints):
    """SIGKILL `robo-rl rac` while it collects round 2; `resume=true` reuses the pre-trained
    policy's evaluation and all of round 1, sets round 2's partial rollouts aside and finishes.
    Another setting is refused by name; another thread count is not."""
    out = tmp_path / "rac"
    args = [f"checkpoint={checkpoints['state']}", "methods=[rac]", "rounds=2", "episodes_per_round=2", "n_envs=1",
            "finetune.steps=5", "finetune.batch_size=8", "eval.episodes=2", "eval.n_envs=1",
            "operator_config.patience_s=1.0", f"out={out}"]  # processes=2: a spawned process evaluates half
    proc = subprocess.Popen([sys.executable, "-m", "robo_rl.cli.main", "rac", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"})
    try:
        deadline = time.time() + 300
        while not (out / "rac" / "data" / "round2").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    done = list(json.loads((out / "stages.json").read_text())["results"])
    round1 = ["RaC rollouts, round 1", "RaC fine-tune, round 1", "RaC evaluation, round 1"]
    assert done == ["evaluate pre-trained", *round1]
    fine_tuned = (out / "rac" / "round1" / "checkpoints" / "last.pt").read_bytes()
    r = _cli("rac", *args)
    assert r.returncode == 2 and "resume=true" in r.stderr
    r = _cli("rac", *args, "finetune.steps=6", "resume=true")
    assert r.returncode == 2 and "finetune.steps" in r.stderr
    r = _cli("rac", *args, "processes=3", "resume=true")
    assert r.returncode == 2 and "processes=3" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("rac", *args, "finetune.threads=1", "resume=true")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["resumed"] == ["evaluate pre-trained", *round1]
    assert [(row["method"], row["round"]) for row in res["rows"]] == [("rac", 1), ("rac", 2)]
    assert res["rows"][1]["episodes"] == 4 and res["rows"][1]["finetune_steps"] == 5  # cumulative over the rounds
    assert (out / "rac" / "round1" / "checkpoints" / "last.pt").read_bytes() == fine_tuned
    assert EpisodeStore.open(out / "rac" / "data" / "round2").n_episodes == 2
    for row in ("eval-base", "rac/round1/eval", "rac/round2/eval"):  # both halves of each evaluation, in order
        assert [e["seed"] for e in json.loads((out / row / "eval.json").read_text())["per_episode"]] == [100_000, 100_001]
    assert list((out / "rac" / "data").glob("round2.interrupted-1"))
    assert "RaC round 2" in r.stdout


def test_a_camera_policy_s_intervention_rollouts_and_demos_record_its_frames(tmp_path, checkpoints):
    """RaC with cameras: the rollouts render the policy's cameras at its trained size and the store
    keeps them beside every step (so a retrain can read them), as do the "more demos" baseline's
    episodes; a camera policy without an image size is a one-line error."""
    from robo_rl.data.store import EpisodeStore
    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.policies.inference import predictor
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.interventions import collect_expert_demos, collect_interventions
    from robo_rl.sim.operator import OperatorConfig

    policy = load_policy(read_checkpoint(checkpoints["camera"]))
    keys = [*policy.shapes.lowdim, *policy.shapes.images]
    assert keys == ["obs/qpos", "obs/images/top"] and policy.shapes.images["obs/images/top"] == (48, 64)
    args = (predictor(policy), "transfer_cube", keys, policy.config.n_obs, policy.config.horizon,
            ChunkingConfig(n_action_steps=8))
    with pytest.raises(ConfigError, match="needs image_size"):
        collect_interventions(*args, tmp_path / "x", episodes=1, seed=0, progress=False)
    stats = collect_interventions(*args, tmp_path / "rac", episodes=2, seed=5, n_envs=2, image_size=(48, 64),
                                  operator=OperatorConfig(patience_s=1.0), progress=False)
    store = EpisodeStore.open(tmp_path / "rac")
    assert store.n_episodes == 2 == stats.episodes
    for e in range(2):
        ep = store.episode(e)
        frames = ep["obs/images/top"]
        assert frames.shape == (len(ep["action"]), 48, 64, 3) and frames.dtype == np.uint8
        assert np.abs(np.diff(frames.astype(np.int16), axis=0)).max() > 20  # the arms move in view: real renders
    demos = collect_expert_demos("transfer_cube", tmp_path / "demos", seed=0, max_samples=50, cameras=["top"],
                                 image_size=(48, 64))
    assert demos.episodes >= 1 and EpisodeStore.open(tmp_path / "demos").episode(0)["obs/images/top"].shape[1:] == (48, 64, 3)


def test_a_correction_under_way_at_the_time_limit_finishes_only_with_finish_past_limit(tmp_path):
    """A policy that holds the arms still is taken over a second before TransferCube's 8-s limit.
    By default the limit cuts the correction short (it ends "episode_end" and weighs 0); with
    `finish_past_limit` it runs on until its sub-task is done, and the episode with it."""
    from robo_rl.data.store import EpisodeStore
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.interventions import collect_interventions
    from robo_rl.sim.operator import OperatorConfig

    env = BimanualEnv("transfer_cube")
    env.reset(seed=3)
    hold = env.expert(ExpertNoise.none()).act().astype(np.float32)  # the arms where they start, grippers open
    limit = env.max_steps
    env.close()

    def still(obs):  # a chunk of that one command for every env in the batch
        return np.broadcast_to(hold, (len(obs["obs/qpos"]), 8, hold.size)).copy()

    ends, lengths = {}, {}
    for past_limit in (False, True):
        out = tmp_path / str(past_limit)
        stats = collect_interventions(still, "transfer_cube", ["obs/qpos"], 1, 8, ChunkingConfig(n_action_steps=8), out,
                                      episodes=1, seed=3, n_envs=1, progress=False, disturb=False,
                                      operator=OperatorConfig(patience_s=7.0, lookahead=False,
                                                              finish_past_limit=past_limit))
        store = EpisodeStore.open(out)
        [record] = store.metas[0].extra["interventions"]
        # the round's report counts what the limit cut short, and the samples that therefore do not train
        assert stats.unfinished == ({} if past_limit else {"episode_end": 1})
        cut_samples = record["recovery_steps"] + record["correction_steps"]
        assert stats.unfinished_samples == (0 if past_limit else cut_samples) and cut_samples > 0
        assert record["reason"].startswith("no progress") and record["step"] == pytest.approx(350, abs=3)
        ends[past_limit], lengths[past_limit] = record["ended"], int(store.episode_lengths[0])
        labels = store.episode(0)["segment"]
        assert (labels[record["step"] + 1:] == int(Segment.CORRECTION)).all()  # the operator drives to the end
    assert ends[False] == "episode_end" and lengths[False] == limit
    assert ends[True] == "sub-task done" and lengths[True] > limit + 25
