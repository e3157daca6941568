"""The training recipe `robo-rl train` picks when `obs_keys` names a camera.

The config's defaults (policy/flow.yaml, train.yaml's learner) are the state recipe: a DiT over
two frames of joints and object poses. A camera policy trained with them is 8x slower per step
and has not been seen to succeed on a CPU. The camera recipe below is the best measured
(docs/history.md, "Why camera policies fail in closed loop"): a small CNN with a spatial softmax
per camera, one frame per window, the MLP backbone, a 64-step chunk whose far actions make the
loss say where the object is, four flow draws per encoded frame and a chunk regression beside
the flow loss, bf16 autocast where the CPU computes in bf16, and torch.compile on a CPU where it
pays, for a run long enough to earn back its compile time. The user's own overrides always
win: the recipe only fills the keys not given on the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from robo_rl.errors import ConfigError

RECIPES = ("auto", "camera", "none")

# the camera recipe, as dotted config keys; the flow-only ones are dropped for diffusion
CAMERA_RECIPE = {
    "policy.image_encoder": "conv", "policy.backbone": "mlp", "policy.n_obs": 1, "policy.horizon": 64,
    # colour jitter per sample and camera (brightness, contrast, saturation, hue), training only: a
    # camera policy trained without it failed every episode with the room's light at 0.6x or 1.5x
    "policy.color_jitter": [0.4, 0.3, 0.3, 0.05],
    # ACT's temporal ensembling: a chunk every tick, each tick's action averaged over the chunks
    # that cover it. Run 8 actions per chunk instead and the same policy succeeds 2x less often.
    "eval.chunking.mode": "ensemble",
}
CAMERA_FLOW_RECIPE = {"policy.noise_samples": 4, "policy.aux_chunk_weight": 1.0}
# the frame size every camera row was measured at: smaller frames hold too few pixels of the
# cube (3-4 px of its top face at 96x96, docs/history.md) for the recipe to aim a grasp
CAMERA_MIN_FRAME = (96, 96)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(flags.partition(":")[2].split())


def cpu_computes_bf16() -> bool:
    """True on a CPU with bf16 arithmetic (AVX512-BF16 or AMX), where bf16 autocast makes the
    camera recipe's convolutions and matmuls faster; elsewhere it would make them slower."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_compile_pays(flags: set[str] | None = None) -> bool:
    """Whether torch.compile earns back its ~40 s on the camera recipe's CPU step: 1.14x on a Xeon
    with AMX, level with eager on an EPYC with AVX512-BF16 and no AMX (docs/results.md). CPUs
    without bf16 arithmetic keep compiling, as before that measurement. `flags`: this CPU's."""
    flags = cpu_flags() if flags is None else flags
    return "amx_bf16" in flags or "avx512_bf16" not in flags


def overridden_keys(overrides: Iterable[str]) -> set[str]:
    """The dotted keys a list of Hydra overrides sets (`+policy.horizon=16` -> `policy.horizon`)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def pick_recipe(recipe: str, policy_name: str, camera_keys: list[str], frame_sizes: Mapping[str, tuple[int, int]],
                device: str, user_keys: set[str]) -> dict[str, Any]:
    """The recipe's settings for this run, as {dotted key: value}, leaving out every key in
    `user_keys`. Empty for the state recipe. `frame_sizes`: the store's training frame size per
    camera key; frames smaller than CAMERA_MIN_FRAME are refused in one line."""
    if recipe not in RECIPES:
        raise ConfigError(f"train: recipe={recipe!r}; choose one of {list(RECIPES)}")
    if recipe == "none" or (recipe == "auto" and not camera_keys):
        return {}
    if not camera_keys:
        raise ConfigError("train: recipe=camera needs a camera in obs_keys (e.g. obs/images/top)")
    small = {k: s for k, s in frame_sizes.items() if s[0] < CAMERA_MIN_FRAME[0] or s[1] < CAMERA_MIN_FRAME[1]}
    if small:
        k, (h, w) = next(iter(small.items()))
        raise ConfigError(f"train: {k} frames are {h}x{w}, smaller than the camera recipe's "
                          f"{CAMERA_MIN_FRAME[0]}x{CAMERA_MIN_FRAME[1]}; record them with image_size=[96,96] "
                          f"or larger, or pass recipe=none")
    return {k: v for k, v in camera_recipe(policy_name, device).items() if k not in user_keys}


def camera_recipe(policy_name: str, device: str) -> dict[str, Any]:
    """The whole camera recipe for this policy and device, as {dotted key: value}: what `train`
    fills in (pick_recipe) and what `demo obs=images` trains and runs with."""
    chosen = dict(CAMERA_RECIPE, **(CAMERA_FLOW_RECIPE if policy_name == "flow" else {}))
    chosen.update({f"learner.{k}": v for k, v in camera_learner(device).items()})
    return chosen


def camera_learner(device: str) -> dict[str, Any]:
    """The camera recipe's learner choices for `device` ("cpu" or "cuda..."), by LearnerConfig key."""
    chosen: dict[str, Any] = {}
    if device == "cpu" and cpu_computes_bf16():
        chosen["bf16"] = "true"
    if device == "cpu":  # torch.compile for runs long enough to pay for it (learner.compile_wanted), where it pays
        chosen["compile"] = "auto" if cpu_compile_pays() else "false"
    return chosen


def with_camera_learner(options: Mapping[str, Any], has_cameras: bool, device: str) -> dict[str, Any]:
    """Learner options for training a policy further (RaC's fine-tune): a camera policy gets the
    camera recipe's learner choices for `device` wherever `options` does not set them; a state
    policy's options are returned as they are."""
    extra = camera_learner("cpu" if device == "cpu" else "cuda") if has_cameras else {}
    return {**extra, **options}
