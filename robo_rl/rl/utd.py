"""Compute-optimal UTD: fit scaling laws to a sweep, pick (σ, N, B, η) for a budget, watch TD-overfitting.

Value-based RL has two compute knobs: the critic's size N (parameters) and the updates-to-data
ratio σ (gradient updates per environment transition). Following Rybkin et al. 2025
(arXiv 2502.04327) and Fu et al. 2025 (arXiv 2508.14881), the recipe is:

1. sweep σ × width × batch size (× learning rate) over a few seeds; each run writes `results.json`
   (see `load_sweep` for its keys), including D, the transitions it needed to reach a score
   threshold J;
2. for every (σ, N) keep the hyperparameters that reached J with the least data (`best_configs`),
   and fit
       B*(σ)    = b · σ^(−α_B)                          `fit_batch_law`
       η*(σ)    = e · σ^(−α_η)                          `fit_lr_law`
       B*(σ, N) = a / (σ^α · (1 + (b/N)^c))             `fit_batch_size_law_with_model`
       D_J(σ, N) = D_min + (a/σ)^α + (b/N)^β            `fit_data_law`
3. the compute to reach J is C_J = 10 · B · σ · N · D_J FLOPs (forward + backward over a batch of B
   for each of the σ·D_J updates, ~10 FLOPs per parameter and sample for a critic and its target),
   and the total cost F = C_J + δ · D_J prices a transition at δ FLOPs. `recommend` picks the
   (σ*, N*) that minimises F within the user's FLOP and data budgets; `compute_optimal_frontier`
   traces how the best (σ*, N*) grow with the budget and fits σ*(F), N*(F) as power laws.

TD-overfitting (Fu et al.): `robo_rl.rl.td_monitor` (`split_heldout`, `HeldoutTD`). The online loop at
a chosen σ: `robo_rl.learn.online.online_finetune`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from robo_rl.errors import RoboRLError


@dataclass(frozen=True)
class UTDConfig:
    flops_per_param_sample: float = 10.0  # the 10 in C_J = 10·B·σ·N·D_J
    delta: float = 1e10  # δ: FLOPs one environment transition is worth in F = C + δ·D (our default; set yours)
    grid_points: int = 81  # points per axis of the log grid `recommend` searches
    extrapolate: float = 4.0  # default grid: the fitted σ and N ranges widened by this factor each way
    refine_rounds: int = 3  # zoom-ins of the grid around the best cell (0: the coarse grid's answer)
    refine_points: int = 21
    min_sigmas: int = 2  # distinct σ needed for a σ power law
    min_sigmas_data_law: int = 3  # distinct σ needed for D_J(σ, ·): D_min, a, α
    min_models: int = 3  # distinct N needed for the N terms: b, c (batch) or b, β (data)
    heldout_window: int = 10  # records `HeldoutTD.overfitting` looks back over
    heldout_tolerance: float = 0.05  # rise of log held-out TD over the window that counts (~5%)


DEFAULT = UTDConfig()

# The keys `load_sweep` reads from results.json (REQUIRED must be there, the rest may be missing or null).
REQUIRED_KEYS = ("sigma", "n_params", "batch_size", "lr")
OPTIONAL_KEYS = ("width", "seed", "data_to_threshold", "final_score", "train_td_error", "heldout_td_error",
                 "updates", "curve")


# ============================================================================ sweep results
@dataclass
class SweepResult:
    """One run of a sweep. `data_to_threshold` is None when the run never reached the threshold."""

    sigma: float
    n_params: float
    batch_size: float
    lr: float
    seed: int = 0
    width: int | None = None
    data_to_threshold: float | None = None
    final_score: float | None = None
    train_td_error: float | None = None
    heldout_td_error: float | None = None
    updates: int | None = None
    run_dir: str | None = None
    curve: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def reached(self) -> bool:
        return self.data_to_threshold is not None


def data_to_threshold(curve: Sequence[Sequence[float]], threshold: float) -> float | None:
    """The first data amount at which `score >= threshold` on a learning curve [[data, score], ...].

    Points are taken in order of data. Between the last point below the threshold and the first at or
    above it the crossing is interpolated linearly; a curve that starts at or above the threshold
    returns its first data amount. None if the curve never reaches it (or is empty).
    """
    pts = sorted((float(d), float(s)) for d, s in curve)
    prev: tuple[float, float] | None = None
    for d, s in pts:
        if math.isfinite(s) and s >= threshold:
            if prev is None:
                return d
            d0, s0 = prev
            return d0 + (threshold - s0) / (s - s0) * (d - d0) if s > s0 else d
        if math.isfinite(s):
            prev = (d, s)
    return None


def _finite_or_none(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _read_result(path: Path, threshold: float | None) -> SweepResult:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RoboRLError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise RoboRLError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    missing = [k for k in REQUIRED_KEYS if raw.get(k) is None]
    if missing:
        raise RoboRLError(f"{path}: missing {missing}; a sweep run must record {list(REQUIRED_KEYS)}")
    try:
        curve = [(float(d), float(s)) for d, s in (raw.get("curve") or [])]
        res = SweepResult(
            sigma=float(raw["sigma"]), n_params=float(raw["n_params"]), batch_size=float(raw["batch_size"]),
            lr=float(raw["lr"]), seed=int(raw.get("seed") or 0),
            width=None if raw.get("width") is None else int(raw["width"]),
            data_to_threshold=_finite_or_none(raw.get("data_to_threshold")),
            final_score=_finite_or_none(raw.get("final_score")),
            train_td_error=_finite_or_none(raw.get("train_td_error")),
            heldout_td_error=_finite_or_none(raw.get("heldout_td_error")),
            updates=None if raw.get("updates") is None else int(raw["updates"]),
            run_dir=str(path.parent), curve=curve)
    except (TypeError, ValueError) as e:
        raise RoboRLError(f"{path}: a value has the wrong type ({e})") from None
    if min(res.sigma, res.n_params, res.batch_size, res.lr) <= 0:
        raise RoboRLError(f"{path}: sigma, n_params, batch_size and lr must be > 0")
    if threshold is not None:
        if not curve:
            raise RoboRLError(f"{path}: threshold={threshold} needs the run's 'curve' [[data, score], ...]")
        res.data_to_threshold = data_to_threshold(curve, threshold)
    return res


def _job_order(path: Path, root: Path) -> tuple:
    """Hydra job folders 0, 1, ..., 10 in numeric order, other paths after them by name."""
    parts = path.relative_to(root).parts[:-1]
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


def load_sweep(root: str | Path, threshold: float | None = None) -> list[SweepResult]:
    """Every `results.json` under `root`: a Hydra multirun folder (`root/<job number>/results.json`) or
    any tree of run folders, each holding one.

    results.json keys (one JSON object per run):
      sigma               UTD ratio σ, gradient updates per environment transition       (required)
      n_params            critic parameter count N                                        (required)
      batch_size          batch size B                                                    (required)
      lr                  learning rate η                                                 (required)
      width               critic width (informational)
      seed                random seed (runs differing only in seed are averaged)
      data_to_threshold   transitions consumed when the score first reached the threshold;
                          null/inf/NaN or absent: never reached
      final_score         score at the end of the run
      train_td_error      final TD error on training batches
      heldout_td_error    final TD error on held-out transitions (see HeldoutTD)
      updates             gradient updates made
      curve               [[data, score], ...] learning curve (transitions, score)
    With `threshold` given, data_to_threshold is recomputed from each run's curve (a run without a
    curve is an error) instead of read.
    """
    root = Path(root)
    if not root.exists():
        raise RoboRLError(f"sweep folder {root} does not exist; give the Hydra multirun folder of the sweep")
    if not root.is_dir():
        raise RoboRLError(f"sweep={root} is a file; give the folder holding the runs' results.json")
    paths = sorted(root.rglob("results.json"), key=lambda p: _job_order(p, root))
    if not paths:
        raise RoboRLError(f"no results.json under {root}; is this the multirun folder of a UTD sweep?")
    return [_read_result(p, threshold) for p in paths]


@dataclass(frozen=True)
class BestConfig:
    """For one (σ, N): the (B, η) that reached the threshold with the least data, averaged over seeds."""

    sigma: float
    n_params: float
    batch_size: float
    lr: float
    data: float
    seeds: int


def _key(v: float) -> float:
    return float(f"{v:.10g}")  # 0.1 and 0.1000000000001 are the same σ


def best_configs(results: Sequence[SweepResult]) -> list[BestConfig]:
    """Runs are grouped by (σ, N, B, η) and their data-to-threshold averaged over seeds; a group with a
    seed that never reached the threshold counts as never reaching it. For each (σ, N) the group with
    the least mean data wins; a (σ, N) where no group reached the threshold is left out."""
    groups: dict[tuple[float, float, float, float], list[float]] = defaultdict(list)
    for r in results:
        d = r.data_to_threshold if r.data_to_threshold is not None else math.inf
        groups[(_key(r.sigma), _key(r.n_params), _key(r.batch_size), _key(r.lr))].append(d)
    best: dict[tuple[float, float], BestConfig] = {}
    for (s, n, b, lr), ds in groups.items():
        mean = float(np.mean(ds))
        if not math.isfinite(mean):
            continue
        cur = best.get((s, n))
        if cur is None or mean < cur.data:
            best[(s, n)] = BestConfig(s, n, b, lr, mean, len(ds))
    return [best[k] for k in sorted(best)]


# ============================================================================ laws and fits
def _r2(pred_log: np.ndarray, obs_log: np.ndarray) -> float:
    """Coefficient of determination in log space."""
    ss_res = float(np.sum((obs_log - pred_log) ** 2))
    ss_tot = float(np.sum((obs_log - obs_log.mean()) ** 2))
    if ss_tot <= 1e-24:
        return 1.0 if ss_res <= 1e-20 else 0.0
    return 1.0 - ss_res / ss_tot


@dataclass(frozen=True)
class PowerLaw:
    """y = coef · x^exponent. For the σ laws the papers write y = coef · σ^(−α): `alpha` is −exponent."""

    coef: float
    exponent: float
    r2: float = math.nan
    n_points: int = 0

    def __call__(self, x: Any) -> Any:
        return self.coef * np.asarray(x, dtype=float) ** self.exponent

    @property
    def alpha(self) -> float:
        return -self.exponent

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "alpha": self.alpha}


@dataclass(frozen=True)
class BatchModelLaw:
    """B*(σ, N) = a / (σ^alpha · (1 + (b/N)^c)): small critics want smaller batches (TD-overfitting)."""

    a: float
    alpha: float
    b: float
    c: float
    r2: float = math.nan
    n_points: int = 0

    def __call__(self, sigma: Any, n_params: Any) -> Any:
        s, n = np.asarray(sigma, dtype=float), np.asarray(n_params, dtype=float)
        return self.a / (s ** self.alpha * (1.0 + (self.b / n) ** self.c))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class DataLaw:
    """D_J(σ, N) = d_min + (a/σ)^alpha + (b/N)^beta: transitions to reach the threshold J.

    b = 0 when the sweep had one model size (the N term is then folded into d_min). `sigma_range`
    and `n_range` are the ranges the fit saw; `recommend`'s default grid extends them."""

    d_min: float
    a: float
    alpha: float
    b: float
    beta: float
    r2: float = math.nan
    n_points: int = 0
    sigma_range: tuple[float, float] = (math.nan, math.nan)
    n_range: tuple[float, float] = (math.nan, math.nan)

    def __call__(self, sigma: Any, n_params: Any) -> Any:
        s, n = np.asarray(sigma, dtype=float), np.asarray(n_params, dtype=float)
        return self.d_min + (self.a / s) ** self.alpha + (self.b / n) ** self.beta

    @property
    def with_model(self) -> bool:
        return self.b > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLaw:
    """Least squares of log y on log x. Needs two distinct x > 0 and every y > 0."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise RoboRLError(f"fit_power_law: x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    if np.any(~np.isfinite(x)) or np.any(~np.isfinite(y)) or np.any(x <= 0) or np.any(y <= 0):
        raise RoboRLError("fit_power_law: every x and y must be finite and > 0 (a log-log fit)")
    if len(np.unique(x)) < 2:
        raise RoboRLError(f"fit_power_law: needs at least 2 distinct x values, got {len(np.unique(x))}")
    lx, ly = np.log(x), np.log(y)
    slope, intercept = np.polyfit(lx, ly, 1)
    return PowerLaw(float(math.exp(intercept)), float(slope), _r2(intercept + slope * lx, ly), len(x))


def _distinct(values: Sequence[float]) -> list[float]:
    return sorted({_key(v) for v in values})


def _need(what: str, values: list[float], n: int, name: str) -> None:
    if len(values) < n:
        shown = ", ".join(f"{v:g}" for v in values) or "none"
        raise RoboRLError(f"{what}: runs reached the threshold at {len(values)} distinct {name} ({shown}); "
                          f"need at least {n}")


def _best_for(results: Sequence[SweepResult], n_params: float | None) -> list[BestConfig]:
    best = best_configs(results)
    if n_params is not None:
        best = [c for c in best if math.isclose(c.n_params, n_params, rel_tol=1e-9)]
    return best


def fit_batch_law(results: Sequence[SweepResult], n_params: float | None = None,
                  config: UTDConfig = DEFAULT) -> PowerLaw:
    """B*(σ) = b · σ^(−α_B) through the best batch size of every (σ, N) (`best_configs`).

    With `n_params` only that model size is used; otherwise every size's optimum is a point (use
    `fit_batch_size_law_with_model` to separate the sizes)."""
    best = _best_for(results, n_params)
    _need("fit_batch_law", _distinct([c.sigma for c in best]), config.min_sigmas, "sigma")
    return fit_power_law([c.sigma for c in best], [c.batch_size for c in best])


def fit_lr_law(results: Sequence[SweepResult], n_params: float | None = None,
               config: UTDConfig = DEFAULT) -> PowerLaw:
    """η*(σ) = e · σ^(−α_η) through the best learning rate of every (σ, N), as `fit_batch_law`."""
    best = _best_for(results, n_params)
    _need("fit_lr_law", _distinct([c.sigma for c in best]), config.min_sigmas, "sigma")
    return fit_power_law([c.sigma for c in best], [c.lr for c in best])


def _least_squares_multistart(residuals: Callable[[np.ndarray], np.ndarray], starts: list[np.ndarray],
                              lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares

    best_x, best_cost = None, math.inf
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
        try:
            sol = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac",
                                xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
        except (ValueError, FloatingPointError):
            continue
        if np.all(np.isfinite(sol.x)) and sol.cost < best_cost:
            best_x, best_cost = sol.x, sol.cost
    if best_x is None:
        raise RoboRLError("the scaling-law fit did not converge from any starting point; check the sweep's data")
    return best_x


def fit_batch_size_law_with_model(results: Sequence[SweepResult], config: UTDConfig = DEFAULT) -> BatchModelLaw:
    """B*(σ, N) = a / (σ^α (1 + (b/N)^c)) through every (σ, N)'s best batch size.

    Nonlinear least squares on log B with a, b, c > 0 fitted as logs (α free); several starts
    (b across the swept N, c in {0.5, 1, 2}) seeded from the plain σ power law; the lowest residual wins."""
    best = best_configs(results)
    _need("fit_batch_size_law_with_model", _distinct([c.sigma for c in best]), config.min_sigmas, "sigma")
    _need("fit_batch_size_law_with_model", _distinct([c.n_params for c in best]), config.min_models, "n_params")
    ls = np.log([c.sigma for c in best])
    ln = np.log([c.n_params for c in best])
    lb = np.log([c.batch_size for c in best])

    def predict(p: np.ndarray) -> np.ndarray:
        log_a, alpha, log_b, log_c = p
        return log_a - alpha * ls - np.logaddexp(0.0, math.exp(log_c) * (log_b - ln))

    plain = fit_power_law(np.exp(ls), np.exp(lb))
    starts = [np.array([math.log(plain.coef) + math.log(2.0), plain.alpha, b0, math.log(c0)])
              for b0 in (ln.min(), float(np.median(ln)), ln.max()) for c0 in (0.5, 1.0, 2.0)]
    lower = np.array([-50.0, -5.0, ln.min() - 20.0, math.log(0.01)])
    upper = np.array([50.0, 5.0, ln.max() + 20.0, math.log(20.0)])
    p = _least_squares_multistart(lambda q: predict(q) - lb, starts, lower, upper)
    return BatchModelLaw(float(math.exp(p[0])), float(p[1]), float(math.exp(p[2])), float(math.exp(p[3])),
                         _r2(predict(p), lb), len(best))


def fit_data_law(results: Sequence[SweepResult], with_model: bool | None = None,
                 config: UTDConfig = DEFAULT) -> DataLaw:
    """D_J(σ, N) = D_min + (a/σ)^α + (b/N)^β through every (σ, N)'s least data to the threshold.

    Nonlinear least squares on log D; every parameter is positive and fitted as its log, and the model
    is evaluated as log(exp(log D_min) + exp(α(log a − log σ)) + exp(β(log b − log N))) so nothing
    overflows. Starting points: D_min at 20/50/80% of the least observed D, α and β in {0.5, 1, 2},
    and a, b set so their terms are half the observed spread at the median σ and N; the fit with the
    lowest residual wins.

    with_model: fit the N term (needs `config.min_models` distinct N); False fits D_min + (a/σ)^α only
    (Rybkin et al.'s form, b = 0); None picks by the number of distinct N in the sweep.
    """
    best = best_configs(results)
    sigmas, models = _distinct([c.sigma for c in best]), _distinct([c.n_params for c in best])
    _need("fit_data_law", sigmas, config.min_sigmas_data_law, "sigma")
    if with_model is None:
        with_model = len(models) >= config.min_models
    if with_model:
        _need("fit_data_law", models, config.min_models, "n_params")
    ls = np.log([c.sigma for c in best])
    ln = np.log([c.n_params for c in best])
    ld = np.log([c.data for c in best])
    n_terms = 3 if with_model else 2

    def predict(p: np.ndarray) -> np.ndarray:
        terms = [np.full_like(ls, p[0]), math.exp(p[2]) * (p[1] - ls)]
        if with_model:
            terms.append(math.exp(p[4]) * (p[3] - ln))
        return np.logaddexp.reduce(np.stack(terms), axis=0)

    d_lo, d_med = float(np.exp(ld.min())), float(np.exp(np.median(ld)))
    s_med, n_med = float(np.median(ls)), float(np.median(ln))
    starts = []
    for frac in (0.2, 0.5, 0.8):
        spread = max(d_med - frac * d_lo, 1e-3 * d_lo) / n_terms
        for alpha in (0.5, 1.0, 2.0):
            log_a = s_med + math.log(spread) / alpha  # (a/σ_med)^α = spread
            if not with_model:
                starts.append(np.array([math.log(frac * d_lo), log_a, math.log(alpha)]))
                continue
            for beta in (0.5, 1.0, 2.0):
                log_b = n_med + math.log(spread) / beta
                starts.append(np.array([math.log(frac * d_lo), log_a, math.log(alpha), log_b, math.log(beta)]))
    lo_exp, hi_exp = math.log(0.01), math.log(10.0)
    lower = np.array([ld.min() - 30.0, ls.min() - 200.0, lo_exp] + ([ln.min() - 200.0, lo_exp] if with_model else []))
    upper = np.array([ld.max() + 1.0, ls.max() + 200.0, hi_exp] + ([ln.max() + 200.0, hi_exp] if with_model else []))
    p = _least_squares_multistart(lambda q: predict(q) - ld, starts, lower, upper)
    s_vals, n_vals = np.exp(ls), np.exp(ln)
    return DataLaw(
        d_min=float(math.exp(p[0])), a=float(math.exp(p[1])), alpha=float(math.exp(p[2])),
        b=float(math.exp(p[3])) if with_model else 0.0, beta=float(math.exp(p[4])) if with_model else 1.0,
        r2=_r2(predict(p), ld), n_points=len(best),
        sigma_range=(float(s_vals.min()), float(s_vals.max())), n_range=(float(n_vals.min()), float(n_vals.max())))


# ============================================================================ recommendation
@dataclass(frozen=True)
class Recommendation:
    """The (σ, N) to run and what the laws predict it costs. `batch_size` is rounded to an integer
    (the cost uses the law's unrounded value); `at_grid_edge` says the optimum sits on the border of the
    searched grid, so a wider grid might find a better one."""

    sigma: float
    n_params: float
    batch_size: int
    lr: float
    data: float
    compute_flops: float
    total_cost: float
    delta: float
    at_grid_edge: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


BatchLaw = PowerLaw | BatchModelLaw


def batch_size_at(batch_law: BatchLaw, sigma: Any, n_params: Any) -> Any:
    """B*(σ) or B*(σ, N), whichever the law is."""
    if isinstance(batch_law, BatchModelLaw):
        return batch_law(sigma, n_params)
    return batch_law(sigma) * np.ones_like(np.asarray(n_params, dtype=float))


def costs(data_law: DataLaw, batch_law: BatchLaw, sigma: Any, n_params: Any, delta: float,
          config: UTDConfig = DEFAULT) -> tuple[Any, Any, Any]:
    """(D_J, C_J, F) at (σ, N) (broadcast): C_J = 10·B*·σ·N·D_J FLOPs and F = C_J + δ·D_J."""
    d = data_law(sigma, n_params)
    c = config.flops_per_param_sample * batch_size_at(batch_law, sigma, n_params) * sigma * n_params * d
    return d, c, c + delta * d


def _default_axis(rng: tuple[float, float], config: UTDConfig, what: str) -> np.ndarray:
    lo, hi = rng
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RoboRLError(f"recommend: the data law carries no fitted {what} range; pass {what}= explicitly")
    if math.isclose(lo, hi):
        return np.array([lo])
    return np.geomspace(lo / config.extrapolate, hi * config.extrapolate, config.grid_points)


def _axis(values: Sequence[float] | None, rng: tuple[float, float], config: UTDConfig, what: str) -> np.ndarray:
    if values is None:
        return _default_axis(rng, config, what)
    arr = np.unique(np.asarray(values, dtype=float))
    if arr.size == 0 or np.any(arr <= 0) or np.any(~np.isfinite(arr)):
        raise RoboRLError(f"recommend: {what} must be a non-empty list of positive numbers")
    return arr


def _feasible(d: np.ndarray, c: np.ndarray, flop_budget: float | None, data_budget: float | None) -> np.ndarray:
    ok = np.isfinite(d) & np.isfinite(c)
    if flop_budget is not None:
        ok &= c <= flop_budget
    if data_budget is not None:
        ok &= d <= data_budget
    return ok


def _infeasible_message(d: np.ndarray, c: np.ndarray, flop_budget: float | None, data_budget: float | None) -> str:
    """Say which budget is too small, and the smallest value of it that would do."""
    parts = []
    if data_budget is not None and not np.any(d <= data_budget):
        parts.append(f"data_budget={data_budget:.3g} is below the least data any (sigma, N) on the grid needs "
                     f"({d.min():.3g} transitions)")
    if flop_budget is not None and not np.any(c <= flop_budget):
        parts.append(f"flop_budget={flop_budget:.3g} is below the least compute any (sigma, N) on the grid needs "
                     f"({c.min():.3g} FLOPs)")
    if not parts and (flop_budget is None or data_budget is None):
        parts.append("the laws give no finite cost on the grid; check the fitted laws and the sigmas/n_params grid")
    elif not parts:  # each budget alone is fine, together they are not
        within = d <= data_budget
        need = float(c[within].min())
        parts.append(f"no (sigma, N) meets data_budget={data_budget:.3g} and flop_budget={flop_budget:.3g} together; "
                     f"within that data budget the least compute is {need:.3g} FLOPs")
    return "; ".join(parts)


def _argmin(objective: np.ndarray, ok: np.ndarray) -> tuple[int, ...] | None:
    if not np.any(ok):
        return None
    masked = np.where(ok, objective, np.inf)
    return tuple(int(i) for i in np.unravel_index(int(np.argmin(masked)), masked.shape))


def _search(data_law: DataLaw, batch_law: BatchLaw, sigmas: np.ndarray, models: np.ndarray, delta: float,
            objective: str, flop_budget: float | None, data_budget: float | None, cost_budget: float | None,
            refine: bool, config: UTDConfig) -> tuple[float, float, bool] | None:
    """Grid search, then `refine_rounds` finer grids over the neighbouring cells. Returns (σ, N, at_edge)."""

    def evaluate(s_axis: np.ndarray, n_axis: np.ndarray):
        S, N = np.meshgrid(s_axis, n_axis, indexing="ij")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            d, c, f = costs(data_law, batch_law, S, N, delta, config)
        ok = _feasible(d, c, flop_budget, data_budget)
        if cost_budget is not None:
            ok &= f <= cost_budget
        return S, N, (f if objective == "cost" else d), ok

    S, N, obj, ok = evaluate(sigmas, models)
    idx = _argmin(obj, ok)
    if idx is None:
        return None
    i, j = idx
    at_edge = (len(sigmas) > 1 and i in (0, len(sigmas) - 1)) or (len(models) > 1 and j in (0, len(models) - 1))
    best_s, best_n, best_obj = float(S[i, j]), float(N[i, j]), float(obj[i, j])
    if not refine:
        return best_s, best_n, at_edge
    s_lo, s_hi = sigmas[max(i - 1, 0)], sigmas[min(i + 1, len(sigmas) - 1)]
    n_lo, n_hi = models[max(j - 1, 0)], models[min(j + 1, len(models) - 1)]
    for _ in range(config.refine_rounds):
        s_axis = np.geomspace(s_lo, s_hi, config.refine_points) if s_hi > s_lo else np.array([s_lo])
        n_axis = np.geomspace(n_lo, n_hi, config.refine_points) if n_hi > n_lo else np.array([n_lo])
        S, N, obj, ok = evaluate(s_axis, n_axis)
        idx = _argmin(obj, ok)
        if idx is None:
            break
        i, j = idx
        if obj[i, j] <= best_obj:
            best_s, best_n, best_obj = float(S[i, j]), float(N[i, j]), float(obj[i, j])
        s_lo, s_hi = s_axis[max(i - 1, 0)], s_axis[min(i + 1, len(s_axis) - 1)]
        n_lo, n_hi = n_axis[max(j - 1, 0)], n_axis[min(j + 1, len(n_axis) - 1)]
    return best_s, best_n, at_edge


def _recommendation(data_law: DataLaw, batch_law: BatchLaw, lr_law: PowerLaw, sigma: float, n: float, delta: float,
                    at_edge: bool, config: UTDConfig) -> Recommendation:
    d, c, f = costs(data_law, batch_law, sigma, n, delta, config)
    b = float(batch_size_at(batch_law, sigma, n))
    return Recommendation(sigma=sigma, n_params=n, batch_size=max(1, int(round(b))), lr=float(lr_law(sigma)),
                          data=float(d), compute_flops=float(c), total_cost=float(f), delta=delta,
                          at_grid_edge=at_edge)


def recommend(data_law: DataLaw, batch_law: BatchLaw, lr_law: PowerLaw, flop_budget: float | None = None,
              data_budget: float | None = None, delta: float | None = None, sigmas: Sequence[float] | None = None,
              n_params: Sequence[float] | None = None, refine: bool = True,
              config: UTDConfig = DEFAULT) -> Recommendation:
    """The (σ*, N*) that reaches the data law's threshold at the least total cost F = C_J + δ·D_J, with
    C_J ≤ flop_budget and D_J ≤ data_budget where given; B* and η* from the laws at σ* (and N*).

    The search is over the log grid `sigmas` × `n_params` (default: the ranges the data law was fitted
    on, widened `config.extrapolate`× each way, `config.grid_points` per axis), then, with `refine`,
    finer grids between the best point's neighbours (results between grid points). A data law
    without an N term (one model size swept) leaves N to the grid: pass the sizes you can run.
    Raises RoboRLError when no point fits the budgets, naming the smallest budget that would.
    """
    delta = config.delta if delta is None else float(delta)
    if delta < 0:
        raise RoboRLError(f"delta={delta}: the cost of a transition in FLOPs must be >= 0")
    for name, v in (("flop_budget", flop_budget), ("data_budget", data_budget)):
        if v is not None and not v > 0:
            raise RoboRLError(f"{name}={v}: a budget must be > 0 (or null for none)")
    s_axis = _axis(sigmas, data_law.sigma_range, config, "sigmas")
    n_axis = _axis(n_params, data_law.n_range, config, "n_params")
    found = _search(data_law, batch_law, s_axis, n_axis, delta, "cost", flop_budget, data_budget, None, refine, config)
    if found is None:
        S, N = np.meshgrid(s_axis, n_axis, indexing="ij")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            d, c, _ = costs(data_law, batch_law, S, N, delta, config)
        raise RoboRLError(_infeasible_message(d, c, flop_budget, data_budget))
    s, n, edge = found
    return _recommendation(data_law, batch_law, lr_law, s, n, delta, edge, config)


@dataclass(frozen=True)
class Frontier:
    """For each feasible budget F₀: the (σ*, N*) that reaches the threshold with the least data while
    C_J + δ·D_J ≤ F₀; and σ*(F), N*(F) fitted as power laws over those points (None when fewer than two
    distinct values, e.g. a data law without an N term keeps N* at the grid's smallest size). The laws
    are fitted on the points inside the grid when there are two or more of them: a point pinned to the
    grid's border is where the search stopped, not the optimum."""

    budgets: list[float]
    points: list[Recommendation]
    sigma_law: PowerLaw | None
    n_params_law: PowerLaw | None
    infeasible: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {"budgets": self.budgets, "points": [p.to_dict() for p in self.points],
                "sigma_law": self.sigma_law.to_dict() if self.sigma_law else None,
                "n_params_law": self.n_params_law.to_dict() if self.n_params_law else None,
                "infeasible": self.infeasible}


def compute_optimal_frontier(data_law: DataLaw, batch_law: BatchLaw, lr_law: PowerLaw, budgets: Sequence[float],
                             delta: float | None = None, sigmas: Sequence[float] | None = None,
                             n_params: Sequence[float] | None = None, refine: bool = True,
                             config: UTDConfig = DEFAULT) -> Frontier:
    """How the best (σ, N) grows with the total budget F = C_J + δ·D_J.

    For each budget F₀ the point is the most sample-efficient (σ, N) that fits it (least D_J subject to
    F ≤ F₀): spending more buys less data through higher σ and larger N. Budgets below the cheapest
    point (`recommend` without budgets) are listed in `infeasible`. σ*(F) and N*(F) are fitted as
    power laws of the budget over the feasible points."""
    delta = config.delta if delta is None else float(delta)
    s_axis = _axis(sigmas, data_law.sigma_range, config, "sigmas")
    n_axis = _axis(n_params, data_law.n_range, config, "n_params")
    used, points, infeasible = [], [], []
    for f0 in sorted(float(b) for b in budgets):
        found = _search(data_law, batch_law, s_axis, n_axis, delta, "data", None, None, f0, refine, config)
        if found is None:
            infeasible.append(f0)
            continue
        s, n, edge = found
        used.append(f0)
        points.append(_recommendation(data_law, batch_law, lr_law, s, n, delta, edge, config))
    if not points:
        cheapest = recommend(data_law, batch_law, lr_law, delta=delta, sigmas=s_axis, n_params=n_axis,
                             refine=refine, config=config)
        raise RoboRLError(f"no budget fits: the cheapest (sigma, N) costs F = {cheapest.total_cost:.3g} "
                          f"(sigma={cheapest.sigma:.3g}, N={cheapest.n_params:.3g}); give budgets above it")

    inner = [p for p in points if not p.at_grid_edge]
    fit_on = inner if len(inner) >= 2 else points  # a point pinned to the grid's border is not an optimum

    def law(values: list[float]) -> PowerLaw | None:
        if len(_distinct(values)) < 2:
            return None
        return fit_power_law([p.total_cost for p in fit_on], values)

    return Frontier(used, points, law([p.sigma for p in fit_on]), law([p.n_params for p in fit_on]), infeasible)
