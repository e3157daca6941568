"""The Learner: one training loop for every network here (policies now, critics in rl/).

It asks only that the model's `forward(batch, weights)` returns a scalar loss. Everything else is
the loop, readable top to bottom: sample a batch, loss, backward, clip, step, EMA, log, evaluate,
checkpoint. Features: AdamW with linear warm-up and cosine decay, EMA weights, bf16 autocast on
GPU, optional torch.compile, per-sample loss weights, atomic checkpoints with full resume (step,
optimiser, scheduler, EMA, every RNG), TensorBoard and JSON-lines logs, and DDP under torchrun.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from robo_rl.errors import ConfigError


@dataclass
class LearnerConfig:
    steps: int = 20000             # 0 (with max_minutes): as many as fit in the time
    batch_size: int = 256          # global batch; each DDP rank takes batch_size / world_size
    lr: float = 1e-4
    weight_decay: float = 1e-6
    betas: tuple[float, float] = (0.95, 0.999)
    warmup_steps: int = 500
    min_lr_ratio: float = 0.0      # the cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0         # max global grad norm; 0 = off
    ema_decay: float = 0.999       # ceiling; the decay warms up as (1 + step) / (10 + step)
    bf16: str = "auto"             # auto (on for CUDA) | true | false
    compile: str = "false"         # true | false | auto: torch.compile the training forward; auto compiles on a
                                   # CPU with a C++ compiler for runs long enough to earn back the ~40 s it takes
    cuda_graph: str = "auto"       # auto (on for one CUDA device without compile) | true | false: the forward,
                                   # backward and clipping replayed as one CUDA graph (launch-bound small nets)
    loss_weights: bool = True      # use the sampler's per-sample weights in the loss
    weighted_sampling: bool = False  # draw windows in proportion to their weights instead
    log_every: int = 50
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2      # numbered checkpoints kept besides last.pt
    eval_every: int = 0            # 0 = evaluate only at the end (when an evaluator is given)
    max_minutes: float = 0.0       # stop early (checkpointed) after this much wall time; 0 = no limit
    fit_schedule: bool = True      # with max_minutes: measure the rate over the first steps and end the cosine
                                   # at the steps that fit in the time (a schedule cut off mid-decay trains worse)
    seed: int = 0
    device: str = "auto"           # auto | cpu | cuda | cuda:N
    threads: int = 0               # CPU threads for torch; 0 = torch's default

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "LearnerConfig":
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"learner: unknown option(s) {unknown}; known: {sorted(names)}")
        if "betas" in d:
            d["betas"] = tuple(float(b) for b in d["betas"])
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        cfg = self
        if cfg.steps < 0 or cfg.batch_size < 1:
            raise ConfigError(f"learner.steps must be >= 0 and learner.batch_size >= 1 (got {cfg.steps}, {cfg.batch_size})")
        if cfg.steps == 0 and not (cfg.max_minutes > 0 and cfg.fit_schedule):
            raise ConfigError("learner.steps=0 (as many steps as fit in the time) needs learner.max_minutes > 0 "
                              "and learner.fit_schedule=true")
        for name in ("bf16", "cuda_graph", "compile"):
            if str(getattr(cfg, name)).lower() not in ("auto", "true", "false"):
                raise ConfigError(f"learner.{name}={getattr(cfg, name)!r}; choose auto, true or false")


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warm-up to 1, then cosine down to `min_ratio`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------- distributed
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; without them this is a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(name: str, local_rank: int = 0) -> str:
    if name == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"learner.device={name} but CUDA is not available here; use device=cpu")
    if name == "cuda":
        return f"cuda:{local_rank}"
    return name


# --------------------------------------------------------------------------- checkpoints
def atomic_save(obj: Any, path: Path) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it: a kill at any moment
    leaves either the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state(generator: torch.Generator | None) -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["sampler"] = generator.get_state()
    return state


def set_rng_state(state: Mapping[str, Any], generator: torch.Generator | None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    # RNG states are CPU byte tensors; a checkpoint loaded with map_location="cuda" moved them
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if generator is not None and "sampler" in state:
        generator.set_state(state["sampler"].cpu())


COMPILE_MIN_MINUTES, COMPILE_MIN_STEPS = 5.0, 2000  # compile=auto: shorter runs would not earn back the compile


def compile_wanted(cfg: LearnerConfig, device: str) -> bool:
    """learner.compile resolved: auto compiles on a CPU that has a C++ compiler (inductor writes
    C++ there), for a run of at least COMPILE_MIN_MINUTES or COMPILE_MIN_STEPS. On the camera
    recipe it made the Learner's step 1.25x faster on a 2-core Intel Xeon (docs/results.md)."""
    choice = str(cfg.compile).lower()
    if choice != "auto":
        return choice == "true"
    long_run = cfg.max_minutes >= COMPILE_MIN_MINUTES or cfg.steps >= COMPILE_MIN_STEPS
    has_cxx = any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))
    return device == "cpu" and long_run and has_cxx


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- the learner
SampleFn = Callable[[int, torch.Generator, bool], Mapping[str, torch.Tensor]]
EvalFn = Callable[[nn.Module, int], Mapping[str, float]]


