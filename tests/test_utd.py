"""Compute-optimal UTD (robo_rl/rl/utd.py): law fits, the budgeted recommendation, TD-overfitting
detection, the online loop's UTD bookkeeping, and the utd-fit command on a real sweep folder."""

import dataclasses
import itertools
import json
import math
import re

import numpy as np
import pytest
from conftest import robo_rl_cli

from robo_rl.errors import RoboRLError
from robo_rl.learn.online import online_finetune
from robo_rl.rl import utd
from robo_rl.rl.td_monitor import HeldoutTD, split_heldout
from robo_rl.rl.utd import (BatchModelLaw, DataLaw, PowerLaw, SweepResult, compute_optimal_frontier, data_to_threshold,
                            fit_batch_law, fit_batch_size_law_with_model, fit_data_law, fit_lr_law, fit_power_law,
                            load_sweep, recommend)

SIGMAS = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
MODELS = [1e5, 3e5, 1e6, 3e6, 1e7]
# SAC on Gym (Fu et al. 2025, arXiv 2508.14881): alpha_B = 0.310, alpha_lr = 0.285
B_LAW = PowerLaw(256.0, -0.310)
LR_LAW = PowerLaw(3e-4, -0.285)
D_LAW = DataLaw(d_min=2e4, a=3e6, alpha=0.8, b=5e13, beta=0.6)


# ---------------------------------------------------------------------------- data_to_threshold
def test_data_to_threshold_interpolates_and_reports_never():
    curve = [[200, 30.0], [0, 0.0], [100, 10.0]]  # unsorted on purpose
    assert data_to_threshold(curve, 20.0) == pytest.approx(150.0)
    assert data_to_threshold(curve, 30.0) == pytest.approx(200.0)
    assert data_to_threshold(curve, -1.0) == 0.0  # already there at the first point
    assert data_to_threshold(curve, 31.0) is None
    assert data_to_threshold([], 1.0) is None


# ---------------------------------------------------------------------------- power laws
def test_power_law_recovers_sac_exponents_noiseless_and_noisy():
    s = np.array(SIGMAS)
    for law in (B_LAW, LR_LAW):
        fit = fit_power_law(s, law(s))
        assert fit.coef == pytest.approx(law.coef, rel=1e-9)
        assert fit.exponent == pytest.approx(law.exponent, abs=1e-9)
        assert fit.r2 == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    x = np.repeat(s, 4)
    for law in (B_LAW, LR_LAW):
        fit = fit_power_law(x, law(x) * np.exp(rng.normal(0, 0.03, x.size)))
        assert fit.alpha == pytest.approx(law.alpha, abs=0.03)
        assert fit.coef == pytest.approx(law.coef, rel=0.1)
        assert fit(4.0) == pytest.approx(float(law(4.0)), rel=0.05)
        assert 0.9 < fit.r2 <= 1.0
    with pytest.raises(RoboRLError, match="2 distinct x"):
        fit_power_law([2.0, 2.0], [1.0, 3.0])
    with pytest.raises(RoboRLError, match="> 0"):
        fit_power_law([1.0, 2.0], [1.0, -3.0])


def _hyper_sweep(sigmas, models=(1e6,), seeds=(0, 1), noise=0.0):
    """Runs over a (B, lr) grid that holds B*(σ) and η*(σ) exactly; data grows away from them."""
    rng = np.random.default_rng(1)
    out = []
    for s, n, seed in itertools.product(sigmas, models, seeds):
        b_star, lr_star = float(B_LAW(s)), float(LR_LAW(s))
        for fb, fl in itertools.product((0.5, 1.0, 2.0), (0.5, 1.0, 2.0)):
            d = float(D_LAW(s, n)) * (1 + 0.3 * math.log2(fb) ** 2 + 0.2 * math.log2(fl) ** 2)
            d *= 1 + noise * rng.uniform(-1, 1)
            never = fb == 2.0 and fl == 2.0 and seed == 1  # one seed of this config never got there
            out.append(SweepResult(sigma=s, n_params=n, batch_size=b_star * fb, lr=lr_star * fl, seed=seed,
                                   data_to_threshold=None if never else d))
    return out


