"""Policy benchmark: inference latency per action chunk and training throughput.

(a) latency: CPU, batch 1, one thread, the time to return one chunk (H = 16 actions), p50/p99
    over --reps calls after warm-up, eager (`policy.predict`) and frozen (`FrozenPredictor`, what
    `robo-rl eval` uses on a CPU). Flow at K = 10 Euler steps, diffusion at DDIM 10, each with
    the DiT (default) and the U-Net backbone at our default sizes (and low-dim, the two smaller DiTs), on
    low-dim observations (qpos 14 + object state 7, To = 2) and with 2 cameras at 96x96 (+ qpos).
    Baseline in the same run: the same diffusion policy at diffusion_policy's published sizes
    (U-Net 256/512/1024, ResNet-18 width 64). Targets: p99 <= 5 ms low-dim, <= 30 ms with images
    (<= 12 ms for the camera recipe: conv encoder, one frame, MLP backbone).
    LeRobot's ACT (37 ms) and diffusion policy (1.8 s at DDIM 10) on this kind of machine are quoted.
(b) training: optimiser steps/s (forward + backward + AdamW) on CPU with all threads, batch 64
    and 256, low-dim and 2-camera 96x96, flow with each backbone; then the task-sized low-dim
    backbones against the default DiT at batch 128: fp32, bf16 autocast (the CPU's flags say
    whether it has AVX512-BF16; without it bf16 is emulated and slower) and fp32 + torch.compile;
    (b3) camera policies, 2 cameras 96x96, batch 128, fp32 and bf16: the default (ResNet-18
    layout, DiT, 2 frames) against the conv encoder, one frame per window and the MLP backbone.
(cameras) the camera recipe as `train` runs it (3 cameras 96x96 + qpos, the conv encoder, one frame, the
    MLP backbone, 64-step chunks, 4 flow draws per window, the chunk regression, bf16 autocast where
    the CPU computes bf16), before and now, in one run: "before" is the code path at the start of
    the speed-up work, kept callable here (crops cut from float images by a gather per axis, NCHW;
    the sampler's per-step FiLM), measured in rounds interleaved with "now" so that a shared
    machine's drift falls on both. (t1) training steps/s at batch 128 on all threads, and with
    torch.compile (--compile: ~40 s of compilation first); (t2) where a step's time goes;
    (t3) one chunk at batch 1 (p50/p99, eager and frozen, K = 10 and 5 flow steps, 1 and 2 threads,
    the four paths called in turn); (t4, --dataset STORE) the Learner's own step on a real store,
    eager and with learner.compile=true, interleaved.
(c) GPU (only when CUDA is available): first the demo's MLP policy through the Learner itself
    (sampling on the GPU, AdamW, EMA), eager against the replayed CUDA graph (`learner.cuda_graph`),
    fp32 and bf16; then the raw step (forward + backward + AdamW) at batch 256 for the default
    backbones, fp32 vs bf16 autocast, eager vs torch.compile (--learner-only skips these).

    python bench/policy.py [--quick] [--only latency|train|cameras|gpu] [--learner-only] [--reps 200] [--compile]
    python bench/policy.py --only cameras --compile --dataset data/demos/transfer_cube_cams
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_flags, cpu_kind, make_console, table  # noqa: E402

from robo_rl.policies import ObsShapes, make_policy  # noqa: E402
from robo_rl.policies.inference import FrozenPredictor  # noqa: E402
from robo_rl.policies.nets import encoders  # noqa: E402

LOWDIM = ObsShapes({"obs/qpos": 14, "obs/env_state": 7}, {}, 14)
IMAGES = ObsShapes({"obs/qpos": 14}, {"obs/images/top": (96, 96), "obs/images/left_wrist": (96, 96)}, 14)
PAPER = {"backbone": "unet", "down_dims": [256, 512, 1024], "image_width": 64}
CONV = {"image_encoder": "conv"}  # the small CNN per camera instead of the ResNet-18 layout
# the camera recipe of docs/results.md: the small CNN, one frame per camera, the residual MLP backbone
CAMERA_RECIPE = {"image_encoder": "conv", "n_obs": 1, "backbone": "mlp"}
DEMO_MLP = {"backbone": "mlp", "mlp_expansion": 1, "horizon": 64, "n_action_steps": 32}  # configs/demo.yaml's policy
CONFIGS = [  # label, policy, options
    ("flow DiT K=10 (default)", "flow", {}),
    ("flow U-Net K=10", "flow", {"backbone": "unet"}),
    ("diffusion DiT DDIM 10 (default)", "diffusion", {}),
    ("diffusion U-Net DDIM 10", "diffusion", {"backbone": "unet"}),
    # the two low-latency DiT variants (less accurate, see docs/results.md, "State policies")
    ("flow DiT, 2 actions per token", "flow", {"dit_patch": 2}),
    ("diffusion DiT, 2 actions per token", "diffusion", {"dit_patch": 2}),
    ("flow DiT, half-width MLP", "flow", {"dit_mlp_ratio": 2.0}),
    ("diffusion DiT, half-width MLP", "diffusion", {"dit_mlp_ratio": 2.0}),
    # task-sized backbones for low-dim tasks (pre-training to convergence on a CPU)
    ("flow DiT 64 wide, 2 blocks", "flow", {"dit_dim": 64, "dit_depth": 2}),
    ("flow DiT 128 wide, 4 blocks, 2 actions per token", "flow", {"dit_patch": 2}),
    # long chunks (PackCube's recipe): 64 actions (1.3 s) as 16 or 8 tokens
    ("flow DiT, 64-step chunks, 4 actions per token", "flow", {"horizon": 64, "dit_patch": 4, "n_action_steps": 32}),
    ("flow DiT, 64-step chunks, 8 actions per token", "flow", {"horizon": 64, "dit_patch": 8, "n_action_steps": 32}),
    ("flow DiT 96 wide, 3 blocks, 64-step chunks, 4 per token", "flow",
     {"horizon": 64, "dit_patch": 4, "n_action_steps": 32, "dit_dim": 96, "dit_depth": 3, "dit_heads": 4}),
    # the demo's policy: a residual MLP over the whole 64-step chunk
    ("flow MLP 512 wide, 3 blocks, 64-step chunks (make demo)", "flow", DEMO_MLP),
]
TASK_SIZED = [CONFIGS[0], *CONFIGS[-6:]]


def obs_window(shapes: ObsShapes, batch: int, rng: np.random.Generator, n_obs: int = 2) -> dict[str, np.ndarray]:
    out = {k: rng.standard_normal((batch, n_obs, d)).astype(np.float32) for k, d in shapes.lowdim.items()}
    out.update({k: rng.integers(0, 256, (batch, n_obs, *hw, 3), dtype=np.uint8) for k, hw in shapes.images.items()})
    return out


def train_batch(shapes: ObsShapes, batch: int, device: str, rng: np.random.Generator, horizon: int = 16,
                n_obs: int = 2) -> dict[str, torch.Tensor]:
    b = {k: torch.as_tensor(v, device=device) for k, v in obs_window(shapes, batch, rng, n_obs).items()}
    b["action"] = torch.randn(batch, horizon, 14, device=device)
    return b


def latency(policy, shapes: ObsShapes, reps: int, frozen: bool = False, steps: int | None = None) -> tuple[float, float, int]:
    """p50/p99 ms of one chunk at batch 1: eager `policy.predict`, or the traced FrozenPredictor
    that `robo-rl eval` and deployment use on a CPU; `steps`: the sampler's (default: the policy's)."""
    policy.eval()
    obs = obs_window(shapes, 1, np.random.default_rng(0), policy.config.n_obs)
    predict = FrozenPredictor(policy, steps) if frozen else (lambda window: policy.predict(window, steps=steps))
    times = []
    with torch.inference_mode(not frozen):
        for i in range(reps + 10):
            t = time.perf_counter()
            predict(obs)
            if i >= 10:
                times.append(time.perf_counter() - t)
    ms = np.asarray(times) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), sum(p.numel() for p in policy.parameters())


def eager_predict(policy, steps: int | None):
    def predict(window):
        with torch.inference_mode():
            return policy.predict(window, steps=steps)
    return predict


def interleaved_latency(calls: dict[Any, Any], obs: dict[str, np.ndarray], reps: int) -> dict[Any, np.ndarray]:
    """ms per call of each predictor, called in turn `reps` times each after 10 warm-up rounds."""
    times: dict[Any, list[float]] = {name: [] for name in calls}
    for i in range(reps + 10):
        for name, predict in calls.items():
            t = time.perf_counter()
            predict(obs)
            if i >= 10:
                times[name].append((time.perf_counter() - t) * 1e3)
    return {name: np.asarray(ms) for name, ms in times.items()}


def train_rate(policy, shapes: ObsShapes, batch: int, device: str, seconds: float, bf16: bool = False,
               compile: bool = False) -> float:
    policy.train().to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    data = train_batch(shapes, batch, device, np.random.default_rng(0), policy.config.horizon, policy.config.n_obs)
    fwd = torch.compile(policy) if compile else policy

    def step():
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(data)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):  # warm-up (and compilation)
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------- the camera recipe, before and now
CAMS3 = ObsShapes({"obs/qpos": 14}, {f"obs/images/{c}": (96, 96) for c in ("top", "left_wrist", "right_wrist")}, 14)
RECIPE = {"image_encoder": "conv", "backbone": "mlp", "n_obs": 1, "horizon": 64, "noise_samples": 4,
          "aux_chunk_weight": 1.0}  # robo_rl/learn/recipes.py's policy keys
NOW_CAMERA_FORWARD = encoders.CameraEncoder.forward


def before_camera_forward(self, frames: torch.Tensor) -> torch.Tensor:
    """CameraEncoder.forward as it was before the speed-up: frames to float first, then a random
    crop by one gather per axis on the float images, NCHW."""
    lead = frames.shape[:-3]
    x = frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)
    n, c, h, w = x.shape
    ch, cw = self.crop
    if self.training:
        top, left = torch.randint(0, h - ch + 1, (n,)), torch.randint(0, w - cw + 1, (n,))
        x = x.gather(2, (top[:, None] + torch.arange(ch))[:, None, :, None].expand(n, c, ch, w))
        x = x.gather(3, (left[:, None] + torch.arange(cw))[:, None, None, :].expand(n, c, ch, cw))
    else:
        x = x[..., (h - ch) // 2:(h - ch) // 2 + ch, (w - cw) // 2:(w - cw) // 2 + cw]
    return self.net(x).reshape(*lead, -1)


class PerStepNet(torch.nn.Module):
    """The backbone without `modulations`: the sampler then calls the whole net each step (the
    path before the MLP's FiLMs were batched over the steps)."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.inner = net

    def forward(self, x, t, cond):
        return self.inner(x, t, cond)


def camera_policy(before: bool):
    policy = make_policy("flow", RECIPE, CAMS3)
    if before:
        policy.body.net = PerStepNet(policy.body.net)
    return policy


class CameraStep:
    """One optimiser step of the camera recipe as the Learner takes it: 128 windows' frames
    gathered from a bank of frames in memory (the sampler's gather: advanced indexing before,
    index_select now), forward, backward, AdamW; the camera encoders' forward of `before` or now,
    optionally under torch.compile."""

    def __init__(self, before: bool, compiled: bool, bf16: bool, batch: dict[str, torch.Tensor],
                 bank: dict[str, torch.Tensor], jitter: tuple[float, ...] | None = None):
        torch.manual_seed(0)
        self.before, self.bf16, self.batch, self.bank = before, bf16, dict(batch), bank
        self.policy = camera_policy(before).train()
        for enc in self.policy.body.encoder.cameras.values():
            enc.jitter = tuple(jitter or (0.0,) * 4)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=1e-4, fused=True)
        self.loss_fn = torch.compile(self.policy) if compiled else self.policy
        t = time.perf_counter()
        for _ in range(3):
            self()
        self.warmup_s = time.perf_counter() - t
        bad = [n for n, p in self.policy.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # a path that trains on NaN has no step rate worth printing
            raise SystemExit(f"camera step ({'before' if before else 'now'}{', compiled' if compiled else ''}): "
                             f"non-finite weights after 3 steps, first {bad[0]}")

    def __call__(self) -> None:
        encoders.CameraEncoder.forward = before_camera_forward if self.before else NOW_CAMERA_FORWARD
        rows = torch.randint(0, next(iter(self.bank.values())).shape[0], (128, 1))
        for key, frames in self.bank.items():
            self.batch[key] = frames[rows] if self.before else frames.index_select(0, rows.reshape(-1)).view(
                128, 1, *frames.shape[1:])
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.loss_fn(self.batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        finally:
            encoders.CameraEncoder.forward = NOW_CAMERA_FORWARD


OP_KINDS = {  # the profiler's op names, by what they are in the camera recipe
    "convolutions, forward and backward": ("convolution",),
    "GroupNorm and ReLU, forward and backward": ("group_norm", "clamp_min", "threshold_backward", "relu"),
    "matrix products (backbone, heads, keypoints)": ("mm", "addmm", "bmm", "linear"),
    "sampler gather, crop and uint8 -> float": ("gather", "aten::index", "div_", "sub_"),
    "AdamW": ("adamw",),
    "everything else (casts, elementwise, autograd)": (),
}


def step_profile(step, n: int) -> dict[str, float]:
    """ms per step of each kind of op (OP_KINDS), from torch.profiler's self CPU time over n steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        kind = next((k for k, names in OP_KINDS.items() if any(name in event.key for name in names)),
                    "everything else (casts, elementwise, autograd)")
        out[kind] = out.get(kind, 0.0) + event.self_cpu_time_total / 1e3 / n
    return out


def interleaved_rates(steps: dict[str, Any], rounds: int, per_round: int) -> dict[str, list[float]]:
    """steps/s of each callable, measured in `rounds` rounds that take every callable in turn."""
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            for _ in range(per_round):
                step()
            rates[name].append(per_round / (time.perf_counter() - t))
    return rates


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def camera_tables(console, quick: bool, compiled: bool) -> None:
    from robo_rl.learn.recipes import CAMERA_RECIPE as TRAIN_RECIPE, cpu_computes_bf16

    bf16 = cpu_computes_bf16()
    threads = torch.get_num_threads()
    rng = np.random.default_rng(0)
    batch = train_batch(CAMS3, 128, "cpu", rng, horizon=64, n_obs=1)
    where = f"{cpu_kind()}, {threads} threads, {'bf16 autocast' if bf16 else 'fp32'}"

    bank = {k: torch.as_tensor(rng.integers(0, 256, (2000, 96, 96, 3), dtype=np.uint8)) for k in CAMS3.images}
    steps = {"before": CameraStep(True, False, bf16, batch, bank), "now": CameraStep(False, False, bf16, batch, bank),
             "now + colour jitter": CameraStep(False, False, bf16, batch, bank, jitter=TRAIN_RECIPE["policy.color_jitter"])}
    if compiled:
        steps["now + torch.compile"] = CameraStep(False, True, bf16, batch, bank)
        steps["now + torch.compile + colour jitter"] = CameraStep(False, True, bf16, batch, bank,
                                                                  jitter=TRAIN_RECIPE["policy.color_jitter"])
    rates = interleaved_rates(steps, rounds=3 if quick else 8, per_round=3 if quick else 5)
    base = float(np.median(rates["before"]))
    t = table(f"(t1) camera recipe training, 3 cams 96x96 + qpos, batch 128 ({where}); median of interleaved rounds",
              ["code path", "steps/s", "samples/s", "rounds (steps/s)", "vs before", "warm-up s"])
    for name, r in rates.items():
        m = float(np.median(r))
        t.add_row(name, f"{m:.2f}", f"{m * 128:.0f}", " ".join(f"{x:.1f}" for x in r), f"{m / base:.2f}x",
                  f"{steps[name].warmup_s:.1f}")
    console.print(t)

    # (t2) where the time goes: the profiler's self time of every op over real steps, by kind
    profiled = ("before", "now", "now + colour jitter")
    t = table(f"(t2) where a camera training step goes ({where}; torch.profiler, 5 steps, self time by kind of op)",
              ["kind of op", *[f"{name} ms/step" for name in profiled], "now: share"])
    shares = {name: step_profile(steps[name], 5) for name in profiled}
    total_now = sum(shares["now"].values())
    for kind in OP_KINDS:
        t.add_row(kind, *[f"{shares[name].get(kind, 0.0):.1f}" for name in profiled],
                  f"{shares['now'].get(kind, 0.0) / total_now:.0%}")
    t.add_row("all", *[f"{sum(shares[name].values()):.1f}" for name in profiled], "100%")
    console.print(t)
    idx = torch.randint(0, 2000, (128, 1))
    frames = bank["obs/images/top"]
    advanced = median_ms(lambda: frames[idx], 20)
    select = median_ms(lambda: frames.index_select(0, idx.reshape(-1)).view(128, 1, 96, 96, 3), 20)
    console.print(f"the sampler's gather of one camera's 128 frames: {advanced:.2f} ms by advanced indexing (before), "
                  f"{select:.2f} ms by index_select (now); 3 cameras a step")
    # the camera encoder's input path alone (crop, uint8 -> float, the jitter), the network left out
    crops = frames[idx.reshape(-1)][:, None]
    inputs = {}
    for jitter in ((0.0,) * 4, tuple(TRAIN_RECIPE["policy.color_jitter"])):
        enc = encoders.CameraEncoder((96, 96), 64, 8, 0.9, kind="conv", jitter=jitter).train()
        enc.net = torch.nn.Identity()
        inputs[("jitter" if any(jitter) else "no jitter", "eager")] = enc
        if compiled:
            inputs[("jitter" if any(jitter) else "no jitter", "compiled")] = torch.compile(enc)
    for fn in inputs.values():
        fn(crops)
    ms = {k: median_ms(lambda fn=fn: fn(crops), 20) for k, fn in inputs.items()}
    console.print("the camera encoder's input path (crop, to float, jitter) for one camera's 128 frames: " + ", ".join(
        f"{name} {mode} {v:.1f} ms" for (name, mode), v in ms.items()))

    # (t3) one chunk at batch 1, what ensembling asks for every tick
    t = table(f"(t3) camera recipe, one chunk at batch 1 ({cpu_kind()}); target p99 <= 10 ms on 2 AVX512-BF16 "
              f"threads, <= 20 ms on AVX2", ["code path", "threads", "flow steps", "eager p50 ms", "eager p99 ms",
                                            "frozen p50 ms", "frozen p99 ms"])
    n_calls = 30 if quick else 300
    obs = obs_window(CAMS3, 1, np.random.default_rng(0), 1)
    for n_threads in sorted({1, min(2, threads)}):
        torch.set_num_threads(n_threads)
        for k in (10, 5):
            # the four paths take turns call by call, so that the machine's drift falls on all alike
            calls = {}
            for before in (True, False):
                policy = camera_policy(before).eval()
                calls[(before, False)] = eager_predict(policy, k)
                calls[(before, True)] = FrozenPredictor(policy, k)
            times = interleaved_latency(calls, obs, n_calls)
            for before in (True, False):
                t.add_row("before (per-step FiLM)" if before else "now (FiLMs batched over the steps)", str(n_threads),
                          str(k), *[f"{np.percentile(times[(before, frozen)], q):.2f}" for frozen in (False, True)
                                    for q in (50, 99)])
    torch.set_num_threads(threads)
    console.print(t)


def camera_learner_table(console, dataset: str, rounds: int) -> None:
    """(t4) the Learner's own step on a real store with the camera recipe (sampler, loss weights,
    clipping, AdamW, EMA), eager and with learner.compile=true, in interleaved rounds of 10 steps."""
    from robo_rl.learn import Learner, LearnerConfig
    from robo_rl.learn.from_store import policy_for_store
    from robo_rl.learn.recipes import cpu_computes_bf16

    keys = ["obs/qpos", *CAMS3.images]
    learners, warmup = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("eager", "learner.compile=true"):
            torch.manual_seed(0)
            policy, sampler, _ = policy_for_store(dataset, keys, "flow", {**RECIPE, "n_action_steps": 8}, None, "cpu", None)
            cfg = LearnerConfig(steps=10**6, batch_size=128, lr=3e-4, bf16=str(cpu_computes_bf16()).lower(),
                                compile="true" if name != "eager" else "false", checkpoint_every=0)
            learners[name] = Learner(policy, cfg, Path(tmp) / name, (lambda s: lambda bs, g, w: s.sample(bs, g, w))(sampler),
                                     progress=False)
            t = time.perf_counter()
            for _ in range(5):
                learners[name]._step()
            warmup[name] = time.perf_counter() - t
        rates = interleaved_rates({name: learner._step for name, learner in learners.items()}, rounds, 10)
        finite = {name: bool(all(torch.isfinite(p).all() for p in learner.model.parameters()))
                  for name, learner in learners.items()}
    base = float(np.median(rates["eager"]))
    t = table(f"(t4) the Learner's step on {dataset}, camera recipe, batch 128 ({cpu_kind()}, {torch.get_num_threads()} "
              f"threads); median of {rounds} interleaved rounds of 10 steps",
              ["path", "steps/s", "rounds (steps/s)", "vs eager", "first 5 steps s", "finite, compiled as asked"])
    for name, r in rates.items():
        m = float(np.median(r))
        t.add_row(name, f"{m:.2f}", " ".join(f"{x:.2f}" for x in r), f"{m / base:.2f}x", f"{warmup[name]:.1f}",
                  str(finite[name] and learners[name].compiled == (name != "eager")))
    console.print(t)


def learner_rate(cuda_graph: str, bf16: str, seconds: float) -> tuple[float, float]:
    """Steps/s of the Learner (sampler on the GPU, loss, backward, clip, AdamW, EMA) on the demo's
    policy over a synthetic store of PackCube's sizes, after 50 warm-up steps."""

    from robo_rl.data.sampler import WindowSampler
    from robo_rl.data.schema import EpisodeMeta, Schema
    from robo_rl.data.store import EpisodeStore
    from robo_rl.learn import Learner, LearnerConfig

    with tempfile.TemporaryDirectory() as tmp:
        store = EpisodeStore.create(Path(tmp) / "store", Schema.build(
            {"obs/qpos": ((14,), "float32"), "obs/env_state": ((7,), "float32"), "action": ((14,), "float32")},
            fps=50, robot="aloha"))
        rng = np.random.default_rng(0)
        for _ in range(20):
            store.add_episode({k: rng.standard_normal((750, n)).astype(np.float32)
                               for k, n in (("obs/qpos", 14), ("obs/env_state", 7), ("action", 14))},
                              np.arange(750) / 50.0, meta=EpisodeMeta(task="synthetic", success=True))
        torch.manual_seed(0)
        policy = make_policy("flow", DEMO_MLP, LOWDIM)
        sampler = WindowSampler(store, ["obs/qpos", "obs/env_state"], n_obs=policy.config.n_obs,
                                horizon=policy.config.horizon, device="cuda")
        cfg = LearnerConfig(steps=10**9, batch_size=256, lr=3e-4, warmup_steps=10, checkpoint_every=0,
                            device="cuda", cuda_graph=cuda_graph, bf16=bf16)
        learner = Learner(policy, cfg, Path(tmp) / "run", lambda bs, g, w: sampler.sample(bs, g, w), progress=False)
        for _ in range(50):
            learner._step()
        torch.cuda.synchronize()
        losses, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                losses.append(learner._step())
            torch.cuda.synchronize()
        rate = len(losses) / (time.perf_counter() - t0)
        return rate, float(torch.stack(losses[-100:]).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, shorter timings")
    ap.add_argument("--only", choices=["latency", "train", "cameras", "gpu"])  # cameras: the camera recipe before and now
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--learner-only", action="store_true", help="GPU: only the Learner rows (no torch.compile)")
    ap.add_argument("--compile", action="store_true", help="cameras: add a torch.compile row (~40 s to compile)")
    ap.add_argument("--dataset", help="cameras: also time the Learner itself on this store of 3-camera demos, eager "
                                      "and compiled (e.g. data/demos/transfer_cube_cams)")
    args = ap.parse_args()
    reps = 30 if args.quick else args.reps
    seconds = 3.0 if args.quick else 10.0
    console = make_console()
    threads = torch.get_num_threads()
    torch.manual_seed(0)

    if args.only in (None, "latency"):
        torch.set_num_threads(1)
        t = table(f"(a) CPU latency per chunk, batch 1, 1 thread ({reps} calls)",
                  ["policy", "observations", "params", "eager p50 ms", "eager p99 ms", "frozen p50 ms",
                   "frozen p99 ms", "target p99 (frozen)"])
        for obs_label, shapes, target in (("low-dim", LOWDIM, 5), ("2 cams 96x96", IMAGES, 30)):
            image_rows = [*CONFIGS[:4], ("flow DiT K=10, conv camera encoder", "flow", CONV),
                          ("flow MLP K=10, conv, 1 frame (camera recipe)", "flow", CAMERA_RECIPE)]
            for label, name, opts in CONFIGS if obs_label == "low-dim" else image_rows:
                policy = make_policy(name, opts, shapes)
                p50, p99, n = latency(policy, shapes, reps)
                f50, f99, _ = latency(policy, shapes, reps, frozen=True)
                goal = 12 if opts is CAMERA_RECIPE else target
                t.add_row(label, obs_label, f"{n / 1e6:.2f}M", f"{p50:.2f}", f"{p99:.2f}", f"{f50:.2f}", f"{f99:.2f}",
                          f"<= {goal} {'ok' if f99 <= goal else 'MISSED'}")
            p50, p99, n = latency(make_policy("diffusion", PAPER, shapes), shapes, max(10, reps // 10))
            t.add_row("baseline: diffusion_policy sizes, DDIM 10", obs_label, f"{n / 1e6:.1f}M", f"{p50:.1f}",
                      f"{p99:.1f}", "", "", "")
        t.add_row("quoted: LeRobot ACT", "images", "", "37", "", "", "", "")
        t.add_row("quoted: LeRobot diffusion, DDIM 10", "images", "", "1800", "", "", "", "")
        console.print(t)
        torch.set_num_threads(threads)

    flags = cpu_flags()
    if args.only in (None, "train"):
        t = table(f"(b) CPU training steps/s ({threads} threads)", ["policy", "observations", "batch", "steps/s",
                                                                    "samples/s"])
        for obs_label, shapes, batches in (("low-dim", LOWDIM, (64, 256)), ("2 cams 96x96", IMAGES, (64,))):
            for label, name, opts in CONFIGS[:2]:
                for b in batches:
                    r = train_rate(make_policy(name, opts, shapes), shapes, b, "cpu", seconds)
                    t.add_row(label.split(" K=")[0].split(" DDIM")[0], obs_label, str(b), f"{r:.1f}", f"{r * b:.0f}")
        console.print(t)
    if args.only in (None, "cameras"):
        camera_tables(console, args.quick, args.compile)
        if args.dataset:
            camera_learner_table(console, args.dataset, rounds=3 if args.quick else 8)
    if args.only in (None, "train"):
        t = table(f"(b3) camera policies: flow, 2 cams 96x96 + qpos, batch 128 ({threads} threads; CPU "
                  f"{'has' if 'avx512_bf16' in flags else 'lacks'} AVX512-BF16)",
                  ["camera encoder, backbone, frames per window", "params", "fp32 steps/s", "bf16 autocast steps/s",
                   "best vs the default"])
        base = None
        for label, opts in (("resnet18 width 32, DiT, 2 frames (default)", {}), ("conv 16-32-64-64, DiT, 2 frames", CONV),
                            ("conv, DiT, 1 frame", {**CONV, "n_obs": 1}),
                            ("conv, MLP, 1 frame (camera recipe)", CAMERA_RECIPE)):
            policy = make_policy("flow", opts, IMAGES)
            n = sum(p.numel() for p in policy.parameters())
            r32 = train_rate(policy, IMAGES, 128, "cpu", seconds)
            r16 = train_rate(make_policy("flow", opts, IMAGES), IMAGES, 128, "cpu", seconds, bf16=True)
            base = base or max(r32, r16)
            t.add_row(label, f"{n / 1e6:.2f}M", f"{r32:.1f}", f"{r16:.1f}", f"{max(r32, r16) / base:.1f}x")
        console.print(t)
    if args.only in (None, "train"):
        t = table(f"(b2) task-sized low-dim backbones, batch 128 ({threads} threads; CPU "
                  f"{'has' if 'avx512_bf16' in flags else 'lacks'} AVX512-BF16)",
                  ["policy", "params", "fp32 steps/s", "bf16 autocast steps/s", "fp32 + torch.compile steps/s",
                   "fp32 vs default DiT"])
        base = None
        for label, name, opts in TASK_SIZED:
            policy = make_policy(name, opts, LOWDIM)
            n = sum(p.numel() for p in policy.parameters())
            r32 = train_rate(policy, LOWDIM, 128, "cpu", seconds)
            r16 = train_rate(make_policy(name, opts, LOWDIM), LOWDIM, 128, "cpu", seconds, bf16=True)
            rc = train_rate(make_policy(name, opts, LOWDIM), LOWDIM, 128, "cpu", seconds, compile=True)
            base = base or r32
            t.add_row(label.split(" K=")[0], f"{n / 1e6:.2f}M", f"{r32:.1f}", f"{r16:.1f}", f"{rc:.1f}",
                      f"{r32 / base:.1f}x")
        console.print(t)

    if args.only in (None, "gpu"):
        if not torch.cuda.is_available():
            console.print("(c) GPU: no CUDA device here; run this script on a GPU machine for the GPU table.")
            return
        t = table(f"(c1) GPU: the Learner on the demo's MLP policy, batch 256 ({torch.cuda.get_device_name()})",
                  ["mode", "steps/s", "samples/s", "vs eager fp32", "mean loss, last 100 steps"])
        base = None
        for graph in ("false", "true"):
            for bf16 in ("false", "true"):
                rate, loss = learner_rate(graph, bf16, seconds)
                base = base or rate
                t.add_row(f"{'CUDA graph' if graph == 'true' else 'eager'} {'bf16' if bf16 == 'true' else 'fp32'}",
                          f"{rate:.0f}", f"{rate * 256:.0f}", f"{rate / base:.1f}x", f"{loss:.4f}")
        console.print(t)
        if args.learner_only:
            return
        t = table(f"(c2) GPU training at batch 256 ({torch.cuda.get_device_name()})",
                  ["policy", "observations", "mode", "steps/s", "samples/s"])
        for obs_label, shapes in (("low-dim", LOWDIM), ("2 cams 96x96", IMAGES)):
            for label, name, opts in CONFIGS[:2]:
                for mode, bf16, comp in (("fp32 eager", False, False), ("bf16 eager", True, False),
                                         ("fp32 compile", False, True), ("bf16 compile", True, True)):
                    r = train_rate(make_policy(name, opts, shapes), shapes, 256, "cuda", seconds, bf16, comp)
                    t.add_row(label, obs_label, mode, f"{r:.1f}", f"{r * 256:.0f}")
        console.print(t)


if __name__ == "__main__":
    main()
