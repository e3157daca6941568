"""robo-rl utd-fit: scaling laws from a UTD sweep, and the (σ, N, B, η) to run for a budget.

`robo-rl utd-fit sweep=DIR threshold=J flop_budget=C data_budget=D delta=δ` (or `robo-rl utd-fit DIR ...`)
reads the sweep's results.json files, fits the laws of robo_rl.rl.utd, prints them with the
recommendation, and writes everything to <sweep>/fit.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_store_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.rl import utd


def main(argv: list[str]) -> int:
    return run_store_app("utd-fit", run, argv, config_name="utd", key="sweep", what="sweep folder")


def _number(cfg: DictConfig, key: str, positive: bool = True) -> float | None:
    v = cfg.get(key)
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={v!r}: give a number (or null)") from None
    if not math.isfinite(x) or (positive and x <= 0) or x < 0:
        raise ConfigError(f"{key}={v!r}: give a finite number {'> 0' if positive else '>= 0'} (or null)")
    return x


def _numbers(cfg: DictConfig, key: str) -> list[float] | None:
    v = cfg.get(key)
    if v is None:
        return None
    values = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{key}={v!r}: give a list of numbers, e.g. {key}=[1,2,4,8]")
    try:
        return [float(x) for x in values]
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={v!r}: give a list of numbers") from None


def _g(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def run(cfg: DictConfig) -> int:
    if not cfg.sweep:
        raise ConfigError("give the sweep's folder: robo-rl utd-fit sweep=DIR (its runs each hold a results.json)")
    sweep = Path(str(cfg.sweep))
    try:
        threshold = None if cfg.threshold is None else float(cfg.threshold)
    except (TypeError, ValueError):
        raise ConfigError(f"threshold={cfg.threshold!r}: give the score to reach as a number (or null)") from None
    flop_budget, data_budget = _number(cfg, "flop_budget"), _number(cfg, "data_budget")
    delta = _number(cfg, "delta", positive=False)
    sigmas, n_params, frontier = _numbers(cfg, "sigmas"), _numbers(cfg, "n_params"), _numbers(cfg, "frontier")
    if int(cfg.grid_points) < 3 or float(cfg.extrapolate) < 1:
        raise ConfigError(f"grid_points={cfg.grid_points} (>= 3) and extrapolate={cfg.extrapolate} (>= 1)")
    config = dataclasses.replace(utd.DEFAULT, delta=utd.DEFAULT.delta if delta is None else delta,
                                 grid_points=int(cfg.grid_points), extrapolate=float(cfg.extrapolate))

    results = utd.load_sweep(sweep, threshold)
    best = utd.best_configs(results)
    if not best:
        if threshold is None:
            raise RoboRLError(f"{sweep}: none of the {len(results)} runs records a data_to_threshold; give threshold=J "
                              f"to compute it from the runs' curves")
        raise RoboRLError(f"{sweep}: none of the {len(results)} runs reached threshold={threshold:g}; "
                          f"lower threshold= or run longer")
    batch_law = utd.fit_batch_law(results, config=config)
    lr_law = utd.fit_lr_law(results, config=config)
    n_sizes = len({c.n_params for c in best})
    model_law = utd.fit_batch_size_law_with_model(results, config=config) if n_sizes >= config.min_models else None
    data_law = utd.fit_data_law(results, config=config)

    out = Path(str(cfg.out)) if cfg.out else sweep / "fit.json"
    fit: dict[str, Any] = {
        "sweep": str(sweep), "threshold": threshold, "runs": len(results),
        "runs_reached": sum(r.reached for r in results),
        "best_configs": [dataclasses.asdict(c) for c in best],
        "laws": {"batch": batch_law.to_dict(), "lr": lr_law.to_dict(),
                 "batch_with_model": model_law.to_dict() if model_law else None, "data": data_law.to_dict()},
        "delta": config.delta, "flop_budget": flop_budget, "data_budget": data_budget,
        "recommendation": None, "recommendation_error": None, "frontier": None,
    }

    print_table(f"utd-fit {sweep}: best (B, lr) per (sigma, N), {fit['runs_reached']}/{len(results)} runs reached "
                f"the threshold", ["sigma", "N", "batch", "lr", "data to threshold", "seeds"],
                [(_g(c.sigma), _g(c.n_params), _g(c.batch_size), _g(c.lr), _g(c.data, 4), c.seeds) for c in best])
    rows = [("B*(sigma)", f"{batch_law.coef:.4g} * sigma^-{batch_law.alpha:.3f}", f"{batch_law.r2:.3f}",
             batch_law.n_points),
            ("lr*(sigma)", f"{lr_law.coef:.3g} * sigma^-{lr_law.alpha:.3f}", f"{lr_law.r2:.3f}", lr_law.n_points)]
    if model_law:
        rows.append(("B*(sigma, N)", f"{model_law.a:.4g} / (sigma^{model_law.alpha:.3f} (1 + ({model_law.b:.3g}/N)"
                     f"^{model_law.c:.3f}))", f"{model_law.r2:.3f}", model_law.n_points))
    n_term = f" + ({data_law.b:.3g}/N)^{data_law.beta:.3f}" if data_law.with_model else ""
    rows.append(("D_J(sigma, N)", f"{data_law.d_min:.4g} + ({data_law.a:.3g}/sigma)^{data_law.alpha:.3f}{n_term}",
                 f"{data_law.r2:.3f}", data_law.n_points))
    print_table("fitted laws (r2 in log space)", ["law", "fit", "r2", "points"], rows)

    chosen_batch_law = model_law or batch_law
    try:
        rec = utd.recommend(data_law, chosen_batch_law, lr_law, flop_budget=flop_budget, data_budget=data_budget,
                            delta=config.delta, sigmas=sigmas, n_params=n_params, config=config)
        fit["recommendation"] = rec.to_dict()
        if frontier:
            fit["frontier"] = utd.compute_optimal_frontier(data_law, chosen_batch_law, lr_law, frontier,
                                                           delta=config.delta, sigmas=sigmas, n_params=n_params,
                                                           config=config).to_dict()
    except RoboRLError as e:
        fit["recommendation_error"] = str(e)
        _write(out, fit)
        raise
    _write(out, fit)

    budget = ", ".join(f"{k} {_g(v)}" for k, v in (("flops", flop_budget), ("data", data_budget)) if v is not None)
    print_table(f"recommendation ({budget or 'no budget'}; delta {_g(config.delta)} FLOPs per transition)", ["", ""], [
        ("UTD sigma", _g(rec.sigma)),
        ("critic parameters N", _g(rec.n_params)),
        ("batch size", rec.batch_size),
        ("learning rate", _g(rec.lr)),
        ("data to threshold", f"{rec.data:.4g} transitions"),
        ("compute", f"{rec.compute_flops:.3g} FLOPs"),
        ("total cost F", f"{rec.total_cost:.3g}"),
        ("note", "on the grid's border: widen sigmas= / n_params=" if rec.at_grid_edge else "inside the grid"),
    ])
    if fit["frontier"]:
        fr = fit["frontier"]
        rows = [(_g(b), _g(p["sigma"]), _g(p["n_params"]), p["batch_size"], _g(p["data"], 4), _g(p["compute_flops"]),
                 "grid border" if p["at_grid_edge"] else "") for b, p in zip(fr["budgets"], fr["points"])]
        rows += [(_g(b), "-", "-", "-", "-", "-", "below the cheapest F") for b in fr["infeasible"]]
        print_table("compute-optimal frontier (least data within each total budget F)",
                    ["budget F", "sigma*", "N*", "batch", "data", "compute", "note"], rows)
        for name, law in (("sigma*(F)", fr["sigma_law"]), ("N*(F)", fr["n_params_law"])):
            if law:
                print(f"{name} = {law['coef']:.3g} * F^{law['exponent']:.3f}  (r2 {law['r2']:.3f})")
    print(f"wrote {out}")
    return 0


def _write(out: Path, fit: dict[str, Any]) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(fit, indent=1))
    except OSError as e:
        raise RoboRLError(f"cannot write {out}: {e}") from None