def test_batch_and_lr_laws_from_a_sweep():
    results = _hyper_sweep(SIGMAS, noise=0.02)  # noise too small to move the argmin
    best = utd.best_configs(results)
    assert len(best) == len(SIGMAS) and all(c.seeds == 2 for c in best)
    b, lr = fit_batch_law(results), fit_lr_law(results)
    assert b.alpha == pytest.approx(0.310, abs=1e-6) and b.coef == pytest.approx(256.0, rel=1e-6)
    assert lr.alpha == pytest.approx(0.285, abs=1e-6) and lr.coef == pytest.approx(3e-4, rel=1e-6)
    with pytest.raises(RoboRLError, match=r"1 distinct sigma \(2\); need at least 2"):
        fit_batch_law(_hyper_sweep([2.0]))
    never = [SweepResult(sigma=s, n_params=1e6, batch_size=64, lr=1e-3) for s in SIGMAS]
    with pytest.raises(RoboRLError, match="0 distinct sigma"):
        fit_lr_law(never)


def test_batch_law_with_model_size():
    true = BatchModelLaw(a=400.0, alpha=0.3, b=2e5, c=0.7)
    results = [SweepResult(sigma=s, n_params=n, batch_size=float(true(s, n)), lr=1e-3, data_to_threshold=1e5)
               for s in SIGMAS for n in MODELS]
    fit = fit_batch_size_law_with_model(results)
    for name in ("a", "alpha", "b", "c"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-3), name
    assert fit.r2 == pytest.approx(1.0)
    with pytest.raises(RoboRLError, match="distinct n_params"):
        fit_batch_size_law_with_model([r for r in results if r.n_params in (1e5, 1e6)])


def _data_sweep(noise=0.0, models=MODELS):
    rng = np.random.default_rng(2)
    return [SweepResult(sigma=s, n_params=n, batch_size=float(B_LAW(s)), lr=float(LR_LAW(s)),
                        data_to_threshold=float(D_LAW(s, n)) * math.exp(rng.normal(0, noise)) if noise else
                        float(D_LAW(s, n)))
            for s in SIGMAS for n in models]


def test_data_law_recovers_parameters():
    fit = fit_data_law(_data_sweep())
    assert fit.with_model
    for name in ("d_min", "a", "alpha", "b", "beta"):
        assert getattr(fit, name) == pytest.approx(getattr(D_LAW, name), rel=0.01), name
    assert fit.sigma_range == pytest.approx((0.5, 16.0)) and fit.n_range == pytest.approx((1e5, 1e7))

    noisy = fit_data_law(_data_sweep(noise=0.03))
    assert noisy.alpha == pytest.approx(0.8, abs=0.1) and noisy.beta == pytest.approx(0.6, abs=0.1)
    assert noisy.d_min == pytest.approx(2e4, rel=0.25)
    S, N = np.meshgrid(SIGMAS, MODELS)
    assert np.allclose(noisy(S, N), D_LAW(S, N), rtol=0.05)
    assert noisy.r2 > 0.98


def test_data_law_with_one_model_size_and_too_few_points():
    one = _data_sweep(models=[1e6])
    fit = fit_data_law(one)  # Rybkin et al.'s σ-only form: the N term folds into D_min
    assert not fit.with_model and fit.b == 0.0
    assert fit.alpha == pytest.approx(0.8, rel=0.01)
    assert fit.d_min == pytest.approx(2e4 + (5e13 / 1e6) ** 0.6, rel=0.01)
    with pytest.raises(RoboRLError, match=r"1 distinct n_params \(1e\+06\); need at least 3"):
        fit_data_law(one, with_model=True)
    with pytest.raises(RoboRLError, match=r"2 distinct sigma \(1, 2\); need at least 3"):
        fit_data_law([r for r in _data_sweep() if r.sigma in (1.0, 2.0)])


# ---------------------------------------------------------------------------- recommend
GRID_S = [1.0, 2.0, 4.0, 8.0, 16.0]
GRID_N = [1e5, 1e6, 1e7]
DELTA = 1e10


def _brute_force(flop_budget=None, data_budget=None):
    """Explicit loops over the grid: (F, σ, N, D, C) of the cheapest point within the budgets."""
    best = None
    for s in GRID_S:
        for n in GRID_N:
            d = D_LAW.d_min + (D_LAW.a / s) ** D_LAW.alpha + (D_LAW.b / n) ** D_LAW.beta
            batch = 256.0 * s ** -0.31
            c = 10 * batch * s * n * d
            f = c + DELTA * d
            if (flop_budget is None or c <= flop_budget) and (data_budget is None or d <= data_budget):
                if best is None or f < best[0]:
                    best = (f, s, n, d, c)
    return best


