"""`robo-rl offline-rl` end to end on a tiny OGBench dataset made here by the oracles: every agent
trains, evaluates and writes its results; resume continues; a sweep runs as Hydra multirun and
`robo-rl utd-fit` reads it; bad input is one line, no traceback."""

from __future__ import annotations

import json

import pytest

from conftest import robo_rl_cli, robo_rl_in_process

TINY = ["rl.hidden=[32,32]", "threads=1", "log_every=5", "heldout_every=5", "heldout_fraction=0.3",
        "eval.episodes=1", "checkpoint_every=5"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("ogbench") / "cube-single-play-v0.npz"
    r = robo_rl_cli("ogbench-data", "env=cube-single-v0", "episodes=3", "steps=60", f"out={out}")
    assert r.returncode == 0, r.stderr
    return out


# floq and SHARSA through the cli: ~11-12 s each on an AVX2-only CPU, -m slow (their agents' own
# training tests in test_rl_agents.py / test_sharsa.py run by default; FQL covers the cli path)
@pytest.mark.parametrize("agent,extra", [("fql", []),
                                         pytest.param("floq", ["rl.noise_copies=2", "rl.critic_steps=2"],
                                                      marks=pytest.mark.slow),
                                         pytest.param("sharsa", ["rl.batch_size=32", "rl.horizon=5", "rl.num_samples=4"],
                                                      marks=pytest.mark.slow)])
def test_each_agent_trains_evaluates_and_reports(dataset, tmp_path, agent, extra):
    run = tmp_path / agent
    r = robo_rl_cli("offline-rl", f"agent={agent}", f"dataset={dataset}", "steps=10", f"run_dir={run}", *TINY, *extra)
    assert r.returncode == 0, r.stderr
    assert f"offline-rl {agent}" in r.stdout and "success" in r.stdout
    res = json.loads((run / "results.json").read_text())
    assert res["updates"] == 10 and res["agent"] == agent
    assert res["final_eval"]["episodes"] == 1 and 0.0 <= res["final_eval"]["success_rate"] <= 1.0
    assert res["heldout_td_error"] >= 0 and len(res["td_history"]) == 2
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file()
    expected_env = "oraclerep" if agent == "sharsa" else "singletask"
    assert expected_env in res["env"]


@pytest.mark.slow  # ~22 s (AMD EPYC, AVX2); each agent's train-evaluate run is in the default set
def test_resume_continues_and_refuses_to_overwrite(dataset, tmp_path):
    run = tmp_path / "run"
    args = ["offline-rl", "agent=fql", f"dataset={dataset}", f"run_dir={run}", *TINY]
    assert robo_rl_cli(*args, "steps=5", "eval.episodes=0").returncode == 0
    again = robo_rl_cli(*args, "steps=5")
    assert again.returncode == 2 and "already holds a run" in again.stderr and "Traceback" not in again.stderr
    r = robo_rl_cli(*args, "steps=10", "resume=true", "eval.episodes=0")
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout
    assert json.loads((run / "results.json").read_text())["updates"] == 10
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [5, 10]


@pytest.mark.slow  # ~15 s (AMD EPYC, AVX2); test_utd.py's test_utd_fit_cli covers the fit from a sweep
def test_multirun_sweep_feeds_utd_fit(dataset, tmp_path):
    sweep = tmp_path / "sweep"
    r = robo_rl_cli("offline-rl", "-m", "agent=fql", f"dataset={dataset}", "steps=5", "eval.episodes=0",
                    "rl.batch_size=8,16", f"hydra.sweep.dir={sweep}", *TINY)
    assert r.returncode == 0, r.stderr
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 2
    assert sorted(json.loads(p.read_text())["batch_size"] for p in results) == [8, 16]
    # two runs at one sigma cannot support a fit: utd-fit says so in one line
    fit = robo_rl_cli("utd-fit", str(sweep))
    assert fit.returncode == 2 and "Traceback" not in fit.stderr and len(fit.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["agent=nope"], "nope"),
    (["agent=fql"], "dataset=PATH"),
    (["agent=fql", "dataset=/nonexistent/cube-single-play-v0.npz"], "no such dataset file"),
    (["agent=fql", "dataset=data/somewhere"], ".npz"),
    (["agent=fql", "rl.not_a_field=1"], "not_a_field"),
])
def test_bad_input_is_one_line(dataset, args, message, capsys):
    if any(a == "rl.not_a_field=1" for a in args):
        args = [*args, f"dataset={dataset}", "+rl.not_a_field=1"]
        args.remove("rl.not_a_field=1")
    code, err = robo_rl_in_process(capsys, "offline-rl", *args, "steps=1")  # no 3-4 s of imports per case
    assert code != 0
    assert message in err and "Traceback" not in err


@pytest.mark.slow  # ~15 s (AMD EPYC, AVX2); learn/online.py's updates_due and loop are unit-tested in test_utd.py
def test_episode_store_in_the_twin_with_online_finetuning(tmp_path):
    """Demos from the twin -> FQL offline -> evaluated in the twin -> fine-tuned online at UTD 2."""
    demos = tmp_path / "demos"
    assert robo_rl_cli("collect", "task=transfer_cube", "episodes=2", "cameras=[]", f"out={demos}").returncode == 0
    run = tmp_path / "run"
    r = robo_rl_cli("offline-rl", "agent=fql", f"dataset={demos}", "steps=6", f"run_dir={run}", "online.env_steps=20",
                    "online.utd=2", "heldout_fraction=0.5", *[a for a in TINY if not a.startswith("heldout_fraction")])
    assert r.returncode == 0, r.stderr
    online = json.loads((run / "online.json").read_text())
    assert online["env_steps"] == 20 and online["updates"] == 40 and online["utd_achieved"] == 2.0
    res = json.loads((run / "results.json").read_text())
    assert "reach_lifted_by_right" in res["final_eval"] and res["online"]["episodes"] == online["episodes"]
    # utd-fit reads the curve: its last point is the final evaluation, after all 20 env steps
    assert res["online"]["curve"][-1] == [20, res["online"]["success_rate"]]
    bad = robo_rl_cli("offline-rl", "agent=fql", f"dataset={demos}", "reward=stage", "steps=1", f"run_dir={tmp_path / 'x'}")
    assert bad.returncode == 2 and "stage" in bad.stderr and "Traceback" not in bad.stderr
