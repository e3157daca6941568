"""Policies, the Learner and chunk execution: shapes, normalisation, losses that fall, a policy
that overfits one twin demo and replays it, exact resume, and checkpoints that survive SIGKILL."""

from __future__ import annotations

import json
import os
import math
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
import yaml
from conftest import robo_rl_in_process

from robo_rl.data.sampler import WindowSampler
from robo_rl.data.schema import EpisodeMeta, Schema
from robo_rl.data.stats import get_stats
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError
from robo_rl.learn import Learner, LearnerConfig, warmup_cosine
from robo_rl.policies import ObsShapes, load_policy, make_policy, policy_spec
from robo_rl.policies.body import TensorNormalizer, weighted_mean
from robo_rl.policies.nets.encoders import ResNet18GN, random_crop
from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig
from robo_rl.sim.rollout import wilson_interval

TESTS = Path(__file__).parent
ROOT = TESTS.parent
TINY = {"backbone": "unet", "down_dims": [16, 32], "obs_dim": 32, "horizon": 8, "n_action_steps": 4}
TINY_MLP = {"backbone": "mlp", "mlp_width": 32, "mlp_depth": 2, "obs_dim": 32, "horizon": 8, "n_action_steps": 4}
TINY_CONV = {"image_encoder": "conv", "conv_channels": [4, 8, 8], "image_feature_dim": 8}  # the small CNN for cameras
TINY_DIT = {"backbone": "transformer", "dit_dim": 32, "dit_depth": 2, "dit_heads": 2, "obs_dim": 32, "horizon": 8,
            "n_action_steps": 4}


def smooth_store(path: Path, n_episodes: int = 4, length: int = 60, images: bool = False, side: int = 24) -> EpisodeStore:
    """Episodes where the action is a smooth function of the observation (learnable in seconds)."""
    keys = {"obs/qpos": ((3,), "float32"), "action": ((2,), "float32")}
    if images:
        keys["obs/images/top"] = ((side, side, 3), "uint8")
    store = EpisodeStore.create(path, Schema.build(keys, fps=50, robot="toy"))
    for e in range(n_episodes):
        t = np.linspace(0, 1, length, dtype=np.float32)
        phase = 0.3 * e
        qpos = np.stack([np.sin(2 * t + phase), np.cos(2 * t + phase), t], -1).astype(np.float32)
        data = {"obs/qpos": qpos, "action": np.stack([10 + 5 * np.sin(2 * t + phase + 0.1), -3 * t], -1).astype(np.float32)}
        if images:
            data["obs/images/top"] = np.broadcast_to((qpos[:, :1, None, None] * 100 + 120).astype(np.uint8),
                                                     (length, side, side, 3)).copy()
        store.add_episode(data, np.arange(length) / 50, "TELEOP", EpisodeMeta(task="toy"))
    return store


def tiny_setup(tmp_path, name="flow", options=TINY, images=False):
    store = smooth_store(tmp_path / "store", images=images)
    keys = ["obs/qpos"] + (["obs/images/top"] if images else [])
    shapes = ObsShapes.from_schema(store.schema, keys)
    stats = get_stats(store, ["obs/qpos", "action"], save=False)
    policy = make_policy(name, options, shapes, stats)
    sampler = WindowSampler(store, keys, n_obs=policy.config.n_obs, horizon=policy.config.horizon, device="cpu")
    return store, policy, sampler


# --------------------------------------------------------------------------- shapes and normalisation
@pytest.mark.parametrize("name", ["flow", "diffusion"])
@pytest.mark.parametrize("options", [TINY, TINY_DIT, TINY_MLP], ids=["unet", "dit", "mlp"])
def test_predict_shapes_and_raw_units(tmp_path, name, options):
    store, policy, sampler = tiny_setup(tmp_path, name, options)
    batch = sampler.sample(5, torch.Generator().manual_seed(0))
    assert policy.loss(batch).ndim == 0
    chunk = policy.eval().predict({"obs/qpos": batch["obs/qpos"].numpy()})
    assert chunk.shape == (5, 8, 2) and chunk.dtype == np.float32
    # An untrained policy's normalised output lies near [-1, 1]; in raw units the first action
    # dimension is therefore centred on the data's centre (10), not on 0.
    assert 0 < np.median(chunk[..., 0]) < 20


def test_normaliser_round_trip_and_state_dict_carries_stats(tmp_path):
    store, policy, _ = tiny_setup(tmp_path)
    stats = get_stats(store, ["action"], save=False)["action"]
    norm = TensorNormalizer(2, stats, "minmax")
    x = torch.tensor(np.asarray([stats["min"], stats["max"]], dtype=np.float32))
    assert torch.allclose(norm.normalize(x), torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-5)
    y = torch.randn(7, 2)
    assert torch.allclose(norm.unnormalize(norm.normalize(y)), y, atol=1e-5)
    sd = policy.state_dict()
    assert {"body.action_norm.offset", "body.action_norm.scale", "body.norms.obs__qpos.offset"} <= set(sd)
    rebuilt = make_policy("flow", policy_spec(policy)["config"], ObsShapes.from_dict(policy_spec(policy)["shapes"]))
    rebuilt.load_state_dict(sd)
    assert torch.equal(rebuilt.body.action_norm.scale, policy.body.action_norm.scale)


def test_retraining_from_scratch_keeps_only_the_normalisation(tmp_path):
    """RaC's retrain (robo_rl.rac.finetune.fresh_like): the same architecture with fresh weights,
    seeded, and the trained policy's normalisation, so intervention stores scale as the demos did."""
    from robo_rl.policies.body import TensorNormalizer
    from robo_rl.rac.finetune import fresh_like

    _, trained, _ = tiny_setup(tmp_path, "flow", TINY_MLP)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # stands in for training
    fresh, again = fresh_like(trained, seed=3), fresh_like(trained, seed=3)
    mine, theirs = fresh.state_dict(), trained.state_dict()
    assert mine.keys() == theirs.keys()
    norm_keys = {f"{name}.{b}" for name, m in fresh.named_modules() if isinstance(m, TensorNormalizer) for b in ("offset", "scale")}
    assert norm_keys and all(torch.equal(mine[k], theirs[k]) for k in norm_keys)
    assert not any(torch.equal(mine[k], theirs[k]) for k in mine if k not in norm_keys and theirs[k].dtype.is_floating_point
                   and theirs[k].numel() > 1 and k.endswith("weight"))
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in mine.items())  # seeded


def test_observation_span_floor_keeps_still_dims_from_blowing_up():
    """A dimension that barely moved in the demos (span 0.003) must not be scaled by ~700: with the
    floor, a 0.01 deviation at run time stays a small normalised input."""
    stats = {"min": [0.0, -1.0], "max": [0.003, 1.0], "mean": [0.0015, 0.0], "std": [0.001, 0.5],
             "p01": [0.0, -1.0], "p99": [0.003, 1.0]}
    raw = TensorNormalizer(2, stats, "minmax")
    floored = TensorNormalizer(2, stats, "minmax", min_span=0.05)
    x = torch.tensor([[0.0115, 1.0]])
    assert raw.normalize(x)[0, 0] > 6  # what the floor prevents
    assert abs(float(floored.normalize(x)[0, 0])) < 0.5
    assert float(floored.normalize(x)[0, 1]) == pytest.approx(1.0)  # wide dims are untouched
    assert torch.allclose(floored.unnormalize(floored.normalize(x)), x, atol=1e-6)