def test_recommend_matches_brute_force_and_respects_budgets():
    kw = dict(delta=DELTA, sigmas=GRID_S, n_params=GRID_N)
    f, s, n, d, c = _brute_force()
    rec = recommend(D_LAW, B_LAW, LR_LAW, refine=False, **kw)
    assert (rec.sigma, rec.n_params) == (s, n)
    assert rec.total_cost == pytest.approx(f) and rec.data == pytest.approx(d) and rec.compute_flops == pytest.approx(c)
    assert rec.batch_size == round(256.0 * s ** -0.31) and rec.lr == pytest.approx(3e-4 * s ** -0.285)

    budgets = dict(flop_budget=c / 2, data_budget=d * 2.2)  # the free optimum is out of reach now
    f2, s2, n2, d2, c2 = _brute_force(**budgets)
    assert (s2, n2) != (s, n)
    rec2 = recommend(D_LAW, B_LAW, LR_LAW, refine=False, **budgets, **kw)
    assert (rec2.sigma, rec2.n_params) == (s2, n2) and rec2.total_cost == pytest.approx(f2)
    assert rec2.compute_flops <= c / 2 and rec2.data <= d * 2.2

    fine = recommend(D_LAW, B_LAW, LR_LAW, refine=True, **budgets, **kw)  # between grid points: no worse
    assert fine.total_cost <= f2 * (1 + 1e-12)
    assert fine.compute_flops <= c / 2 and fine.data <= d * 2.2
    assert min(GRID_S) <= fine.sigma <= max(GRID_S) and min(GRID_N) <= fine.n_params <= max(GRID_N)


def test_recommend_says_which_budget_is_infeasible():
    kw = dict(delta=DELTA, sigmas=GRID_S, n_params=GRID_N)
    least_c = min(10 * 256.0 * s ** -0.31 * s * n * float(D_LAW(s, n)) for s in GRID_S for n in GRID_N)
    with pytest.raises(RoboRLError, match=r"flop_budget=1e\+06 .*least compute.*" + re.escape(f"({least_c:.3g} FLOPs)")):
        recommend(D_LAW, B_LAW, LR_LAW, flop_budget=1e6, **kw)
    least_d = float(D_LAW(16.0, 1e7))
    with pytest.raises(RoboRLError, match=r"data_budget=1e\+03 .*" + re.escape(f"({least_d:.3g} transitions)")):
        recommend(D_LAW, B_LAW, LR_LAW, data_budget=1e3, **kw)
    with pytest.raises(RoboRLError, match="together"):  # each alone is fine, not both
        recommend(D_LAW, B_LAW, LR_LAW, data_budget=least_d * 1.01, flop_budget=least_c * 1.01, **kw)


def test_frontier_grows_with_budget():
    law = dataclasses.replace(D_LAW, sigma_range=(0.5, 16.0), n_range=(1e5, 1e7))  # default grid: this, widened
    with pytest.raises(RoboRLError, match="pass sigmas="):
        recommend(D_LAW, B_LAW, LR_LAW)
    cheapest = recommend(law, B_LAW, LR_LAW, delta=DELTA)
    assert not cheapest.at_grid_edge
    budgets = [cheapest.total_cost / 10] + list(cheapest.total_cost * np.geomspace(1.01, 8, 5))
    fr = compute_optimal_frontier(law, B_LAW, LR_LAW, budgets, delta=DELTA)
    assert fr.infeasible == [budgets[0]] and len(fr.points) == 5
    for b, p in zip(fr.budgets, fr.points):
        assert p.total_cost <= b * (1 + 1e-9)
    sig = [p.sigma for p in fr.points]
    n = [p.n_params for p in fr.points]
    data = [p.data for p in fr.points]
    assert sig == sorted(sig) and n == sorted(n) and data == sorted(data, reverse=True)
    assert fr.sigma_law is not None and fr.sigma_law.exponent > 0 and fr.n_params_law.exponent > 0
    with pytest.raises(RoboRLError, match="cheapest"):
        compute_optimal_frontier(law, B_LAW, LR_LAW, [1.0], delta=DELTA)


