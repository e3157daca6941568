"""LeRobot's ACT, run inside LeRobot's own venv for bench/peer_act.py.

This file imports lerobot and torch only, never robo_rl: it is run by the peer venv's python.

    python peer_act_worker.py train --data DATASET --out RUN --minutes 15 30 [--threads 1]
    python peer_act_worker.py serve --data DATASET --checkpoint RUN/15min [--threads 1]

train: ACT as LeRobot ships it (ACTConfig defaults: chunk 100, ResNet-18, dim 512, 4 encoder and
1 decoder layers, VAE with KL weight 10, AdamW lr 1e-5 for all weights, weight decay 1e-4, gradient
clip 10; LeRobot's training batch size of 8; no image augmentation), the inputs the camera policy
reads: `observation.state` and the three cameras. One change: no ImageNet weights can be
downloaded here, so the ResNet-18 starts from scratch (`pretrained_backbone_weights=None`).
The learning rate is constant (ACT has no schedule), so the checkpoint written when M minutes of
training have passed is what an M-minute run would end with: one run gives every budget's point.
Frames are decoded from the dataset's videos once, into memory, before the clock starts (what a
DataLoader with workers would hide on a many-core machine); sampling follows LeRobotDataset's:
an index uniformly over all frames, its action chunk padded past the episode's end with
`action_is_pad`.

serve: loads a checkpoint, then answers on stdin/stdout: each request is one `np.savez` of arrays (`observation.state` (B, 14) float32, `observation.images.<cam>` (B, H, W, 3) uint8),
the reply (`np.save`) the un-normalised action chunks (B, 100, 14) float32, both length-prefixed (8 bytes).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

CAMERAS = ("top", "left_wrist", "right_wrist")
STATE = "observation.state"


def input_keys() -> list[str]:
    return [STATE] + [f"observation.images.{c}" for c in CAMERAS]


def load_meta(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    return LeRobotDatasetMetadata(f"robo_rl/{root.name}", root=root)


def act_config(meta):
    """LeRobot's ACTConfig with its defaults, for our inputs, backbone from scratch."""
    from lerobot.configs.types import FeatureType
    from lerobot.datasets.utils import dataset_to_policy_features
    from lerobot.policies.act.configuration_act import ACTConfig

    features = dataset_to_policy_features(meta.features)
    inputs = {k: features[k] for k in input_keys()}
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    return ACTConfig(input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None)


def processors(config, meta):
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    stats = {k: {s: torch.as_tensor(np.asarray(v), dtype=torch.float32) for s, v in d.items()}
             for k, d in meta.stats.items() if k in {*input_keys(), "action"}}
    return make_act_pre_post_processors(config, dataset_stats=stats)