@pytest.mark.parametrize("name", ["flow", "diffusion"])
@pytest.mark.parametrize("options", [TINY, TINY_DIT, {**TINY_DIT, "dit_patch": 2}, TINY_MLP, {**TINY_MLP, **TINY_CONV}],
                         ids=["unet", "dit", "dit-patch2", "mlp", "mlp-conv-encoder"])
def test_frozen_predictor_matches_eager(tmp_path, name, options):
    """The traced, frozen sampler gives the eager policy's chunks for the same noise, at more than
    one batch size; a batch smaller than a built graph is padded into it, not traced again."""
    from robo_rl.policies.inference import FrozenPredictor

    _, policy, sampler = tiny_setup(tmp_path, name, options, images=True)
    policy.eval()
    frozen = FrozenPredictor(policy)
    for b in (3, 1, 2):
        batch = sampler.sample(b, torch.Generator().manual_seed(b))
        window = {k: batch[k].numpy() for k in ("obs/qpos", "obs/images/top")}
        torch.manual_seed(7)
        fast = frozen(window)
        torch.manual_seed(7)
        noise = torch.randn(b, policy.config.horizon, policy.shapes.action_dim)
        with torch.no_grad():
            cond = policy.body.encode(policy.body.obs_from_window(window))
            eager = policy.body.action_norm.unnormalize(policy.sample(cond, None, noise)).numpy()
        assert fast.shape == (b, 8, 2)
        np.testing.assert_allclose(fast, eager, rtol=1e-4, atol=1e-4)
    assert list(frozen.graphs) == [3]


@pytest.mark.slow  # about 40 s of compilation on a cold cache
def test_a_compiled_training_step_matches_the_eager_one(tmp_path):
    """learner.compile=true gives the eager step's loss and gradients (fp32, inductor told to draw
    the crops, flow times and noise from eager's generator: rtol 1e-4)."""
    import torch._inductor.config as inductor

    _, policy, sampler = tiny_setup(tmp_path, "flow", {**TINY_MLP, **TINY_CONV, "noise_samples": 2, "aux_chunk_weight": 1.0},
                                    images=True)
    batch = sampler.sample(6, torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    grads = {}
    with inductor.patch(fallback_random=True):
        for name, model in (("eager", policy), ("compiled", torch.compile(policy))):
            torch.manual_seed(3)
            policy.zero_grad(set_to_none=True)
            loss = model(batch, batch["weight"])
            loss.backward()
            grads[name] = (float(loss.detach()), [p.grad.clone() for p in policy.parameters()])
    assert grads["compiled"][0] == pytest.approx(grads["eager"][0], rel=1e-4)
    for g_compiled, g_eager in zip(grads["compiled"][1], grads["eager"][1]):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-5)


