"""Offline-RL benchmark: updates/s of floq, FQL and SHARSA at their default sizes.

(a) CPU, all threads (2 on the dev box): one full update (critic + actor + Polyak) on a batch from
    a device replay, OGBench cube-single shapes (obs 28, action 5; SHARSA: goal 3, a cube
    position). Each agent in float32; FQL and floq also with their no-grad passes (the BC-flow
    teacher, floq's read-outs) in bf16; and every agent in bf16 throughout (mixed-precision
    gradient step, grad_dtype=bfloat16, plus the bf16 no-grad passes). For scale, the JAX references on a 2-core machine: FQL 11.4, floq (K = 8,
    R = 8) 2.0, SHARSA (batch 1024, 4x1024) 1.25 updates/s; targets: FQL and SHARSA at least as
    fast, floq at least twice as fast.
(b) Baseline measured in the same run: floq's read-out (the no-grad integrations that dominate
    an update) as one batched network over ensemble x noise copies, against a Python loop over
    members and copies with the same weights.
(c) GPU (only when CUDA is available): the same updates in float32, with bf16 no-grad passes, in
    bf16 throughout, and with torch.compile of the loss functions (mode max-autotune: CUDA graphs).

    python bench/rl.py [--seconds 20] [--only cpu|loop|gpu] [--agents floq,fql,sharsa]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import make_console, table  # noqa: E402

OBS, ACT, GOAL = 28, 5, 3
JAX_REFERENCE = {"fql": 11.4, "floq": 2.0, "sharsa": 1.25}


def synthetic_replay(device: str, n: int = 20_000, seed: int = 0):
    from robo_rl.rl.replay import DeviceReplay

    rng = np.random.default_rng(seed)
    return DeviceReplay({"observations": rng.standard_normal((n, OBS), np.float32),
                         "actions": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
                         "next_observations": rng.standard_normal((n, OBS), np.float32),
                         "rewards": -(rng.random(n) < 0.9).astype(np.float32),
                         "masks": np.ones(n, np.float32)}, device, seed)


def goal_replay_synthetic(device: str, n: int = 20_000, seed: int = 0):
    from robo_rl.rl.sharsa import goal_replay

    rng = np.random.default_rng(seed)
    terminals = np.zeros(n, bool)
    terminals[999::1000] = True
    return goal_replay({"observations": rng.standard_normal((n, OBS), np.float32),
                        "actions": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
                        "terminals": terminals, "oracle_reps": rng.standard_normal((n, GOAL), np.float32)}, device, seed)


def make(name: str, device: str, **overrides):
    if name.startswith("floq"):
        from robo_rl.rl.floq import Floq, FloqConfig

        agent, replay = Floq(OBS, ACT, FloqConfig(**overrides)), synthetic_replay(device)
        return agent.to(device), (lambda: replay.sample(agent.config.batch_size)), agent, replay
    if name == "fql":
        from robo_rl.rl.fql import FQL, FQLConfig

        agent, replay = FQL(OBS, ACT, FQLConfig(**overrides)), synthetic_replay(device)
        return agent.to(device), (lambda: replay.sample(agent.config.batch_size)), agent, replay
    from robo_rl.rl.sharsa import Sharsa, SharsaConfig, sample_batch

    agent, replay = Sharsa(OBS, ACT, GOAL, SharsaConfig(**overrides)), goal_replay_synthetic(device)
    return agent.to(device), (lambda: sample_batch(replay, agent.config.batch_size, agent.config)), agent, replay


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def updates_per_s(agent, sample, device: str, seconds: float, warmup: int = 2) -> tuple[float, int]:
    agent.generator = None
    for _ in range(warmup):
        agent.update(sample())
    sync(device)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or n < 3:
        agent.update(sample())
        n += 1
    sync(device)
    return n / (time.perf_counter() - t0), n


def cpu_part(console, agents: list[str], seconds: float) -> None:
    t = table(f"(a) updates/s on CPU ({torch.get_num_threads()} threads), default sizes",
              ["agent", "updates/s", "updates timed", "JAX reference", "ratio"])
    bf16 = {"nograd_dtype": "bfloat16"}
    mixed = {"nograd_dtype": "bfloat16", "grad_dtype": "bfloat16"}
    rows = [("fql", "fql (float32)", {}), ("fql", "fql (bf16 no-grad passes)", bf16),
            ("fql", "fql (bf16 throughout: + mixed-precision grads)", mixed),
            ("floq", "floq (K=8, R=8, float32)", {}), ("floq", "floq (K=8, R=8, bf16 no-grad passes)", bf16),
            ("floq", "floq (K=8, R=8, bf16 throughout)", mixed),
            ("sharsa", "sharsa (batch 1024, 4x1024, float32)", {}),
            ("sharsa", "sharsa (batch 1024, 4x1024, mixed-precision grads)", {"grad_dtype": "bfloat16"})]
    for name, label, over in rows:
        if name not in agents:
            continue
        agent, sample, *_ = make(name, "cpu", **over)
        rate, n = updates_per_s(agent, sample, "cpu", seconds)
        ref = JAX_REFERENCE[name]
        t.add_row(label, f"{rate:.2f}", str(n), f"{ref}", f"{rate / ref:.2f}x")
        del agent
    console.print(t)


def loop_part(console, seconds: float) -> None:
    """floq's read-outs batched (one network over E x B*R rows) vs a loop over members and copies."""
    from robo_rl.rl.floq import Floq, FloqConfig

    agent = Floq(OBS, ACT, FloqConfig())
    cfg, field = agent.config, agent.target_floq
    B, R, E, K = cfg.batch_size, cfg.noise_copies, cfg.ensemble, cfg.critic_steps
    sa = torch.randn(B * R, OBS + ACT)
    z0 = agent.sample_z0(B * R, "cpu")

    def batched():
        with torch.no_grad():
            return field.read_out(sa, z0, K)

    def looped():  # one call per member and noise copy, each over B rows, same weights
        out = torch.empty(E, B * R)
        with torch.no_grad():
            for e in range(E):
                for j in range(R):
                    rows = slice(j * B, (j + 1) * B)
                    z = z0[rows].clone()
                    for i in range(K):
                        x = field.inputs(sa[rows], z.unsqueeze(0).expand(E, -1), torch.full_like(z, i / K))[e:e + 1]
                        h = x
                        for lin, norm in zip(field.field.linears[:-1], field.field.norms):
                            h = torch.nn.functional.gelu(torch.baddbmm(lin.bias[e:e + 1], h, lin.weight[e:e + 1]),
                                                         approximate="tanh")
                            h = torch.nn.functional.layer_norm(h, h.shape[-1:], eps=1e-6) * norm.scale[e:e + 1] + norm.offset[e:e + 1]
                        last = field.field.linears[-1]
                        z = z + torch.baddbmm(last.bias[e:e + 1], h, last.weight[e:e + 1])[0, :, 0] / K
                    out[e, rows] = z
        return out

    ref = batched()
    same = torch.allclose(looped(), ref, atol=1e-3)

    def rate(fn):
        fn()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / 2 or n < 2:
            fn()
            n += 1
        return (time.perf_counter() - t0) / n * 1000

    tb, tl = rate(batched), rate(looped)
    t = table(f"(b) floq read-out, {E} members x {R} copies x batch {B}, K = {K} (one of the two per update)",
              ["implementation", "ms per read-out", "speed-up"])
    t.add_row("loop over members and copies (baseline)", f"{tl:.1f}", "1.00x")
    t.add_row("one batched network (ours)", f"{tb:.1f}", f"{tl / tb:.2f}x")
    console.print(t)
    console.print(f"same values: {same}")