# ---------------------------------------------------------------------------- TD-overfitting
def test_heldout_td_flags_overfitting_not_healthy_training():
    steps = np.arange(0, 4000, 100)
    train = np.exp(-steps / 1500)
    over, healthy, diverging = HeldoutTD(window=10), HeldoutTD(window=10), HeldoutTD(window=10)
    for t, tr in zip(steps, train):
        over.record(int(t), tr, 1.2 * np.exp(-t / 1500) if t < 1500 else 1.2 * np.exp(-1) * (1 + (t - 1500) / 1000))
        healthy.record(int(t), tr, 1.3 * np.exp(-t / 2000))
        diverging.record(int(t), np.exp(t / 3000), 2 * np.exp(t / 3000))  # both rise: instability, not overfitting
    assert over.overfitting() and 1500 < over.first_flag_step < 2500
    assert not healthy.overfitting() and healthy.first_flag_step is None
    assert not diverging.overfitting()
    s = over.summary()
    assert s["overfitting"] and s["heldout_slope"] > 0.05 > 0 > s["train_slope"] and s["records"] == len(steps)
    assert not HeldoutTD(window=5).overfitting()  # no records: no verdict
    with pytest.raises(RoboRLError, match="not after"):
        over.record(100, 1.0, 1.0)


def test_split_heldout_never_overlaps_and_keeps_episodes_whole():
    train, held = split_heldout(1000, 0.1, seed=3)
    assert len(held) == 100 and np.intersect1d(train, held).size == 0
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(1000))
    again = split_heldout(1000, 0.1, seed=3)
    assert np.array_equal(again[1], held)

    lengths = np.random.default_rng(0).integers(20, 80, size=30)
    ends = np.cumsum(lengths)
    n = int(ends[-1])
    train, held = split_heldout(n, 0.2, seed=1, episode_ends=ends)
    assert np.intersect1d(train, held).size == 0 and len(train) + len(held) == n
    episode = np.searchsorted(ends, np.arange(n), side="right")  # episode of each transition
    held_eps, train_eps = set(episode[held]), set(episode[train])
    assert held_eps and train_eps and not held_eps & train_eps
    assert len(held) >= 0.2 * n
    with pytest.raises(RoboRLError, match="end at n_transitions"):
        split_heldout(n + 1, 0.2, episode_ends=ends)
    with pytest.raises(RoboRLError, match="fraction"):
        split_heldout(100, 1.0)


# ---------------------------------------------------------------------------- online loop
class CountingAgent:
    def __init__(self, action_space):
        self.space = action_space
        self.updates = 0
        self.steps_at_update = []
        self.env_steps = 0

    def act(self, obs):
        assert isinstance(obs, np.ndarray)
        return np.zeros(self.space.shape, dtype=self.space.dtype)

    def update(self, batch):
        assert len(batch) == 8
        self.updates += 1
        self.steps_at_update.append(self.env_steps)
        return {"loss": 1.0 / self.updates}


@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.0, 1 / 3])
def test_online_finetune_achieves_the_utd_ratio(sigma):
    import gymnasium

    env = gymnasium.make("Pendulum-v1")  # truncates at 200 steps
    agent = CountingAgent(env.action_space)
    buffer = []

    def add(obs, action, reward, next_obs, terminated, truncated):
        buffer.append((obs, action, reward, next_obs, terminated))
        agent.env_steps += 1

    def sample(batch_size):
        idx = np.random.default_rng(len(buffer)).integers(0, len(buffer), batch_size)
        return [buffer[i] for i in idx]

    called = []
    out = online_finetune(agent, env, add, utd=sigma, env_steps=300, batch_size=8, sample_batch=sample,
                          eval_fn=lambda a: -1.0, eval_every=100, on_update=lambda i, m: called.append(i),
                          progress=False, seed=0)
    env.close()
    expected = {0.5: 150, 1.0: 300, 4.0: 1200, 1 / 3: 100}[sigma]
    assert out["updates"] == agent.updates == expected == len(called)
    assert out["utd_achieved"] == pytest.approx(sigma) and out["env_steps"] == len(buffer) == 300
    assert out["episodes"] == 1 and len(out["returns"]) == 1
    assert [e["env_step"] for e in out["evaluations"]] == [100, 200, 300]
    assert out["last_metrics"] == {"loss": 1.0 / expected}
    # spread evenly: after t steps, floor(σ t) updates have been made
    counts = np.bincount(agent.steps_at_update, minlength=301)
    assert all(counts[: t + 1].sum() == math.floor(sigma * t + 1e-9) for t in range(1, 301))