def test_compile_auto_compiles_long_cpu_runs_and_a_failed_compile_trains_eagerly(tmp_path, monkeypatch):
    """compile=auto compiles only long CPU runs with a C++ compiler; a compile that fails says so in
    one line and the run trains on eagerly."""
    from robo_rl.learn.learner import compile_wanted

    short, long = LearnerConfig(steps=50, compile="auto"), LearnerConfig(steps=0, max_minutes=30, compile="auto")
    assert not compile_wanted(short, "cpu") and not compile_wanted(long, "cuda")
    assert compile_wanted(long, "cpu") == any(shutil.which(c) for c in ("g++", "c++", "clang++"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no C++ compiler to be found
    assert not compile_wanted(long, "cpu") and compile_wanted(LearnerConfig(compile="true"), "cpu")

    # a C++ compiler that does not exist, in a process of its own (inductor caches what it found):
    # the first step says why and the run trains eagerly
    script = (
        "import math, sys, torch\n"
        "from robo_rl.learn import Learner, LearnerConfig\n"
        "class Squares(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.ones(3))\n"
        "    def forward(self, batch, weights=None):\n"
        "        return (self.w * batch['x']).pow(2).mean()\n"
        "cfg = LearnerConfig(steps=2, batch_size=4, compile='true', log_every=1, checkpoint_every=0, device='cpu')\n"
        "learner = Learner(Squares(), cfg, sys.argv[1], "
        "lambda bs, gen, weighted: {'x': torch.randn(bs, 3, generator=gen)}, progress=False)\n"
        "out = learner.fit()\n"
        "assert out['step'] == 2 and math.isfinite(out['loss']) and not learner.compiled, out\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch.compile failed" in r.stdout and "training eagerly" in r.stdout


class NaNWhenCompiled(torch.nn.Module):
    """A loss that a compiled graph gets wrong: what a compiler bug looks like to the Learner."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, batch, weights=None):
        loss = (self.w * batch["x"]).pow(2).mean()
        return loss * float("nan") if torch.compiler.is_compiling() else loss


def test_a_compiled_step_with_nan_gradients_is_taken_again_eagerly(tmp_path, capsys):
    """The first compiled step's loss and gradients are checked: NaN there means the step is
    retaken eagerly and the run trains on eagerly, said in one line, and no NaN reaches the weights."""
    torch._dynamo.reset()
    model = NaNWhenCompiled()
    cfg = LearnerConfig(steps=3, batch_size=4, compile="true", log_every=1, checkpoint_every=0, device="cpu",
                        warmup_steps=0, lr=0.1)
    learner = Learner(model, cfg, tmp_path / "run", lambda bs, gen, weighted: {"x": torch.randn(bs, 3, generator=gen)},
                      progress=False)
    out = learner.fit()
    assert out["step"] == 3 and math.isfinite(out["loss"]) and not learner.compiled
    assert torch.isfinite(model.w).all() and not torch.equal(model.w.detach(), torch.ones(3))  # it trained
    assert "first compiled step gave a non-finite loss or gradient" in capsys.readouterr().out


def test_bad_policy_options_are_one_line_errors(tmp_path):
    _, policy, _ = tiny_setup(tmp_path)
    with pytest.raises(ConfigError, match="unknown option"):
        make_policy("flow", {"horizn": 8}, policy.shapes)
    with pytest.raises(ConfigError, match="choose one of"):
        make_policy("bc", {}, policy.shapes)
    with pytest.raises(ConfigError, match="image_encoder='vit'; choose one of resnet18, conv"):
        make_policy("flow", {"image_encoder": "vit"}, policy.shapes)
    with pytest.raises(ConfigError, match="conv_channels"):
        make_policy("flow", {"image_encoder": "conv", "conv_channels": []}, policy.shapes)
    with pytest.raises(ConfigError, match="divisible"):
        make_policy("flow", {"backbone": "unet", "horizon": 10, "down_dims": [8, 16, 32]}, policy.shapes)
    with pytest.raises(ConfigError, match="dit_patch=3 must be >= 1 and divide policy.horizon=8"):
        make_policy("flow", {"dit_patch": 3, "horizon": 8}, policy.shapes)
    with pytest.raises(ConfigError, match="expected"):
        policy.predict({"obs/qpos": np.zeros((1, 5, 3), np.float32)})


def test_image_encoder_crop_and_resnet():
    frames = torch.arange(2 * 10 * 12 * 3).reshape(2, 10, 12, 3).to(torch.uint8)  # N H W C, as stored
    crops = random_crop(frames, (6, 7), torch.Generator().manual_seed(0))
    assert crops.shape == (2, 3, 6, 7) and crops.dtype == torch.uint8
    assert crops.is_contiguous(memory_format=torch.channels_last)
    chw = frames.permute(0, 3, 1, 2)
    for i in range(2):  # every crop is a contiguous window of its own image
        window = next(((y, x) for y in range(5) for x in range(6) if torch.equal(crops[i], chw[i, :, y:y + 6, x:x + 7])), None)
        assert window is not None
    net = ResNet18GN(out_dim=16, width=8)
    assert net(torch.randn(3, 3, 40, 40)).shape == (3, 16)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())


def test_random_crops_only_while_training_and_the_centre_when_evaluating():
    """The camera encoder crops a new window each training call; in eval mode it sees the same
    centre window every time, so a frame gives identical features at evaluation."""
    from robo_rl.policies.nets.encoders import CameraEncoder

    torch.manual_seed(0)
    enc = CameraEncoder((24, 24), 8, 8, 0.75, kind="conv", conv_channels=(4, 8, 8))
    frames = torch.randint(0, 256, (4, 1, 24, 24, 3), dtype=torch.uint8)
    seen = []
    enc.net.forward = lambda x: (seen.append(x.clone()), x.new_zeros(x.shape[0], 8))[1]
    enc.train()
    enc(frames), enc(frames)
    enc.eval()
    enc(frames), enc(frames)
    assert not torch.equal(seen[0], seen[1])  # training: a fresh random window each call
    assert torch.equal(seen[2], seen[3])       # evaluation: the same frames, the same input
    centre = frames.reshape(4, 24, 24, 3)[:, 3:21, 3:21].permute(0, 3, 1, 2).float() / 127.5 - 1
    torch.testing.assert_close(seen[2], centre)
    assert seen[0].shape == seen[2].shape == (4, 3, 18, 18)


def test_colour_jitter_runs_only_while_training_and_one_draw_covers_a_samples_frames():
    """With color_jitter on, training inputs change colour per sample (the frames of one sample
    alike); evaluation sees exactly the frames it saw without jitter."""
    from robo_rl.policies.nets.encoders import CameraEncoder, color_jitter, jittered_crops

    torch.manual_seed(0)
    plain = CameraEncoder((24, 24), 8, 8, 1.0, kind="conv", conv_channels=(4, 8, 8))
    jittered = CameraEncoder((24, 24), 8, 8, 1.0, kind="conv", conv_channels=(4, 8, 8), jitter=(0.4, 0.3, 0.3, 0.05))
    frames = torch.full((6, 2, 24, 24, 3), 100, dtype=torch.uint8)
    frames[..., 0] = 160  # a reddish grey
    seen = {}
    for name, enc in (("plain", plain), ("jittered", jittered)):
        enc.net.forward = lambda x, name=name: (seen.setdefault(name, []).append(x.clone()), x.new_zeros(x.shape[0], 8))[1]
        enc.eval()
        enc(frames)
        enc.train()
        enc(frames)
    assert torch.equal(seen["plain"][0], seen["jittered"][0])      # evaluation: identical frames
    assert torch.equal(seen["plain"][1], seen["plain"][0])         # crop 1.0 and no jitter: the frame itself
    train = seen["jittered"][1].reshape(6, 2, 3, 24, 24)
    means = train.mean((-1, -2))                                   # sample, frame, channel
    torch.testing.assert_close(means[:, 0], means[:, 1])          # one draw per sample, over its frames
    assert means[:, 0].std(0).min() > 0.02                         # samples differ in every channel
    assert train.min() >= -1 and train.max() <= 1
    # zero strengths are the identity, and brightness alone scales the pixels
    images = torch.rand(5, 3, 8, 8)
    torch.testing.assert_close(color_jitter(images, 0, 0, 0, 0), images)
    bright = color_jitter(images * 0.5, 0.5, 0, 0, 0)
    ratio = bright / (images * 0.5)
    torch.testing.assert_close(ratio, ratio[:, :1, :1, :1].expand_as(ratio), rtol=1e-4, atol=1e-4)
    assert 0.5 <= ratio.min() and ratio.max() <= 1.5
    # gamma alone: one power per image, drawn within [1 / 1.5, 1.5], and not the same for every image
    toned = color_jitter(images, 0, 0, 0, 0, 0.5)
    power = torch.log(toned) / torch.log(images)
    torch.testing.assert_close(power, power[:, :1, :1, :1].expand_as(power), rtol=1e-3, atol=1e-3)
    assert 1 / 1.5 - 1e-4 <= power.min() and power.max() <= 1.5 + 1e-4 and power.std() > 0.01
    # the encoder's folded path (crop and jitter in one product) draws and computes what the steps do one by one
    frames = torch.randint(0, 256, (6, 20, 20, 3), dtype=torch.uint8)
    torch.manual_seed(3)
    steps = color_jitter(random_crop(frames, (16, 16)).float() / 255, 0.4, 0.3, 0.3, 0.05, per=2) * 2 - 1
    torch.manual_seed(3)
    folded = jittered_crops(frames, (16, 16), 0.4, 0.3, 0.3, 0.05, per=2)
    torch.testing.assert_close(folded, steps, rtol=0, atol=1e-5)
    assert folded.is_contiguous(memory_format=torch.channels_last) and not torch.equal(folded[0], folded[2])


# --------------------------------------------------------------------------- training
# the U-Net rows take ~10 s each on an AVX2-only CPU: -m slow (the U-Net's frozen sampler is checked by default)
@pytest.mark.parametrize("name,options", [pytest.param("flow", TINY, marks=pytest.mark.slow),
                                          pytest.param("diffusion", TINY, marks=pytest.mark.slow),
                                          ("flow", TINY_DIT), ("flow", TINY_MLP)],
                         ids=["flow-unet", "diffusion-unet", "flow-dit", "flow-mlp"])
def test_losses_decrease(tmp_path, name, options):
    torch.manual_seed(0)
    _, policy, sampler = tiny_setup(tmp_path, name, options)
    cfg = LearnerConfig(steps=300, batch_size=32, lr=2e-3, warmup_steps=20, checkpoint_every=0, log_every=25)
    learner = Learner(policy, cfg, tmp_path / "run", lambda bs, g, w: sampler.sample(bs, g, w), progress=False)
    learner.fit()
    losses = [r["loss"] for r in learner.history]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("encoder", [{"image_width": 8, "image_feature_dim": 8}, TINY_CONV], ids=["resnet18", "conv"])
def test_image_policy_trains_end_to_end(tmp_path, encoder):
    torch.manual_seed(0)
    opts = {**TINY, **encoder}
    _, policy, sampler = tiny_setup(tmp_path, "flow", opts, images=True)
    cfg = LearnerConfig(steps=60, batch_size=16, lr=2e-3, warmup_steps=5, checkpoint_every=0, log_every=10)
    learner = Learner(policy, cfg, tmp_path / "run", lambda bs, g, w: sampler.sample(bs, g, w), progress=False)
    learner.fit()
    assert learner.history[-1]["loss"] < learner.history[0]["loss"]
    batch = sampler.sample(2, torch.Generator().manual_seed(1))
    out = policy.eval().predict({k: batch[k].numpy() for k in ("obs/qpos", "obs/images/top")})
    assert out.shape == (2, 8, 2)
    rebuilt = make_policy("flow", policy_spec(policy)["config"], policy.shapes)  # as a checkpoint is read back
    rebuilt.load_state_dict(policy.state_dict())
    assert rebuilt.config.image_encoder == policy.config.image_encoder


def test_joint_noise_and_dropout_act_only_while_training(tmp_path):
    """policy.lowdim_noise / lowdim_dropout perturb the normalised low-dim keys in training only:
    evaluation sees the joints as they are, and a dropped sample loses every low-dim key at once."""
    torch.manual_seed(0)
    opts = {**TINY, **TINY_CONV}
    _, plain, sampler = tiny_setup(tmp_path / "a", "flow", opts, images=True)
    batch = sampler.sample(64, torch.Generator().manual_seed(1))
    obs = {k: batch[k] for k in ("obs/qpos", "obs/images/top")}
    clean = {k: plain.body.norms["obs__qpos"].normalize(obs[k].float()) for k in ("obs/qpos",)}

    _, dropping, _ = tiny_setup(tmp_path / "b", "flow", {**opts, "lowdim_dropout": 0.5}, images=True)
    dropped = dropping.body.train()._perturb_lowdim(dict(clean))["obs/qpos"]
    zero_rows = (dropped == 0).all(-1).all(-1)
    assert 10 < int(zero_rows.sum()) < 54  # about half the samples, each dropped whole
    assert torch.equal(dropped[~zero_rows], clean["obs/qpos"][~zero_rows])

    _, noisy, _ = tiny_setup(tmp_path / "c", "flow", {**opts, "lowdim_noise": 0.2}, images=True)
    moved = noisy.body.train()._perturb_lowdim(dict(clean))["obs/qpos"] - clean["obs/qpos"]
    assert 0.15 < float(moved.std()) < 0.25

    noisy.load_state_dict(plain.state_dict())
    for policy in (plain, noisy):
        policy.eval()
    with torch.no_grad():  # evaluation: the same conditioning with or without the training-only noise
        assert torch.equal(noisy.body.encode(obs), plain.body.encode(obs))
    with pytest.raises(ConfigError, match="lowdim_dropout=1.0 must be in"):
        make_policy("flow", {**opts, "lowdim_dropout": 1.0}, plain.shapes)


def test_action_weights_scale_each_dimensions_share_of_the_loss(tmp_path):
    """policy.action_weights multiplies each action dimension's squared error; none given is all 1,
    and a checkpoint made before the option loads (the weights live in the config, not the weights file)."""
    _, policy, _ = tiny_setup(tmp_path)
    err = torch.randn(5, 8, 2)
    plain = policy.body.per_sample_loss(err, {})
    assert torch.allclose(plain, err.pow(2).mean((-1, -2)))
    weighted = make_policy("flow", {**TINY, "action_weights": [0.0, 4.0]}, policy.shapes)
    assert torch.allclose(weighted.body.per_sample_loss(err, {}), 2.0 * err[..., 1].pow(2).mean(-1))
    assert "action_weights" not in weighted.state_dict()
    weighted.load_state_dict(policy.state_dict())
    with pytest.raises(ConfigError, match="action_weights has 3 values .* give 2 non-negative weights"):
        make_policy("flow", {**TINY, "action_weights": [1, 1, 1]}, policy.shapes)


def test_a_camera_the_store_lacks_is_named_with_the_cameras_it_has(tmp_path):
    store = smooth_store(tmp_path / "store", images=True)
    with pytest.raises(ConfigError, match=r"'obs/images/wrist': the dataset has no such camera; its cameras are \['obs/images/top'\]"):
        ObsShapes.from_schema(store.schema, ["obs/qpos", "obs/images/wrist"])


def test_rac_fine_tunes_a_camera_policy_with_the_recipes_dtype_unless_told():
    from robo_rl.learn.recipes import cpu_compile_pays, cpu_computes_bf16, with_camera_learner

    opts = {"steps": 2000, "lr": 1e-4}
    cpu = with_camera_learner(opts, True, "cpu")
    assert cpu.get("bf16") == ("true" if cpu_computes_bf16() else None)
    assert cpu["compile"] == ("auto" if cpu_compile_pays() else "false")
    # compiled where it was measured to pay (AMX) or not measured (no bf16), not on AVX512-BF16 alone
    assert cpu_compile_pays({"avx2", "avx512_bf16", "amx_bf16"}) and cpu_compile_pays({"avx2"})
    assert not cpu_compile_pays({"avx2", "avx512_bf16"})
    assert with_camera_learner({**opts, "bf16": "false"}, True, "cpu")["bf16"] == "false"  # the user's choice stays
    assert with_camera_learner(opts, False, "cpu") == opts  # a state policy: as configured
    assert "compile" not in with_camera_learner(opts, True, "cuda:0")  # the GPU: the learner's own defaults


def test_a_camera_train_picks_the_camera_recipe_and_the_command_line_wins(tmp_path, capsys):
    from robo_rl.learn.recipes import CAMERA_FLOW_RECIPE, CAMERA_RECIPE, cpu_compile_pays, cpu_computes_bf16
    from robo_rl.policies import read_checkpoint

    smooth_store(tmp_path / "cams", n_episodes=2, images=True, side=96)
    smooth_store(tmp_path / "frames48", n_episodes=2, images=True, side=48)

    def train(name: str, *args: str, dataset: str = "cams"):
        code, err = robo_rl_in_process(capsys, "train", "policy=flow", "task=transfer_cube", f"dataset={tmp_path / dataset}",
                                       f"run_dir={tmp_path / name}", "learner.steps=1", "learner.batch_size=4",
                                       "eval.episodes=0", "learner.device=cpu", *args)
        return code, err, (load_policy(read_checkpoint(tmp_path / name / "checkpoints" / "last.pt")) if code == 0 else None)

    code, err, policy = train("auto", "obs_keys=[obs/qpos,obs/images/top]")
    assert code == 0, err
    recipe = {k.split(".", 1)[1]: v for k, v in {**CAMERA_RECIPE, **CAMERA_FLOW_RECIPE}.items() if k.startswith("policy.")}
    as_lists = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(policy.config).items()}
    assert {k: as_lists[k] for k in recipe} == recipe
    saved = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert str(saved["learner"]["bf16"]).lower() == ("true" if cpu_computes_bf16() else "auto")  # bf16 where the CPU has it
    # compiled when the run is long enough (1 step is not), on a CPU where compiling pays
    assert str(saved["learner"]["compile"]).lower() == ("auto" if cpu_compile_pays() else "false")
    # the chunking eval and deploy run by default travels in the checkpoint
    assert read_checkpoint(tmp_path / "auto" / "checkpoints" / "last.pt")["chunking"]["mode"] == "ensemble"
    # what the command line sets is kept; the rest of the recipe still fills in
    code, err, policy = train("mine", "obs_keys=[obs/qpos,obs/images/top]", "policy.horizon=16", "+policy.noise_samples=2")
    assert code == 0, err
    assert (policy.config.horizon, policy.config.noise_samples, policy.config.image_encoder) == (16, 2, "conv")
    # no camera, or recipe=none: the config as written (the state policies' defaults)
    for name, args in (("state", ["obs_keys=[obs/qpos]"]), ("none", ["obs_keys=[obs/qpos,obs/images/top]", "recipe=none",
                                                                      "policy.dit_dim=32", "policy.dit_depth=1"])):
        code, err, policy = train(name, *args)
        assert code == 0, err
        assert (policy.config.backbone, policy.config.n_obs, policy.config.horizon) == ("transformer", 2, 16), name
    # frames smaller than the recipe was measured at: one line, before any training
    code, err, _ = train("small", "obs_keys=[obs/qpos,obs/images/top]", dataset="frames48")
    assert code == 2 and "frames are 48x48, smaller than the camera recipe's 96x96" in err and "Traceback" not in err
    assert not (tmp_path / "small").exists()


def test_weighted_mean_and_schedule():
    assert weighted_mean(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0])).item() == 1.0
    assert weighted_mean(torch.tensor([1.0, 3.0]), None).item() == 2.0
    assert warmup_cosine(0, 10, 100, 0.0) == pytest.approx(0.1)
    assert warmup_cosine(9, 10, 100, 0.0) == pytest.approx(1.0)
    assert warmup_cosine(100, 10, 100, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize("options", [TINY_MLP, TINY_DIT], ids=["mlp", "dit"])
def test_the_sampler_with_batched_modulations_takes_the_training_path_steps(options):
    """The sampler computes every step's FiLM / adaLN in one call before the steps; its chunk is
    the one K plain Euler steps of the network as trained (`velocity`) give from the same noise."""
    torch.manual_seed(0)
    policy = make_policy("flow", options, ObsShapes({"obs/qpos": 3}, {}, 2)).eval()
    for p in policy.parameters():  # zero-initialised output layers would make every chunk the noise
        torch.nn.init.normal_(p, std=0.1)
    cond, noise = torch.randn(4, 32), torch.randn(4, 8, 2)
    k = policy.config.inference_steps
    with torch.no_grad():
        batched = policy.sample(cond, None, noise)
        x = noise.clone()
        for i in range(k):
            x = x + policy.velocity(x, torch.full((4,), i / k), cond) / k
    assert not torch.allclose(batched, noise, atol=1e-2)
    torch.testing.assert_close(batched, x, rtol=1e-5, atol=1e-5)


def test_flow_sample_temperature_scales_the_starting_noise():
    """sample_temperature t: the chunk sampled from noise z is the one sampled at temperature 1
    from t * z (so 0 gives one chunk per observation), and it survives a checkpoint round trip."""
    shapes = ObsShapes({"obs/qpos": 3}, {}, 2)
    plain = make_policy("flow", TINY_MLP, shapes).eval()
    cool = make_policy("flow", {**TINY_MLP, "sample_temperature": 0.5}, shapes).eval()
    cool.load_state_dict(plain.state_dict())
    cond, z = torch.randn(2, plain.config.obs_dim), torch.randn(2, 8, shapes.action_dim)
    torch.testing.assert_close(cool.sample(cond, None, z), plain.sample(cond, None, 0.5 * z))
    frozen = make_policy("flow", {**TINY_MLP, "sample_temperature": 0.0}, shapes).eval()
    frozen.load_state_dict(plain.state_dict())
    torch.testing.assert_close(frozen.sample(cond), frozen.sample(cond))
    assert not torch.allclose(plain.sample(cond), plain.sample(cond))
    assert policy_spec(cool)["config"]["sample_temperature"] == 0.5
    with pytest.raises(ConfigError, match="sample_temperature"):
        make_policy("flow", {**TINY_MLP, "sample_temperature": 1.5}, shapes)


def test_ddim_steps_start_from_pure_noise():
    policy = make_policy("diffusion", TINY, ObsShapes({"obs/qpos": 3}, {}, 2))
    assert policy.ddim_timesteps(10) == [99, 89, 79, 69, 59, 49, 39, 29, 19, 9]
    assert policy.ddim_timesteps(1) == [99]
    assert policy.ddim_timesteps(100) == list(range(99, -1, -1))
    assert policy.abar[99] < 1e-3 < 0.99 < policy.abar[0]  # the last training step is (almost) pure noise


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_diffusion_target_and_ddim_agree_with_an_oracle(prediction):
    """A network that answers exactly (the true eps, or the true v, of a known chunk) has zero loss,
    and DDIM from pure noise with it lands on that chunk: the training target and the sampler's
    inversion are the same parameterisation."""
    torch.manual_seed(0)
    policy = make_policy("diffusion", {**TINY, "prediction": prediction}, ObsShapes({"obs/qpos": 3}, {}, 2))
    chunk = torch.rand(4, 8, 2) * 1.6 - 0.8  # normalised actions, inside [-1, 1]

    class Oracle(torch.nn.Module):
        def forward(self, x, t, cond):
            abar = policy.abar[t.long()][:, None, None]
            eps = (x - abar.sqrt() * chunk) / (1 - abar).sqrt()
            return eps if prediction == "epsilon" else abar.sqrt() * eps - (1 - abar).sqrt() * chunk

    policy.body.net = Oracle()
    batch = {"obs/qpos": torch.zeros(4, 2, 3), "action": policy.body.action_norm.unnormalize(chunk)}
    assert policy.loss(batch).item() < 1e-8
    for steps in (1, 10):
        out = policy.sample(torch.zeros(4, 32), steps=steps)
        torch.testing.assert_close(out, chunk, atol=2e-3, rtol=0)


def test_resume_gives_identical_next_step_loss(tmp_path):
    torch.manual_seed(0)
    _, policy, sampler = tiny_setup(tmp_path, "flow", TINY)
    sample = lambda bs, g, w: sampler.sample(bs, g, w)  # noqa: E731
    cfg = LearnerConfig(steps=100, batch_size=16, lr=1e-3, warmup_steps=5, checkpoint_every=0, seed=3)
    a = Learner(policy, cfg, tmp_path / "a", sample, extra={"policy": policy_spec(policy)}, progress=False)
    for _ in range(7):
        a.train_step()
    path = a.save()
    expected = [a.train_step() for _ in range(3)]

    _, policy_b, _ = tiny_setup(tmp_path / "b_store", "flow", TINY)
    b = Learner(policy_b, cfg, tmp_path / "b", sample, progress=False)
    random.random(), np.random.rand(), torch.rand(3)  # resume must restore every RNG, not inherit them
    b.load(path)
    assert b.step == 7
    got = [b.train_step() for _ in range(3)]
    assert got == expected
    for pa, pb in zip(a.ema.parameters(), b.ema.parameters()):
        assert torch.equal(pa, pb)
    # And the checkpoint rebuilds the policy on its own.
    restored, again = load_policy(path), load_policy(path)
    obs = {"obs/qpos": np.zeros((1, 2, 3), np.float32)}
    torch.manual_seed(5)
    r1 = restored.predict(obs)
    torch.manual_seed(5)
    assert np.array_equal(r1, again.predict(obs))


def test_flow_noise_samples_and_chunk_regression_train_and_leave_sampling_alone():
    """noise_samples=k draws k (noise, tau) per window on one encoding; aux_chunk_weight adds a
    regression head trained beside the flow. Both change the loss only: the sampler, and so a
    frozen predictor, is the plain policy's, and a bad setting is a one-line error."""
    shapes = ObsShapes({"obs/qpos": 3}, {"obs/images/top": (16, 16)}, 2)
    torch.manual_seed(0)
    batch = {"obs/qpos": torch.randn(5, 1, 3), "obs/images/top": torch.randint(0, 256, (5, 1, 16, 16, 3), dtype=torch.uint8),
             "action": torch.randn(5, 8, 2), "action_is_cut": torch.zeros(5, 8, dtype=torch.bool)}
    batch["action_is_cut"][0, 4:] = True
    opts = {**TINY_MLP, "image_encoder": "conv", "conv_channels": [4, 4, 4, 4], "n_obs": 1, "horizon": 8,
            "n_action_steps": 4}
    plain = make_policy("flow", opts, shapes)
    extra = make_policy("flow", {**opts, "noise_samples": 3, "aux_chunk_weight": 0.5}, shapes)
    assert plain.aux_head is None and extra.aux_head is not None
    extra.load_state_dict({**plain.state_dict(), **{k: v for k, v in extra.state_dict().items() if k.startswith("aux_head")}})
    loss = extra.loss(batch)
    loss.backward()
    assert torch.isfinite(loss) and extra.aux_head[0].weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in extra.body.encoder.parameters())
    # the head alone accounts for the difference at a fixed draw: with its weight at 0 the two agree
    torch.manual_seed(1)
    a = make_policy("flow", {**opts, "noise_samples": 3, "aux_chunk_weight": 0.0}, shapes)
    a.load_state_dict(plain.state_dict())
    a.eval(), extra.eval()  # centre crops: the encoding is the same in both calls
    torch.manual_seed(2)
    la = a.loss(batch)
    torch.manual_seed(2)
    lb = extra.loss(batch) - 0.5 * weighted_mean_aux(extra, batch)
    torch.testing.assert_close(la, lb)
    obs = {"obs/qpos": np.zeros((1, 1, 3), np.float32), "obs/images/top": np.zeros((1, 1, 16, 16, 3), np.uint8)}
    torch.manual_seed(3)
    c1 = plain.eval().predict(obs)
    torch.manual_seed(3)
    assert np.array_equal(c1, extra.eval().predict(obs))
    with pytest.raises(ConfigError, match="noise_samples=0"):
        make_policy("flow", {**opts, "noise_samples": 0}, shapes)


def weighted_mean_aux(policy, batch):
    """The chunk-regression term of a flow loss, computed on its own."""
    actions = policy.body.action_norm.normalize(batch["action"].float())
    guess = policy.aux_head(policy.body.encode(batch)).view_as(actions)
    return policy.body.per_sample_loss(guess - actions, batch).mean()


@pytest.mark.slow  # ~6 s (AMD EPYC, AVX2)
def test_a_time_budget_ends_the_cosine_at_the_steps_that_fit(tmp_path):
    """learner.max_minutes with far more steps than fit: the schedule is fitted to the measured
    rate, so the run ends on its own at the fitted step with the learning rate decayed to its
    floor (not cut off at full rate), records the figure, and a resumed run keeps it."""
    _, policy, sampler = tiny_setup(tmp_path, "flow", TINY_MLP)
    sample = lambda bs, g, w: sampler.sample(bs, g, w)  # noqa: E731
    cfg = LearnerConfig(steps=10**7, batch_size=8, lr=1e-3, warmup_steps=20, checkpoint_every=0, max_minutes=0.1,
                        log_every=10**6)
    learner = Learner(policy, cfg, tmp_path / "run", sample, progress=False)
    out = learner.fit()
    assert learner.schedule_fitted and 110 < learner.total_steps < 10**7
    assert out["step"] == learner.total_steps and out["train_time_s"] < 0.1 * 60 * 1.5
    assert learner.scheduler.get_last_lr()[0] < 1e-3 * 1e-3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "scheduled_steps" in r]) == 1  # the first figure; refitted as the rate settles
    again = Learner(make_policy("flow", TINY_MLP, policy.shapes), cfg, tmp_path / "run2", sample, progress=False)
    again.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert again.total_steps == learner.total_steps and again.schedule_fitted
    # without a time budget, or with fit_schedule=false, the schedule is learner.steps long
    plain = Learner(make_policy("flow", TINY_MLP, policy.shapes), LearnerConfig(steps=50, fit_schedule=False),
                    tmp_path / "run3", sample, progress=False)
    assert plain.total_steps == 50