def last_checkpoint(run_dir: str | Path) -> Path:
    """Where a run directory keeps its latest checkpoint: every verb resumes and loads from here."""
    return Path(run_dir) / "checkpoints" / "last.pt"


class Learner:
    """Trains `model` on batches from `sample(batch_size, generator, weighted)`.

    `run_dir` receives checkpoints/, tb/ (TensorBoard), metrics.jsonl and evals.jsonl. `extra` is
    stored in every checkpoint (e.g. the policy's description and the dataset it came from).
    `evaluate(ema_model, step)` is called every `eval_every` steps and at the end, on rank 0.
    """

    def __init__(self, model: nn.Module, cfg: LearnerConfig, run_dir: str | Path, sample: SampleFn,
                 extra: Mapping[str, Any] | None = None, evaluate: EvalFn | None = None, progress: bool = True):
        self.cfg, self.run_dir, self.sample, self.extra, self.evaluate = cfg, Path(run_dir), sample, dict(extra or {}), evaluate
        self.progress = progress
        cfg.validate()
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.dist = setup_distributed(resolve_device(cfg.device))
        self.device = resolve_device(cfg.device, self.dist.local_rank)
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        seed_everything(cfg.seed + self.dist.rank)
        self.model = model.to(self.device)
        self.ema = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.train_model: nn.Module = self.model
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [torch.device(self.device).index] if self.device.startswith("cuda") else None
            self.train_model = DistributedDataParallel(self.model, device_ids=ids)
        self.eager_model = self.train_model
        self.compiled = compile_wanted(cfg, self.device)
        self._compiled_checked = False  # until the first compiled step has compiled and given finite gradients
        if self.compiled:
            self.train_model = torch.compile(self.train_model)
        decay, no_decay = [], []
        for p in self.model.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)  # no decay on biases and norms
        on_cuda = self.device.startswith("cuda")
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        try:  # fused: one kernel over every parameter (CPU too since torch 2.4: 21 -> 27 steps/s on the demo's MLP)
            self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=True)
        except (RuntimeError, ValueError):  # an older torch or a device without the fused kernel
            self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        # the schedule's length: cfg.steps, or what fits in learner.max_minutes once fitted (`_fit_schedule`)
        self.total_steps, self.schedule_fitted = cfg.steps or self.UNFITTED, False
        self.schedule_fixed = False  # a resumed run keeps the length its first process fitted
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: warmup_cosine(s, cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio))
        self.generator = torch.Generator(device=self.device if on_cuda else "cpu")
        self.generator.manual_seed(cfg.seed * 1000 + self.dist.rank)
        bf16 = str(cfg.bf16).lower()
        self.autocast = bf16 == "true" or (bf16 == "auto" and on_cuda)
        graph = str(cfg.cuda_graph).lower()
        if graph == "true" and not on_cuda:
            raise ConfigError(f"learner.cuda_graph=true needs a CUDA device; this run's is {self.device}")
        self.use_graph = on_cuda and (graph == "true" or (graph == "auto" and self.dist.world == 1 and not self.compiled))
        self._graph: Any = None  # (CUDAGraph, static batch, static loss) once captured
        self._eager_steps = 0     # warm-up steps run in this process before the capture
        self.step = 0
        self.last_loss = float("nan")
        self.history: list[dict[str, Any]] = []

    # ---- checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "model": self.model.state_dict(), "ema": self.ema.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(self.generator), "learner": asdict(self.cfg), "total_steps": self.total_steps,
                "schedule_fitted": self.schedule_fitted, **self.extra}

    def save(self) -> Path | None:
        if not self.dist.main:
            return None
        state = self.state()
        last = last_checkpoint(self.run_dir)
        atomic_save(state, last)
        if self.cfg.keep_checkpoints > 0:
            atomic_save(state, self.checkpoint_dir / f"step_{self.step:08d}.pt")
            numbered = sorted(self.checkpoint_dir.glob("step_*.pt"))
            for old in numbered[: -self.cfg.keep_checkpoints]:
                old.unlink(missing_ok=True)
        return last

    def load(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"resume: no checkpoint at {path}")
        try:
            ckpt = torch.load(path, map_location=self.device, weights_only=False)
        except Exception as e:
            raise ConfigError(f"resume: checkpoint {path} could not be read ({type(e).__name__}: {e})") from None
        self.model.load_state_dict(ckpt["model"])
        self.ema.load_state_dict(ckpt["ema"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.step = int(ckpt["step"])
        if ckpt.get("schedule_fitted"):  # a resumed run keeps the length its first process fitted
            self.total_steps, self.schedule_fitted, self.schedule_fixed = int(ckpt["total_steps"]), True, True
        # Each rank resumes its own stream; rank r > 0 reseeds deterministically from the step.
        if self.dist.main:
            set_rng_state(ckpt["rng"], self.generator)
        else:
            seed_everything(self.cfg.seed + self.dist.rank + 7919 * self.step)

    def resume_from_last(self) -> bool:
        """Go on from `run_dir`'s last checkpoint if there is one; False if there is none."""
        last = last_checkpoint(self.run_dir)
        if last.is_file():
            self.load(last)
        return last.is_file()

    # ---- one step
    def train_step(self) -> float:
        """One update; returns its loss (waiting for the device: `fit` checks losses in windows instead)."""
        loss = float(self._step())
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {self.step}; lower learner.lr or check the data")
        return loss

    def _step(self) -> torch.Tensor:
        """One update without waiting for the device: the loss stays a device tensor, so that on a
        GPU the next step's kernels queue up while this one runs."""
        cfg = self.cfg
        per_rank = max(1, cfg.batch_size // self.dist.world)
        batch = self.sample(per_rank, self.generator, cfg.weighted_sampling)
        self.model.train()
        if self.use_graph and self._eager_steps >= self.GRAPH_WARMUP:
            loss = self._graph_loss_and_grads(batch)
        elif self.use_graph:  # the warm-up before a capture runs on a side stream, as CUDA graphs ask
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._loss_and_grads(batch)
            torch.cuda.current_stream().wait_stream(side)
            self._eager_steps += 1
        else:
            loss = self._loss_and_grads(batch)
        self.optimizer.step()
        self.scheduler.step()
        self.update_ema()
        self.step += 1
        return loss.detach()

    def _loss_and_grads(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        weights = batch.get("weight") if self.cfg.loss_weights else None
        # no autocast weight cache: inside a CUDA graph capture it would hold stale casts
        with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16, enabled=self.autocast,
                            cache_enabled=not self.use_graph):
            if self.compiled and not self._compiled_checked:
                loss = self._first_compiled_loss(batch, weights)
            else:
                loss = self.train_model(batch, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.compiled and not self._compiled_checked:
            return self._checked_compiled_grads(batch, loss)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        return loss

    def _checked_compiled_grads(self, batch: Mapping[str, torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
        """The first compiled step's loss and gradients must be finite, or the step is taken again
        eagerly and the run stays eager: a compiler bug must not train a run on NaNs."""
        self._compiled_checked = True
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads):
            if self.cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            return loss
        self._train_eagerly("the first compiled step gave a non-finite loss or gradient; taking it again eagerly "
                            "and training eagerly (learner.compile=false says so from the start)")
        return self._loss_and_grads(batch)

    def _train_eagerly(self, why: str) -> None:
        print(f"learner: {why}")
        self.compiled, self.train_model = False, self.eager_model

    def _first_compiled_loss(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None) -> torch.Tensor:
        """The first compiled forward, where torch.compile does its work: if it fails (no working
        C++ compiler, an op inductor cannot lower), say why in one line and train eagerly."""
        if self.dist.main:
            print("learner: compiling the training step (torch.compile, about 40 s on a 2-core CPU; learner.compile=false skips it)",
                  flush=True)
        try:
            loss = self.train_model(batch, weights)
        except Exception as e:  # noqa: BLE001 - any compiler failure: fall back, say why once
            root = e
            while root.__cause__ is not None:  # inductor wraps the compiler's own error
                root = root.__cause__
            said = (str(root).strip().splitlines() or [""])[0][:200]
            self._train_eagerly(f"torch.compile failed ({type(root).__name__}: {said}); training eagerly")
            return self.train_model(batch, weights)
        return loss

    UNFITTED = 10**9  # the schedule's length with learner.steps=0 until the time budget fits it
    GRAPH_WARMUP = 3  # eager steps before the capture, so that cuBLAS and the allocator have settled

    def _graph_loss_and_grads(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward, backward and clipping as one replayed CUDA graph. A small network on a GPU is
        bound by launching its few hundred kernels one by one from Python, not by the GPU; the
        replay launches them at once. The batch is copied into the graph's fixed input tensors;
        the gradients live in the graph's memory, where the fused AdamW step reads them. The noise
        and flow times come from the default CUDA generator, which graphs replay with fresh draws.
        If the capture fails (an op that cannot be captured), training goes on eagerly."""
        if self._graph is None:
            try:
                static = {k: v.clone() for k, v in batch.items()}
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # zero_grad(set_to_none) inside: backward allocates the grads in its pool
                    loss = self._loss_and_grads(static)
                self._graph = (graph, static, loss)
            except Exception as e:  # noqa: BLE001 - any capture failure: fall back, say why once
                print(f"learner: CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); training eagerly")
                self.use_graph, self._graph = False, None
                torch.cuda.synchronize()
                return self._loss_and_grads(batch)
        graph, static, loss = self._graph
        for k, v in batch.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()  # overwrites the grads in place: nothing zeroes them between replays
        return loss

    @torch.no_grad()
    def update_ema(self) -> None:
        decay = min(self.cfg.ema_decay, (1 + self.step) / (10 + self.step))
        ema_p = [p for p in self.ema.parameters()]
        model_p = [p.detach() for p in self.model.parameters()]
        torch._foreach_lerp_(ema_p, model_p, 1 - decay)
        for b_ema, b in zip(self.ema.buffers(), self.model.buffers()):
            b_ema.copy_(b)

    # ---- the loop
    def fit(self) -> dict[str, Any]:
        cfg, main = self.cfg, self.dist.main
        writer = None
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=self.step or None)
            except ImportError:  # tensorboard is a dependency, but a missing one should not stop training
                writer = None
        bar = None
        if main and self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps if self.total_steps < self.UNFITTED else None, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
        t_start, t_window, steps_window, n_loss = time.perf_counter(), time.perf_counter(), 0, 0
        # learner.max_minutes: the rate is timed from this process's 10th step; the schedule is fitted
        # once the warm-up is timed, then refitted every 50 steps with the rate so far (the first
        # steps run slower than the rest: one early figure ended runs minutes short)
        first_step, t_rate, fit_at = self.step, None, max(cfg.warmup_steps, 100) + 10
        fitting = bool(cfg.max_minutes and cfg.fit_schedule)
        loss_sum = torch.zeros((), device=self.device)

        def window_loss() -> float:  # the one wait for the device per log window
            mean = float(loss_sum) / max(n_loss, 1)
            if not math.isfinite(mean):
                raise FloatingPointError(f"loss is {mean} between steps {self.step - n_loss + 1} and {self.step}; "
                                         "lower learner.lr or check the data")
            return mean

        stop = {"flag": False}
        previous = signal.getsignal(signal.SIGTERM)
        if main:
            signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))  # finish the step, checkpoint, exit
        final_eval: dict[str, Any] = {}
        try:
            while self.step < self.total_steps and not stop["flag"]:
                loss_sum += self._step().float()
                n_loss, steps_window = n_loss + 1, steps_window + 1
                if bar is not None:
                    bar.update()
                done_here = self.step - first_step
                if done_here == 10:
                    t_rate = time.perf_counter()
                if fitting and not self.schedule_fixed and done_here >= fit_at and (done_here - fit_at) % 50 == 0:
                    self._fit_schedule((done_here - 10) / (time.perf_counter() - t_rate),
                                       cfg.max_minutes * 60 - (time.perf_counter() - t_start), bar)
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    now = time.perf_counter()
                    rate = steps_window / max(now - t_window, 1e-9)
                    self.last_loss = window_loss()
                    row = {"step": self.step, "loss": self.last_loss, "lr": self.scheduler.get_last_lr()[0],
                           "steps_per_s": rate, "time_s": now - t_start}
                    self.history.append(row)
                    if main:
                        if bar is not None:
                            bar.set_postfix(loss=f"{self.last_loss:.4f}", lr=f"{row['lr']:.2e}")
                        if writer is not None:
                            for k in ("loss", "lr", "steps_per_s"):
                                writer.add_scalar(f"train/{k}", row[k], self.step)
                        with open(self.run_dir / "metrics.jsonl", "a") as f:
                            f.write(json.dumps(row) + "\n")
                    t_window, steps_window, n_loss = now, 0, 0
                    loss_sum.zero_()
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    if n_loss:
                        window_loss()  # never checkpoint weights a non-finite loss went into
                    self.save()
                if main and self.evaluate and cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                    self._evaluate(writer, bar)
                # a fitted schedule a few steps from its end finishes them rather than stop mid-decay
                finishing = self.schedule_fitted and self.total_steps - self.step <= max(50, self.total_steps // 50)
                if cfg.max_minutes and time.perf_counter() - t_start > cfg.max_minutes * 60 and not finishing:
                    if bar is not None:
                        bar.write(f"learner.max_minutes={cfg.max_minutes} reached at step {self.step}; stopping")
                    break
        except KeyboardInterrupt:
            if bar is not None:
                bar.write(f"interrupted at step {self.step}; checkpointing")
            if not n_loss or math.isfinite(float(loss_sum)):
                self.save()
            raise
        finally:
            if bar is not None:
                bar.close()
            if main:
                signal.signal(signal.SIGTERM, previous)
        if n_loss:
            self.last_loss = window_loss()
        self.save()
        if main and self.evaluate and not stop["flag"]:
            final_eval = self._evaluate(writer, None)
        if writer is not None:
            writer.close()
        return {"step": self.step, "loss": self.last_loss, "train_time_s": time.perf_counter() - t_start,
                "stopped": stop["flag"], "eval": final_eval}

    def _fit_schedule(self, steps_per_s: float, seconds_left: float, bar: Any) -> None:
        """End the cosine at the steps that fit in the time left (with 3% to spare for
        checkpoints), never past learner.steps (when given). Under DDP every rank takes rank 0's figure, so all
        ranks stop at the same step. metrics.jsonl records the first figure; checkpoints the latest."""
        fits = min(self.cfg.steps or self.UNFITTED, self.step + int(steps_per_s * max(seconds_left, 0.0) * 0.97))
        if self.dist.world > 1:
            import torch.distributed as dist

            t = torch.tensor([fits], device=self.device)
            dist.broadcast(t, 0)
            fits = int(t.item())
        first = not self.schedule_fitted
        self.schedule_fitted = True
        if fits >= self.total_steps and first:
            return
        self.total_steps = max(self.step + 1, fits)
        if bar is not None:
            bar.total = self.total_steps
            bar.refresh()
        if self.dist.main and first:
            msg = (f"learner.max_minutes={self.cfg.max_minutes}: {steps_per_s:.2f} steps/s, so the schedule ends at "
                   f"step {self.total_steps}" + (f" instead of {self.cfg.steps} (learner.fit_schedule=false keeps it)"
                                                 if self.cfg.steps else ""))
            (bar.write if bar is not None else print)(msg)
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": self.step, "scheduled_steps": self.total_steps, "steps_per_s": steps_per_s}) + "\n")

    def _evaluate(self, writer: Any, bar: Any) -> dict[str, Any]:
        t = time.perf_counter()
        result = dict(self.evaluate(self.ema, self.step))
        result.update(step=self.step, eval_time_s=time.perf_counter() - t)
        with open(self.run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        if writer is not None:
            for k, v in result.items():
                if isinstance(v, (int, float)) and k != "step":
                    writer.add_scalar(f"eval/{k}", v, self.step)
        msg = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()
                        if isinstance(v, (int, float)))
        (bar.write if bar is not None else print)(f"eval @ {self.step}: {msg}")
        return result
