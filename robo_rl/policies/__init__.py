"""Action-chunk policies: the Policy protocol, DiffusionPolicy and FlowPolicy.

A checkpoint written by the Learner holds `policy` = {name, config, shapes} beside the weights, so
`load_policy(path)` rebuilds the exact network (normalisation stats are buffers in the weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from robo_rl.errors import ConfigError
from robo_rl.policies.config import ChunkConfig, ObsShapes, Policy
from robo_rl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from robo_rl.policies.flow import FlowConfig, FlowPolicy

POLICIES = {"flow": FlowPolicy, "diffusion": DiffusionPolicy}
# The behaviour of checkpoints written before an option existed (its default has changed since).
BEFORE_OPTION_EXISTED = {"flow": {"dit_mlp_ratio": 4.0}, "diffusion": {"dit_mlp_ratio": 4.0, "prediction": "epsilon"}}

__all__ = ["POLICIES", "ChunkConfig", "DiffusionConfig", "DiffusionPolicy", "FlowConfig", "FlowPolicy", "ObsShapes",
           "Policy", "checkpoint_info", "make_policy", "policy_spec", "load_policy", "read_checkpoint"]


def make_policy(name: str, config: Mapping[str, Any] | None, shapes: ObsShapes, stats: Mapping[str, Any] | None = None):
    if name not in POLICIES:
        raise ConfigError(f"policy={name!r} unknown; choose one of {sorted(POLICIES)}")
    cls = POLICIES[name]
    return cls(cls.config_class.from_dict(config), shapes, stats)


def policy_spec(policy: Any) -> dict[str, Any]:
    """What it takes to rebuild `policy` (without weights)."""
    return {"name": policy.name, "config": policy.config.to_dict(), "shapes": policy.shapes.to_dict()}


def checkpoint_info(policy: Any, task: str | None, dataset: str | Path | None, n_episodes: int | None,
                    obs_keys: list[str], chunking: Mapping[str, Any] | None, **more: Any) -> dict[str, Any]:
    """What a Learner checkpoint carries besides weights, so `eval`, `rac` and fine-tuning can
    rebuild and roll out the policy: its description, task, data, observation keys, chunking."""
    return {"policy": policy_spec(policy), "task": task, "dataset": None if dataset is None else str(dataset),
            "n_episodes": n_episodes, "obs_keys": list(obs_keys), "chunking": dict(chunking or {}), **more}


def read_checkpoint(path: str | Path, device: str = "cpu") -> dict[str, Any]:
    """A Learner checkpoint as a dict; a missing, truncated or foreign file is a ConfigError."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ConfigError(f"checkpoint {path} could not be read ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(ckpt, dict) or "policy" not in ckpt:
        raise ConfigError(f"checkpoint {path} holds no policy description (was it written by `robo-rl train`?)")
    return ckpt


def load_policy(checkpoint: str | Path | Mapping[str, Any], ema: bool = True, device: str = "cpu"):
    """A policy in eval mode from a Learner checkpoint (the EMA weights unless ema=False)."""
    ckpt = read_checkpoint(checkpoint, device) if isinstance(checkpoint, (str, Path)) else checkpoint
    spec = ckpt["policy"]
    # Options added after a checkpoint was written take the value that checkpoint was trained with.
    config = {**BEFORE_OPTION_EXISTED.get(spec["name"], {}), **spec["config"]}
    policy = make_policy(spec["name"], config, ObsShapes.from_dict(spec["shapes"]))
    weights = ckpt["ema"] if ema and ckpt.get("ema") is not None else ckpt["model"]
    policy.load_state_dict(weights)
    return policy.to(device).eval()
