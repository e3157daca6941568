"""robo-rl eval: roll a trained policy out in the twin; success with a 95% Wilson interval."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_summary
from robo_rl.errors import ConfigError


def main(argv: list[str]) -> int:
    return run_app("eval", "eval", run, argv)


def run(cfg: DictConfig) -> int:
    import torch

    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.policies.inference import predictor
    from robo_rl.sim.evaluate import run_eval, write_eval

    if not cfg.checkpoint:
        raise ConfigError("eval: pass checkpoint=PATH (a checkpoint written by robo-rl train)")
    if not isinstance(cfg.disturb, bool):
        raise ConfigError(f"eval: disturb={cfg.disturb!r}; choose true or false")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    path = Path(cfg.checkpoint)
    ckpt = read_checkpoint(path, cfg.device)
    policy = load_policy(ckpt, ema=bool(cfg.ema), device=cfg.device)
    if cfg.sample_temperature is not None:
        if not hasattr(policy.config, "sample_temperature"):
            raise ConfigError(f"eval: sample_temperature= needs a flow policy; {path} holds a {policy.name} policy")
        policy.config.sample_temperature = float(cfg.sample_temperature)
        policy.config.validate()  # the policy's own range check
    task = cfg.task or ckpt.get("task")
    if not task:
        raise ConfigError("eval: the checkpoint does not name its task; pass task=...")
    chunking = dict(ckpt.get("chunking") or {"n_action_steps": policy.config.n_action_steps})
    overrides = OmegaConf.to_container(cfg.chunking, resolve=True) if cfg.chunking else {}
    chunking.update({k: v for k, v in overrides.items() if v is not None})
    out = Path(cfg.out) if cfg.out else path.parent.parent / f"eval-{path.stem}"
    # value-guided chunk selection (critic=PATH) and rollout recording (record=PATH)
    predict, guided = predictor(policy, cfg.inference_steps), None
    if cfg.critic:
        from robo_rl.cli.session import value_guided

        predict = guided = value_guided(predict, cfg.critic, int(cfg.critic_samples), policy, task, chunking)
    if cfg.shifts:
        return run_shifts(cfg, policy, task, chunking, out, predict, path)
    summary = run_eval(policy, task, chunking, int(cfg.episodes), int(cfg.n_envs), int(cfg.seed), int(cfg.videos), out,
                       cfg.inference_steps, cfg.max_steps, predict=predict, record=cfg.record, disturb=bool(cfg.disturb))
    extra = {"critic": str(cfg.critic), **guided.stats()} if guided is not None else {}
    if cfg.record:
        extra["record"] = str(cfg.record)
    result = write_eval(summary, out, checkpoint=str(path), step=int(ckpt.get("step", 0)), ema=bool(cfg.ema),
                        chunking=chunking, disturb=bool(cfg.disturb), inference_steps=cfg.inference_steps or policy.config.inference_steps, **extra)
    print_summary(summary, f"eval {task}: {policy.name} policy, step {result['step']}")
    if guided is not None:
        print(guided.describe())
    print(f"results: {out / 'eval.json'}")
    return 0


def run_shifts(cfg: DictConfig, policy, task: str, chunking: dict, out: Path, predict, path: Path) -> int:
    """The robustness report: the nominal room and every shift of `shifts=`, on the same seeds."""
    from robo_rl.cli.tables import print_table
    from robo_rl.data.schema import IMAGE_PREFIX
    from robo_rl.sim.evaluate import run_eval
    from robo_rl.sim.robustness import shift_report as report, table_rows
    from robo_rl.sim.room import parse_shifts

    names = list(cfg.shifts) if OmegaConf.is_list(cfg.shifts) else [cfg.shifts]
    cameras = [k[len(IMAGE_PREFIX):] for k in policy.shapes.images]
    if not cameras:
        raise ConfigError(f"eval: shifts= change what cameras see, and {path} holds a policy without cameras")
    rooms = parse_shifts(names, cameras)

    def evaluate(room, name):
        print(f"-- {name}: {room.describe() if room else 'the nominal room'}")
        folder = name.replace(":", "_")
        # record=DIR with shifts: each room's rollouts in a store of their own, DIR/<shift>, same seeds
        record = str(Path(cfg.record) / folder) if cfg.record else None
        return run_eval(policy, task, chunking, int(cfg.episodes), int(cfg.n_envs), int(cfg.seed), int(cfg.videos),
                        out / "shifts" / folder, cfg.inference_steps, cfg.max_steps, predict=predict,
                        record=record, disturb=bool(cfg.disturb), room=room)

    rows = report(rooms, evaluate, out)
    print_table(f"eval {task}: {policy.name} policy in shifted rooms, {int(cfg.episodes)} episodes each from seed {int(cfg.seed)}",
                ["shift", "the room", "success", "95% interval", "points vs nominal"], table_rows(rows))
    print(f"results: {out / 'shifts.json'}, {out / 'shifts.png'}")
    return 0