def test_online_finetune_learning_starts_and_bad_ratio():
    import gymnasium

    env = gymnasium.make("Pendulum-v1")
    agent = CountingAgent(env.action_space)
    kw = dict(replay_add=lambda *a: None, batch_size=8, sample_batch=lambda b: [0] * b, progress=False)
    out = online_finetune(agent, env, utd=2.0, env_steps=150, learning_starts=50, **kw)
    assert out["updates"] == 200 and out["utd_achieved"] == pytest.approx(2.0)
    with pytest.raises(RoboRLError, match="utd=0"):
        online_finetune(agent, env, utd=0, env_steps=10, **kw)
    env.close()


# ---------------------------------------------------------------------------- sweep folder and CLI
def _write_sweep(root, threshold=100.0):
    """A Hydra-style multirun folder: root/<job>/results.json with learning curves, plus Hydra's files."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for s, n, fb, seed in itertools.product([1.0, 2.0, 4.0, 8.0], [1e5, 1e6, 1e7], (0.5, 1.0, 2.0, 4.0), (0, 1)):
        d_run = float(D_LAW(s, n)) * (1 + 0.3 * math.log2(fb) ** 2)
        xs = d_run * np.linspace(0.25, 1.5, 6)
        top = threshold * (0.5 if fb == 4.0 else 1.0)  # the largest batch never gets there (peaks at 0.75 J)
        curve = [[float(x), float(top * x / d_run)] for x in xs]
        run = root / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "config.yaml").write_text("sigma: 1\n")
        (run / "results.json").write_text(json.dumps({
            "sigma": s, "n_params": n, "width": int(math.sqrt(n / 3)), "batch_size": float(B_LAW(s)) * fb,
            "lr": float(LR_LAW(s)), "seed": seed, "data_to_threshold": None, "final_score": curve[-1][1],
            "train_td_error": 0.1, "heldout_td_error": 0.2, "updates": int(s * xs[-1]), "curve": curve}))
        job += 1
    return job


def test_load_sweep_reads_a_multirun_folder(tmp_path):
    jobs = _write_sweep(tmp_path / "sweep")
    results = load_sweep(tmp_path / "sweep", threshold=100.0)
    assert len(results) == jobs
    assert [r.run_dir.rsplit("/", 1)[-1] for r in results[:12]] == [str(i) for i in range(12)]  # 10 after 9
    fb4 = [r for r in results if math.isclose(r.batch_size, float(B_LAW(r.sigma)) * 4)]
    assert fb4 and all(not r.reached for r in fb4)
    r0 = results[0]  # sigma 1, N 1e5, B*/2
    assert r0.data_to_threshold == pytest.approx(float(D_LAW(1.0, 1e5)) * 1.3)
    assert load_sweep(tmp_path / "sweep")[0].data_to_threshold is None  # no threshold: the stored value
    (tmp_path / "sweep" / "0" / "results.json").write_text('{"sigma": 1}')
    with pytest.raises(RoboRLError, match="missing \\['n_params', 'batch_size', 'lr'\\]"):
        load_sweep(tmp_path / "sweep")
    with pytest.raises(RoboRLError, match="no results.json"):
        load_sweep(tmp_path / "sweep" / "0" / ".hydra")


def test_utd_fit_cli(tmp_path):
    sweep = tmp_path / "sweep"
    _write_sweep(sweep)
    r = robo_rl_cli("utd-fit", str(sweep), "threshold=100", "flop_budget=1e16", "data_budget=4e5", "delta=1e10",
                    "frontier=[1e15,1e16,1e17]", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "recommendation" in r.stdout and "D_J(sigma, N)" in r.stdout
    fit = json.loads((sweep / "fit.json").read_text())
    assert fit["runs"] == 96 and fit["runs_reached"] == 72
    assert fit["laws"]["batch"]["alpha"] == pytest.approx(0.31, abs=1e-6)
    assert fit["laws"]["lr"]["alpha"] == pytest.approx(0.285, abs=1e-6)
    assert fit["laws"]["data"]["alpha"] == pytest.approx(0.8, rel=0.02)
    rec = fit["recommendation"]
    assert rec["compute_flops"] <= 1e16 and rec["data"] <= 4e5
    assert fit["frontier"]["points"]

    r = robo_rl_cli("utd-fit", str(sweep), "threshold=100", "flop_budget=1e3", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: flop_budget=1e+03") and len(r.stderr.strip().splitlines()) == 1
    assert "flop_budget=1e+03" in json.loads((sweep / "fit.json").read_text())["recommendation_error"]

    r = robo_rl_cli("utd-fit", f"sweep={tmp_path / 'nowhere'}", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: sweep folder {tmp_path / 'nowhere'} does not exist; give the Hydra multirun " \
                               f"folder of the sweep"