def test_a_time_budget_without_a_step_count_trains_as_many_steps_as_fit(tmp_path):
    """learner.steps=0 with max_minutes: the schedule is as long as the measured rate fits in the
    time (not capped by a step count); without a time budget it is refused in one line."""
    _, policy, sampler = tiny_setup(tmp_path, "flow", TINY_MLP)
    cfg = LearnerConfig(steps=0, batch_size=8, lr=1e-3, warmup_steps=20, checkpoint_every=0, max_minutes=0.04,
                        log_every=10**6)
    learner = Learner(policy, cfg, tmp_path / "run", lambda bs, g, w: sampler.sample(bs, g, w), progress=False)
    assert learner.total_steps == Learner.UNFITTED
    out = learner.fit()
    # how many steps fit 2.4 s is the machine's speed (a loaded CI machine fits far fewer): not asserted
    assert learner.schedule_fitted and 0 < learner.total_steps < Learner.UNFITTED
    assert out["step"] == learner.total_steps
    assert learner.scheduler.get_last_lr()[0] < 1e-3 * 1e-2  # the cosine ran to its end
    for bad in ({"steps": 0}, {"steps": 0, "max_minutes": 5, "fit_schedule": False}, {"steps": -1}):
        with pytest.raises(ConfigError, match="learner.steps"):
            LearnerConfig.from_dict(bad)


