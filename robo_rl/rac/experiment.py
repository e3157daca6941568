"""RaC rounds, the one home of the loop `robo-rl demo` and `robo-rl rac` both run: for each round,
collect new data with the policy of the round before, compose it with the demos, train, and
(optionally) evaluate.

Where the data comes from is the caller's: `collect` rolls the policy out with an operator
watching (the twin's simulated operator, or a human on a teleop device), or records more expert
demos, and `evaluate` rolls a policy out on fixed seeds. So this module never touches the twin,
and the same rounds run wherever those two are wired.

A method is what the round collects and how it trains on it:
- `rac`, `hg_dagger`: intervention rollouts; train on the demos plus every store so far, weighted
  by the composition (robo_rl/rac/mixing.py);
- `demos`: more expert demos, trained on as demos;
- `no_new_data`: the control, the same training on the demos alone (one round: every round
  starts from the same checkpoint, so more would repeat it).
With `budget` (round -> operator samples), a method collects until it has as many operator
samples as RaC had by that round: methods compared at equal operator effort.

`Stages` records each finished stage in `out/stages.json`, so that `resume=true` goes on where
an interrupted run stopped; `set_aside` keeps an interrupted stage's store beside the new one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from omegaconf import DictConfig, OmegaConf

from robo_rl.errors import ConfigError

METHODS = ("rac", "hg_dagger", "demos", "no_new_data")


class Collect(Protocol):
    def __call__(self, method: str, predict: Any, store: Path, round_: int, need: int | None) -> dict[str, Any]:
        """Round `round_`'s new data into `store`: at least `need` operator samples if given. Returns
        counts with at least episodes, operator_samples, operator_time_s, interventions and steps."""


class Evaluate(Protocol):
    def __call__(self, policy: Any, predict: Any, out: Path, round_: int) -> dict[str, Any]: ...


@dataclass
class Rounds:
    """One method's rounds: where each round's data and weights go, and how it trains."""

    method: str
    rounds: int
    checkpoint: Mapping[str, Any]  # the pre-trained policy: its weights (fine-tune) or normalisation (retrain)
    demos: Sequence[tuple[Path, int | None]]  # (store, first n episodes) of the pre-training demos
    store: Callable[[int], Path]  # round -> its own store for its new data (an interrupted round's is set aside)
    run_dir: Callable[[int], Path]  # round -> the training run's folder
    learner: Any  # LearnerConfig
    composition: Any  # CompositionConfig
    from_scratch: bool = False
    device: str = "cpu"
    extra: Callable[[int], Mapping[str, Any]] = field(default=lambda r: {})  # round -> checkpoint metadata
    # the stages' names in a resumable run ({label}: the method's, {how}: retrain or fine-tune, {r}: the round)
    stage_names: tuple[str, str, str] = ("3 {label} rollouts, round {r}", "4 {how}, round {r}",
                                         "{label} evaluation, round {r}")

    def stage(self, which: int, r: int) -> str:
        """Round r's collection (which=0), training (1) or evaluation (2) stage, as `Stages` names it."""
        return self.stage_names[which].format(label=label(self.method), how="retrain" if self.from_scratch else "fine-tune",
                                              r=r)