def load_frames(root: Path, meta) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Every frame of every episode, in memory: columns (N, ...) and episode bounds (E, 2)."""
    import pyarrow.parquet as pq
    from lerobot.datasets.video_utils import decode_video_frames

    table = pq.read_table(sorted((root / "data").rglob("*.parquet")))
    order = np.argsort(table.column("index").to_numpy())
    cols = {k: np.stack(table.column(k).to_numpy(zero_copy_only=False))[order].astype(np.float32) for k in (STATE, "action")}
    episode = table.column("episode_index").to_numpy()[order]
    bounds = []
    for e in range(meta.total_episodes):
        idx = np.flatnonzero(episode == e)
        bounds.append((idx[0], idx[-1] + 1))
    fps = meta.fps
    for cam in CAMERAS:
        key = f"observation.images.{cam}"
        frames = []
        for e, (a, b) in enumerate(bounds):
            start = float(meta.episodes[e][f"videos/{key}/from_timestamp"])
            ts = [start + k / fps for k in range(b - a)]
            decoded = decode_video_frames(root / meta.get_video_file_path(e, key), ts, 1e-4, backend="pyav")
            frames.append((decoded.clamp(0, 1) * 255).round().to(torch.uint8).numpy())  # (T, 3, H, W)
        cols[key] = np.concatenate(frames)
    return cols, np.asarray(bounds), episode


def sample(cols, bounds, episode, rng: np.random.Generator, batch: int, chunk: int) -> dict[str, torch.Tensor]:
    i = rng.integers(0, len(episode), batch)
    end = bounds[episode[i], 1]
    steps = i[:, None] + np.arange(chunk)[None]
    pad = steps >= end[:, None]
    steps = np.minimum(steps, end[:, None] - 1)
    out = {STATE: torch.from_numpy(cols[STATE][i]), "action": torch.from_numpy(cols["action"][steps]),
           "action_is_pad": torch.from_numpy(pad)}
    for cam in CAMERAS:
        key = f"observation.images.{cam}"
        out[key] = torch.from_numpy(cols[key][i]).float() / 255
    return out


def train(args) -> None:
    from lerobot.policies.act.modeling_act import ACTPolicy

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    root = Path(args.data)
    meta = load_meta(root)
    t = time.perf_counter()
    cols, bounds, episode = load_frames(root, meta)
    print(f"decoded {len(episode)} frames x {len(CAMERAS)} cameras in {time.perf_counter() - t:.0f} s", flush=True)
    config = act_config(meta)
    policy = ACTPolicy(config)
    preprocessor, _ = processors(config, meta)
    optim_cfg = config.get_optimizer_preset()
    optimizer = optim_cfg.build(policy.get_optim_params())
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budgets = sorted(args.minutes)
    log = open(out / "metrics.jsonl", "a")
    policy.train()
    step, t0 = 0, time.perf_counter()
    while budgets:
        batch = preprocessor(sample(cols, bounds, episode, rng, args.batch_size, config.chunk_size))
        loss, parts = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), optim_cfg.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        elapsed = time.perf_counter() - t0
        if step % 50 == 0:
            log.write(json.dumps({"step": step, "time_s": round(elapsed, 1), "loss": loss.item(),
                                  **{k: float(v) for k, v in parts.items()}}) + "\n")
            log.flush()
            print(f"step {step} {elapsed / 60:.1f} min loss {loss.item():.3f}", flush=True)
        if elapsed >= budgets[0] * 60:
            ckpt = out / f"{budgets.pop(0):g}min"
            policy.save_pretrained(ckpt)
            (ckpt / "trained.json").write_text(json.dumps({"steps": step, "train_s": round(elapsed, 1),
                                                           "batch_size": args.batch_size, "threads": args.threads}))
            print(f"checkpoint {ckpt} at step {step}", flush=True)


def read_msg(stream) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    return stream.read(struct.unpack("<Q", head)[0])


def write_msg(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


@torch.no_grad()
def serve(args) -> None:
    # replies go to the real stdout; anything printed, by us, lerobot or C code, goes to stderr
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from lerobot.policies.act.modeling_act import ACTPolicy

    torch.set_num_threads(args.threads)
    root = Path(args.data)
    meta = load_meta(root)
    policy = ACTPolicy.from_pretrained(args.checkpoint)
    policy.eval()
    preprocessor, postprocessor = processors(policy.config, meta)
    stdin = sys.stdin.buffer
    write_msg(stdout, b"ready")
    while (msg := read_msg(stdin)) is not None:
        obs = np.load(io.BytesIO(msg))
        batch = {STATE: torch.from_numpy(obs[STATE]).float()}
        for cam in CAMERAS:
            key = f"observation.images.{cam}"
            batch[key] = torch.from_numpy(obs[key]).permute(0, 3, 1, 2).float() / 255
        chunk = postprocessor(policy.predict_action_chunk(preprocessor(batch)))
        buf = io.BytesIO()
        np.save(buf, chunk.numpy().astype(np.float32))
        write_msg(stdout, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--minutes", nargs="+", type=float, required=True)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("serve")
    s.add_argument("--data", required=True)
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    train(args) if args.cmd == "train" else serve(args)


if __name__ == "__main__":
    main()