def gpu_part(console, agents: list[str], seconds: float) -> None:
    if not torch.cuda.is_available():
        console.print("(c) GPU: CUDA not available here; skipped")
        return
    t = table(f"(c) updates/s on {torch.cuda.get_device_name()}",
              ["agent", "float32", "bf16 no-grad passes", "bf16 throughout", "torch.compile (float32)"])
    for name in agents:
        bf16 = "-"
        if name != "sharsa":
            low, low_sample, *_ = make(name, "cuda", nograd_dtype="bfloat16")
            bf16 = f"{updates_per_s(low, low_sample, 'cuda', seconds)[0]:.1f}"
            del low
        mixed = {"grad_dtype": "bfloat16"} if name == "sharsa" else {"grad_dtype": "bfloat16", "nograd_dtype": "bfloat16"}
        low, low_sample, *_ = make(name, "cuda", **mixed)
        all_bf16 = f"{updates_per_s(low, low_sample, 'cuda', seconds)[0]:.1f}"
        del low
        agent, sample, *_ = make(name, "cuda")
        base, _ = updates_per_s(agent, sample, "cuda", seconds)
        try:
            for fn in ("critic_loss", "actor_loss"):
                setattr(agent, fn, torch.compile(getattr(agent, fn), mode="max-autotune"))
            compiled = f"{updates_per_s(agent, sample, 'cuda', seconds, warmup=5)[0]:.1f}"
        except Exception as e:  # report, do not hide, a compile failure
            compiled = f"failed: {type(e).__name__}"
        t.add_row(name, f"{base:.1f}", bf16, all_bf16, compiled)
        del agent
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="timed seconds per configuration")
    ap.add_argument("--only", choices=["cpu", "loop", "gpu"])
    ap.add_argument("--agents", default="floq,fql,sharsa")
    args = ap.parse_args()
    agents = args.agents.split(",")
    console = make_console()
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    if args.only in (None, "cpu"):
        cpu_part(console, agents, args.seconds)
    if args.only in (None, "loop"):
        loop_part(console, args.seconds)
    if args.only in (None, "gpu"):
        gpu_part(console, agents, args.seconds)


if __name__ == "__main__":
    main()