def run_rounds(plan: Rounds, policy: Any, predict: Any, collect: Collect, evaluate: Evaluate | None = None,
               budget: dict[int, int] | None = None, stages: "Stages | None" = None, resume: bool = False,
               after_collect: Callable[[int], None] | None = None,
               predictor: Callable[[Any], Any] | None = None,
               on_row: Callable[[dict[str, Any]], None] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """Run `plan`'s rounds from `policy` (its `predict` drives round 1; `predictor(policy)` makes
    the next rounds'). `budget`: RaC's operator samples by round, to match (RaC's own rounds fill
    it in). `after_collect(r)` runs after round r's data is in, `on_row(row)` after each round.
    Returns the last policy and one row per round: what was collected, the
    cumulative operator effort, the training, and the evaluation when `evaluate` is given."""
    from robo_rl.learn import last_checkpoint
    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.rac.finetune import finetune

    if plan.method not in METHODS:
        raise ConfigError(f"rac: method {plan.method!r}; choose from {list(METHODS)}")
    how = "retrain" if plan.from_scratch else "fine-tune"
    run_stage = stages.run if stages is not None else (lambda name, fn: fn())
    total = {"episodes": 0, "operator_samples": 0, "operator_time_s": 0.0, "interventions": 0}
    stores: list[Path] = []
    rows: list[dict[str, Any]] = []
    n_rounds = 1 if plan.method == "no_new_data" else plan.rounds
    for r in range(1, n_rounds + 1):
        store = plan.store(r)
        target = None if plan.method == "rac" or budget is None else budget.get(r)
        need = None if target is None else max(target - total["operator_samples"], 0)
        if plan.method == "no_new_data":
            st = {"episodes": 0, "operator_samples": 0, "operator_time_s": 0.0, "interventions": 0, "steps": {}}
        else:
            def collect_fresh() -> dict[str, Any]:
                set_aside(store)  # an interrupted round's partial data is kept beside, not mixed in
                return collect(plan.method, predict, store, r, need)

            st = run_stage(plan.stage(0, r), collect_fresh)
            stores = list(dict.fromkeys([*stores, store]))
        if after_collect is not None:
            after_collect(r)
        for k in total:
            total[k] += st.get(k, 0)
        if plan.method == "rac" and budget is not None:
            budget[r] = total["operator_samples"]
        steps = st.get("steps", {})
        if plan.method in ("rac", "hg_dagger"):
            cut = st.get("unfinished") or {}
            print(f"   {how}, round {r}: demos + {steps.get('RECOVERY', 0)} recovery and {steps.get('CORRECTION', 0)} "
                  f"correction steps from {st['interventions']} interventions, {plan.learner.steps} steps"
                  + (f" ({sum(cut.values())} interventions unfinished, their {st.get('unfinished_samples', 0)} "
                     f"samples weigh 0: {', '.join(f'{n} {e}' for e, n in cut.items())})" if cut else ""))
        demo_sources = list(plan.demos) + ([(s, None) for s in stores] if plan.method == "demos" else [])
        interventions = stores if plan.method in ("rac", "hg_dagger") else []
        run_dir = plan.run_dir(r)
        fit = run_stage(plan.stage(1, r), lambda: trained(finetune(
            plan.checkpoint, demo_sources, interventions, plan.composition, plan.learner, run_dir,
            extra=plan.extra(r), resume=resume, from_scratch=plan.from_scratch)[1]))
        policy = load_policy(read_checkpoint(last_checkpoint(run_dir)), device=plan.device)
        # a traced predictor holds memory TorchScript never gives back: made only where one is used
        needed = evaluate is not None or r < n_rounds
        predict = predictor(policy) if predictor is not None and needed else None
        row = {"method": plan.method, "round": r, **total, "collect": st, "finetune_steps": fit["step"]}
        if evaluate is not None:
            row.update(run_stage(plan.stage(2, r), lambda: evaluate(policy, predict, run_dir / "eval", r)))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return policy, rows


def label(method: str) -> str:
    return {"rac": "RaC", "hg_dagger": "HG-DAgger", "demos": "more expert demos",
            "no_new_data": "fine-tune, no new data"}[method]


def trained(result: dict[str, Any]) -> dict[str, Any]:
    """A Learner's result as a stage's; a run stopped by SIGTERM (checkpointed) is not a finished stage."""
    if result["stopped"]:
        print("   stopped and checkpointed; `resume=true` with the same out= goes on from here")
        raise KeyboardInterrupt
    return {"step": result["step"], "loss": result["loss"], "train_time_s": result["train_time_s"]}


def gain_verdict(before: dict[str, Any], control: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """After RaC against the pre-trained policy and against the control, in points, and whether
    the 95% Wilson intervals are apart (after's low end above the other's high end)."""
    def vs(other: dict[str, Any]) -> dict[str, Any]:
        return {"points": 100 * (after["success_rate"] - other["success_rate"]),
                "intervals_apart": after["ci95_low"] > other["ci95_high"]}

    v = {"vs_pretrained": vs(before), "vs_control": vs(control),
         "control_vs_pretrained_points": 100 * (control["success_rate"] - before["success_rate"])}
    v["line"] = (f"after RaC vs pre-trained: {v['vs_pretrained']['points']:+.0f} points "
                 f"(intervals {'apart' if v['vs_pretrained']['intervals_apart'] else 'overlap'}); "
                 f"vs control: {v['vs_control']['points']:+.0f} points "
                 f"(intervals {'apart' if v['vs_control']['intervals_apart'] else 'overlap'}); "
                 f"control vs pre-trained: {v['control_vs_pretrained_points']:+.0f} points")
    return v


class Stages:
    """A run's finished stages and their results in `out/stages.json`, written after each one,
    so that `resume=true` picks an interrupted run up where it stopped (a killed training goes on
    from its last checkpoint) instead of starting over."""

    # settings that may differ between the two runs, at any depth (`threads`, `finetune.threads`)
    IGNORED = ("resume", "device", "threads", "n_envs", "videos", "processes")

    def __init__(self, out: Path, cfg: DictConfig, resume: bool, verb: str = "demo"):
        self.path = out / "stages.json"
        self.done: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.resumed: list[str] = []
        config = OmegaConf.to_container(cfg, resolve=True)
        wanted = self.compared(flatten(config))
        if self.path.is_file():
            if not resume:
                raise ConfigError(f"{verb}: {out} already holds a run; pass resume=true to continue it or another out=")
            saved = json.loads(self.path.read_text())
            before = self.compared(saved["config"])
            differ = sorted(k for k in set(wanted) | set(before) if wanted.get(k) != before.get(k))
            if differ:
                raise ConfigError(f"{verb}: resume=true but {out} was run with other settings for {differ}; "
                                  "resume with the same ones or choose another out=")
            self.done, self.timings = saved["results"], saved["timings"]
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self.config = wanted
        self._write()

    @classmethod
    def compared(cls, flat: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in flat.items() if not set(k.split(".")) & set(cls.IGNORED)}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        if name in self.done:
            print(f"   {name}: done in an earlier run, reused")
            self.resumed.append(name)
            return self.done[name]
        t = time.perf_counter()
        self.done[name] = json.loads(json.dumps(fn()))  # what a resumed run reads back
        self.timings[name] = time.perf_counter() - t
        self._write()
        return self.done[name]

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"config": self.config, "results": self.done, "timings": self.timings}, indent=1))
        tmp.replace(self.path)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"small": {"demos": 50}} -> {"small.demos": 50}."""
    flat: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def set_aside(store: Path) -> None:
    """Move an interrupted stage's store to `<store>.interrupted-N`, so that nothing recorded is lost."""
    if store.exists():
        n = 1
        while store.with_name(f"{store.name}.interrupted-{n}").exists():
            n += 1
        store.rename(store.with_name(f"{store.name}.interrupted-{n}"))
