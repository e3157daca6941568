"""The offline-RL step loop: sample from a device replay, `agent.update`, log, evaluate, checkpoint.

Agents (robo_rl/rl: floq, fql, sharsa) own their losses, optimiser and target networks; this
loop owns time: progress bar, metrics.jsonl + TensorBoard, periodic evaluation, held-out TD error
(TD-overfitting, rl/td_monitor.py), atomic checkpoints with RNG state (resume continues the same stream),
SIGTERM / Ctrl-C / max_minutes stop with a checkpoint, and `results.json` at the end (the format
`robo-rl utd-fit` reads).
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import torch

from robo_rl.learn.learner import atomic_save, last_checkpoint, rng_state, set_rng_state


class Agent(Protocol):
    updates: int

    def update(self, batch: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]: ...
    def td_errors(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> Any: ...


@dataclass
class OfflineConfig:
    steps: int = 100_000
    batch_size: int = 256
    log_every: int = 500
    eval_every: int = 0  # 0: evaluate only at the end
    heldout_every: int = 1000  # held-out TD error cadence (0: off)
    checkpoint_every: int = 10_000
    max_minutes: float = 0.0
    seed: int = 0


SampleFn = Callable[[int], Mapping[str, torch.Tensor]]
EvalFn = Callable[[int], Mapping[str, float]]


class OfflineLoop:
    def __init__(self, agent: Agent, cfg: OfflineConfig, run_dir: str | Path, sample: SampleFn,
                 evaluate: EvalFn | None = None, heldout: SampleFn | None = None,
                 generator: torch.Generator | None = None, progress: bool = True, extra: dict | None = None):
        self.agent, self.cfg, self.run_dir = agent, cfg, Path(run_dir)
        self.sample, self.evaluate, self.heldout = sample, evaluate, heldout
        self.generator, self.progress, self.extra = generator, progress, extra or {}
        self.step = 0
        self.evals: list[dict] = []
        self.td_history: list[dict] = []
        from robo_rl.rl.td_monitor import HeldoutTD

        self.overfit = HeldoutTD()  # flags held-out TD error rising while the training one falls
        self.overfit_warned = False

    @property
    def last_path(self) -> Path:
        return last_checkpoint(self.run_dir)

    def save(self) -> None:
        optimizer = getattr(self.agent, "optimizer", None)  # Adam's moments: a resumed run continues exactly
        atomic_save({"agent": self.agent.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
                     "updates": getattr(self.agent, "updates", self.step), "step": self.step,
                     "rng": rng_state(self.generator), "evals": self.evals, "td_history": self.td_history,
                     "extra": self.extra}, self.last_path)

    def load(self, path: str | Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=False)
        self.agent.load_state_dict(state["agent"])
        if state.get("optimizer") is not None and getattr(self.agent, "optimizer", None) is not None:
            self.agent.optimizer.load_state_dict(state["optimizer"])
        self.agent.updates = state.get("updates", state["step"])
        self.step, self.evals, self.td_history = state["step"], state["evals"], state["td_history"]
        set_rng_state(state["rng"], self.generator)
        for row in self.td_history:  # the overfitting detector's window continues where it was
            if all(math.isfinite(row[k]) for k in ("train_td_error", "heldout_td_error")):
                self.overfit.record(row["step"], row["train_td_error"], row["heldout_td_error"])
        # rows from checkpoints written before the detector existed have no flag
        self.overfit_warned = any(row.get("td_overfitting", False) for row in self.td_history)

    def _log(self, path: str, row: dict) -> None:
        with open(self.run_dir / path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _heldout_td(self) -> dict:
        train = self.agent.td_errors(self.sample(self.cfg.batch_size)).mean().item()
        held = self.agent.td_errors(self.heldout(self.cfg.batch_size)).mean().item()
        finite = math.isfinite(train) and math.isfinite(held)  # a diverged critic: log, not crash
        row = {"step": self.step, "train_td_error": train, "heldout_td_error": held,
               "td_overfitting": bool(self.overfit.record(self.step, train, held)) if finite else False}
        self.td_history.append(row)
        return row

    def _run_eval(self, writer, bar) -> dict:
        t = time.perf_counter()
        result = {"step": self.step, **self.evaluate(self.step), "eval_time_s": time.perf_counter() - t}
        self.evals.append(result)
        self._log("evals.jsonl", result)
        if writer is not None:
            for k, v in result.items():
                if isinstance(v, (int, float)) and k != "step":
                    writer.add_scalar(f"eval/{k}", v, self.step)
        msg = ", ".join(f"{k}={v:.3g}" for k, v in result.items() if isinstance(v, float))
        (bar.write if bar is not None else print)(f"eval @ {self.step}: {msg}")
        return result

    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=self.step or None)
        except ImportError:
            writer = None
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc="offline-rl", unit="upd", dynamic_ncols=True)
        stop = {"flag": False}
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
        t_start = t_window = time.perf_counter()
        window, sums = 0, {}
        train_time = 0.0
        try:
            while self.step < cfg.steps and not stop["flag"]:
                t0 = time.perf_counter()
                info = self.agent.update(self.sample(cfg.batch_size))
                self.step += 1
                window += 1
                for k, v in info.items():  # accumulate on the device; one sync per log line
                    sums[k] = sums.get(k, 0) + v.detach()
                train_time += time.perf_counter() - t0
                if bar is not None:
                    bar.update()
                td_row = {}
                if self.heldout is not None and cfg.heldout_every and self.step % cfg.heldout_every == 0:
                    td_row = self._heldout_td()
                    if td_row["td_overfitting"] and not self.overfit_warned:
                        self.overfit_warned = True
                        (bar.write if bar is not None else print)(
                            f"TD-overfitting at update {self.step}: held-out TD error rising while the training "
                            f"one falls (a bigger critic or a smaller batch/UTD; robo_rl/rl/utd.py)")
                if self.step % cfg.log_every == 0 or self.step == cfg.steps or td_row:
                    now = time.perf_counter()
                    row = {"step": self.step, **{k: float(v) / window for k, v in sums.items()},
                           "updates_per_s": window / max(now - t_window, 1e-9), **td_row}
                    self._log("metrics.jsonl", row)
                    if writer is not None:
                        for k, v in row.items():
                            if k != "step":
                                writer.add_scalar(k if "/" in k else f"train/{k}", v, self.step)
                    if bar is not None:
                        bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in row.items()
                                         if k in ("critic/q", "actor/q", "updates_per_s", "heldout_td_error")})
                    window, sums, t_window = 0, {}, now
                # evaluation before the checkpoint: acting draws from the replay's generator, so a
                # resumed run then continues exactly the random stream of a straight one
                if self.evaluate and cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                    self._run_eval(writer, bar)
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save()
                if cfg.max_minutes and time.perf_counter() - t_start > cfg.max_minutes * 60:
                    (bar.write if bar is not None else print)(f"max_minutes={cfg.max_minutes} reached at update {self.step}")
                    break
        except KeyboardInterrupt:
            if bar is not None:
                bar.write(f"interrupted at update {self.step}; checkpointing")
            self.save()
            raise
        finally:
            if bar is not None:
                bar.close()
            signal.signal(signal.SIGTERM, previous)
        self.save()  # the weights are safe before the final evaluation runs ...
        final = self._run_eval(writer, None) if self.evaluate and not stop["flag"] else {}
        if final:
            self.save()  # ... and a resumed run continues after its draws
        if writer is not None:
            writer.close()
        result = {"updates": self.step, "train_time_s": train_time, "updates_per_s": self.step / max(train_time, 1e-9),
                  "stopped": stop["flag"], "final_eval": final, "evals": self.evals, "td_history": self.td_history,
                  "config": asdict(cfg), **self.extra}
        if self.td_history:
            result["td_overfitting"] = any(r.get("td_overfitting", False) for r in self.td_history)
            result["train_td_error"] = self.td_history[-1]["train_td_error"]
            result["heldout_td_error"] = self.td_history[-1]["heldout_td_error"]
        (self.run_dir / "results.json").write_text(json.dumps(result, indent=1, default=float))
        return result