def test_cuda_graph_needs_cuda_and_a_known_setting(tmp_path):
    _, policy, sampler = tiny_setup(tmp_path, "flow", TINY_MLP)
    with pytest.raises(ConfigError, match="cuda_graph=true needs a CUDA device"):
        Learner(policy, LearnerConfig(steps=5, device="cpu", cuda_graph="true"), tmp_path / "run",
                lambda bs, g, w: sampler.sample(bs, g, w), progress=False)
    with pytest.raises(ConfigError, match="learner.cuda_graph='sometimes'"):
        LearnerConfig.from_dict({"cuda_graph": "sometimes"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_steps_learn_as_eager_steps_do(tmp_path):
    """The replayed graph (forward, backward, clipping) against eager steps from the same start:
    the warm-up steps before the capture are the eager ones, and both bring the loss down alike."""
    results = {}
    for mode in ("false", "true"):
        torch.manual_seed(0)
        store, policy, _ = tiny_setup(tmp_path / mode, "flow", TINY_MLP)
        sampler = WindowSampler(store, ["obs/qpos"], n_obs=policy.config.n_obs,
                                horizon=policy.config.horizon, device="cuda")
        cfg = LearnerConfig(steps=400, batch_size=64, lr=1e-3, warmup_steps=10, checkpoint_every=0, seed=1,
                            device="cuda", cuda_graph=mode, bf16="false")
        learner = Learner(policy, cfg, tmp_path / mode / "run", lambda bs, g, w: sampler.sample(bs, g, w),
                          progress=False)
        losses = [learner.train_step() for _ in range(cfg.steps)]
        assert learner.use_graph == (mode == "true") and (learner._graph is not None) == (mode == "true")
        results[mode] = (losses, [p.detach().cpu() for p in learner.ema.parameters()])
    eager, graph = results["false"][0], results["true"][0]
    assert graph[:Learner.GRAPH_WARMUP] == pytest.approx(eager[:Learner.GRAPH_WARMUP], rel=1e-4)
    assert np.mean(graph[-50:]) < 0.5 * np.mean(graph[:10])
    assert np.mean(graph[-50:]) == pytest.approx(np.mean(eager[-50:]), rel=0.3)


def test_a_non_finite_loss_stops_training_and_is_never_checkpointed(tmp_path):
    """fit() reads losses once per log window (no wait on the device each step): a NaN batch in
    the middle of a window still stops the run, and the last checkpoint is the one before it."""
    torch.manual_seed(0)
    _, policy, sampler = tiny_setup(tmp_path, "flow", TINY)
    calls = {"n": 0}

    def sample(bs, g, w):
        batch = sampler.sample(bs, g, w)
        calls["n"] += 1
        if calls["n"] == 13:  # step 13: inside the window 11..20, between checkpoints at 10 and 20
            batch = {**batch, "action": batch["action"] * float("nan")}
        return batch

    cfg = LearnerConfig(steps=40, batch_size=8, lr=1e-3, warmup_steps=2, log_every=10, checkpoint_every=10,
                        keep_checkpoints=0)
    learner = Learner(policy, cfg, tmp_path / "run", sample, extra={"policy": policy_spec(policy)}, progress=False)
    with pytest.raises(FloatingPointError, match="between steps 11 and"):
        learner.fit()
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert saved["step"] == 10
    assert all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())


@pytest.mark.slow  # ~22 s (AMD EPYC, AVX2); the atomic checkpoint write is also checked by the resume tests
def test_kill_during_checkpoint_leaves_last_good(tmp_path):
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for trial in range(5):
        run = tmp_path / f"run{trial}"
        proc = subprocess.Popen([sys.executable, str(TESTS / "ckpt_writer.py"), str(run)], stdout=subprocess.PIPE,
                                text=True, env=env)
        first = proc.stdout.readline()
        assert first.startswith("saved"), first
        time.sleep(rng.uniform(0.0, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        committed = [int(line.split()[1]) for line in [first, *out.splitlines()] if line.startswith("saved")]
        ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
        # The file on disk is a whole checkpoint: the last announced one, or the one whose rename
        # landed just before the kill (announced or not).
        assert ckpt["step"] in (committed[-1], committed[-1] + 1)
        assert ckpt["model"]["w.weight"].shape == (1500, 1500)


# --------------------------------------------------------------------------- execution
def test_receding_handover_has_no_jump():
    ex = ChunkExecutor(ChunkingConfig(n_action_steps=4, blend_steps=3), horizon=8)
    old = np.zeros((8, 1))
    new = np.full((8, 1), 1.0)  # a new chunk that disagrees by 1 with the old one
    cmds = []
    for t in range(12):
        if ex.needs_prediction():
            ex.push(old if t == 0 else new)
        cmds.append(float(ex.next()[0]))
    steps = np.abs(np.diff(cmds))
    assert steps.max() <= 0.25 + 1e-9  # the 1.0 disagreement spread over blend_steps + 1 ticks
    assert cmds[-1] == 1.0
    hard = ChunkExecutor(ChunkingConfig(n_action_steps=4, blend_steps=0), horizon=8)
    jumps = []
    for t in range(8):
        if hard.needs_prediction():
            hard.push(old if t == 0 else new)
        jumps.append(float(hard.next()[0]))
    assert np.abs(np.diff(jumps)).max() == 1.0


def test_temporal_ensembling_weights_oldest_most():
    ex = ChunkExecutor(ChunkingConfig(mode="ensemble", query_every=1, ensemble_decay=0.5), horizon=4)
    ex.push(np.zeros((4, 1)))
    assert ex.next()[0] == 0.0
    ex.push(np.ones((4, 1)))
    w = np.exp(-0.5 * np.arange(2))
    assert ex.next()[0] == pytest.approx(w[1] / w.sum())


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.490, 0.943)
    assert wilson_interval(0, 100)[0] == 0.0 and wilson_interval(100, 100)[1] == 1.0
    assert wilson_interval(100, 100)[0] == pytest.approx(0.963, abs=1e-3)


# --------------------------------------------------------------------------- in the twin
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_flow_policy_overfits_one_demo_and_replays_it(tmp_path):
    """Record one clean expert demo, overfit a flow policy to it, and run the policy from the
    same initial state: it must succeed and stay on the demo's joint trajectory."""
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.recording import demo_schema, demo_step

    torch.manual_seed(0)
    env = BimanualEnv("transfer_cube")
    seed = 3
    obs, _ = env.reset(seed=seed)
    expert = env.expert(ExpertNoise.none())
    steps = []
    for _ in range(env.max_steps):
        prev = obs
        obs, _, term, trunc, info = env.step(expert.act())
        steps.append(demo_step(prev, info["executed_action"], []))
        if term or trunc:
            break
    assert info["success"]
    schema = demo_schema(env, [], (1, 1))
    store = EpisodeStore.create(tmp_path / "one", schema)
    store.add_episode({k: np.stack([s[k] for s in steps]) for k in schema.keys}, np.arange(len(steps)) / 50,
                      "SCRIPTED", EpisodeMeta(task="transfer_cube"))
    keys = ["obs/qpos", "obs/env_state"]
    shapes = ObsShapes.from_schema(store.schema, keys)
    policy = make_policy("flow", {}, shapes, get_stats(store, [*keys, "action"], save=False))  # the defaults
    sampler = WindowSampler(store, keys, n_obs=2, horizon=16, device="cpu")
    cfg = LearnerConfig(steps=int(os.environ.get("OVERFIT_STEPS", "6000")), batch_size=64, lr=3e-4, warmup_steps=100,
                        checkpoint_every=0, ema_decay=0.99)
    Learner(policy, cfg, tmp_path / "run", lambda bs, g, w: sampler.sample(bs, g, w), progress=False).fit()
    policy.eval()

    demo_q = store.episode(0)["obs/qpos"]
    obs, _ = env.reset(seed=seed)
    ex = ChunkExecutor(ChunkingConfig(n_action_steps=8), horizon=16)
    window = [obs] * 2
    qs = []
    for t in range(len(demo_q) + 40):
        if ex.needs_prediction():
            batch = {"obs/qpos": np.stack([w["qpos"] for w in window])[None],
                     "obs/env_state": np.stack([w["env_state"] for w in window])[None]}
            ex.push(policy.predict(batch)[0])
        qs.append(obs["qpos"])
        obs, _, term, trunc, info = env.step(ex.next().astype(np.float32))
        window = window[1:] + [obs]
        if term or trunc:
            break
    assert info["success"], f"the overfit policy did not finish the demo's task (stage {info['max_stage']})"
    n = min(len(qs), len(demo_q))
    err = np.abs(np.stack(qs[:n]) - demo_q[:n]).mean()
    assert err < 0.05, f"mean joint deviation from the demo {err:.3f}"


def test_an_evaluation_depends_on_its_seed_alone_and_leaves_the_callers_random_stream(tmp_path):
    """demo, rac and train evaluate after training has drawn from torch's generator; their rows must
    still be what robo-rl eval gives on the same checkpoint and seeds (the CPU demo's work once found them apart)."""
    from robo_rl.sim.evaluate import run_eval

    torch.manual_seed(0)
    policy = make_policy("flow", TINY_MLP, ObsShapes({"obs/qpos": 14}, {}, 14)).eval()  # untrained: its noise shows
    actions = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        expected_next = torch.rand(3)
        torch.manual_seed(caller_seed)
        run_eval(policy, "transfer_cube", {"n_action_steps": 4}, episodes=2, n_envs=2, seed=7, videos=0, out=None,
                 max_steps=12, progress=False, record=str(tmp_path / f"rollouts{caller_seed}"))
        assert torch.equal(torch.rand(3), expected_next), "the evaluation moved the caller's random stream"
        store = EpisodeStore.open(tmp_path / f"rollouts{caller_seed}")
        actions.append(np.concatenate([store.episode(i, ["action"])["action"] for i in range(2)]))
    np.testing.assert_array_equal(actions[0], actions[1])


# --------------------------------------------------------------------------- the commands
def _cli(*args, timeout=600):
    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_train_and_eval_commands_in_the_twin(tmp_path):
    """collect -> train (a few steps) -> eval -> resume: the commands' files and tables."""
    demos = tmp_path / "demos"
    r = _cli("collect", "task=transfer_cube", "episodes=2", "cameras=[]", f"out={demos}")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    args = ["train", "policy=flow", "task=transfer_cube", f"dataset={demos}", f"run_dir={run}",
            "learner.steps=20", "learner.batch_size=8", "learner.checkpoint_every=10", "eval.episodes=2",
            "eval.n_envs=2", "eval.videos=1", "policy.dit_dim=32", "policy.dit_depth=2"]
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file()
    assert list((run / "tb").iterdir()) and (run / "metrics.jsonl").read_text().strip()
    assert "95% Wilson interval" in r.stdout
    r = _cli(*args)  # a second run into the same directory must not clobber the first
    assert r.returncode == 2 and r.stderr.startswith("error:") and "resume=true" in r.stderr
    # the resumed run skips its evaluation: the first run's is the same code on the same sizes
    r = _cli(*[a if not a.startswith("learner.steps") else "learner.steps=30" for a in args], "resume=true",
             "eval.episodes=0")
    assert r.returncode == 0 and "resumed" in r.stdout and "at step 20" in r.stdout, r.stdout + r.stderr
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=False)["step"] == 30
    out = tmp_path / "eval"
    r = _cli("eval", f"checkpoint={run / 'checkpoints' / 'last.pt'}", "episodes=3", "n_envs=3", "videos=1", f"out={out}")
    assert r.returncode == 0, r.stderr
    assert (out / "eval.json").is_file() and len(list((out / "videos").glob("*.mp4"))) == 1
    assert "reached lifted_by_right" in r.stdout


def test_commands_reject_bad_input_in_one_line(tmp_path, capsys):
    # in this process: a subprocess would spend 3-4 s per refusal importing torch
    # (test_bad_input.py runs refusals as a user does, from a shell)
    code, err = robo_rl_in_process(capsys, "train", f"dataset={tmp_path / 'nope'}")
    assert code == 2 and err.startswith("error:") and "Traceback" not in err
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={tmp_path / 'missing.pt'}")
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={bad}")
    assert code == 2 and "Traceback" not in err, err
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={bad}", "disturb=maybe")
    assert code == 2 and "disturb='maybe'" in err and "Traceback" not in err, err
    code, err = robo_rl_in_process(capsys, "train", "task=fold_laundry")
    assert code == 2 and "unknown" in err


@pytest.mark.slow  # ~10 s (AMD EPYC, AVX2): two processes under torchrun
def test_ddp_under_torchrun(tmp_path):
    """Two CPU processes (gloo) train the same policy; rank 0 checkpoints; weights stay in sync."""
    store = smooth_store(tmp_path / "store")
    store.close()
    run = tmp_path / "run"
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "-m", "robo_rl.cli.main", "train", "task=transfer_cube", f"dataset={tmp_path / 'store'}",
                        f"run_dir={run}", "obs_keys=[obs/qpos]", "learner.steps=6", "learner.batch_size=8",
                        "eval.episodes=0", "policy.dit_dim=32", "policy.dit_depth=2", "policy.horizon=8", "policy.n_action_steps=4"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 6 and "world 2" in r.stdout


@pytest.mark.parametrize("kind", ["flow", "diffusion-v", "diffusion-epsilon"])
def test_rtc_sampling_keeps_the_frozen_actions_and_is_free_past_the_overlap(kind):
    """Real-time chunking steers the new chunk toward the running one: the first `delay` actions
    land on the old ones (they execute while the new chunk is computed); past the overlap the
    chunk is the policy's own. Without a previous chunk it samples as usual."""
    from robo_rl.policies.diffusion import DiffusionPolicy
    from robo_rl.policies.flow import FlowPolicy
    from robo_rl.policies.rtc import RtcPredictor, prefix_weights

    w = prefix_weights(16, 3, 8)
    assert w[:3].tolist() == [1, 1, 1] and (np.diff(w[3:8]) < 0).all() and 0 < w[7] < w[3] < 1 and not w[8:].any()
    torch.manual_seed(0)
    shapes = ObsShapes({"obs/qpos": 14}, {}, 14)
    stats = {"obs/qpos": {"min": -np.ones(14), "max": np.ones(14)}, "action": {"min": -np.ones(14), "max": np.ones(14)}}
    cls = FlowPolicy if kind == "flow" else DiffusionPolicy
    options = {"n_obs": 1, "horizon": 16, **({"prediction": kind.split("-")[1]} if cls is DiffusionPolicy else {})}
    policy = cls(cls.config_class.from_dict(options), shapes, stats).eval()
    rtc = RtcPredictor(policy)
    window = {"obs/qpos": np.zeros((1, 1, 14), np.float32)}
    previous = np.linspace(-0.6, 0.6, 8 * 14, dtype=np.float32).reshape(1, 8, 14)  # far from what the net says
    torch.manual_seed(1)
    guided = rtc(window, previous, delay=3)
    torch.manual_seed(1)
    free = rtc(window)
    assert guided.shape == free.shape == (1, 16, 14)
    np.testing.assert_allclose(guided[0, :3], previous[0, :3], atol=1e-5)  # frozen: the old actions exactly
    assert 1.0 < np.abs(free[0, :3] - previous[0, :3]).max()
    assert np.abs(guided[0, 12:] - free[0, 12:]).max() < np.abs(guided[0, :3] - free[0, :3]).max()
    # the guidance alone (before the weights are applied to the result) pulls the sample there too
    body = policy.body
    with torch.no_grad():
        cond = body.encode(body.obs_from_window(window))
    target = torch.zeros(1, 16, 14)
    target[:, :8] = body.action_norm.normalize(torch.as_tensor(previous))
    torch.manual_seed(1)
    pulled = rtc._sample(policy, cond, target, torch.as_tensor(w), rtc.cfg)
    pulled = body.action_norm.unnormalize(pulled).detach().numpy()
    assert np.abs(pulled[0, :3] - previous[0, :3]).max() < 0.1
