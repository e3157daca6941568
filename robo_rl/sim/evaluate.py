"""A trained policy rolled out in the twin: the evaluation behind eval, train, rac and demo.

`run_eval` wires a policy (or a predictor it is given, e.g. value-guided selection) into
`robo_rl.sim.rollout.evaluate_policy`, or records the rollouts (`record=`); `write_eval` writes
eval.json; `evaluate_with_recoveries` adds RaC's test-time-scaling curve (success had each
episode been allowed at most k recovery manoeuvres), in consecutive parts that may run in
separate processes (`EvaluationProcess`: beside RaC's rollouts, or two halves at once).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from robo_rl.errors import ConfigError


def run_eval(policy: Any, task: str, chunking: Mapping[str, Any], episodes: int, n_envs: int, seed: int,
             videos: int, out: Path | None, inference_steps: int | None = None, max_steps: int | None = None,
             progress: bool = True, count_recoveries: bool = False, predict: Any = None, record: str | None = None,
             disturb: bool = True, room: Any = None):
    # The policy's sampling noise is drawn from a generator seeded by the evaluation seed alone, so an
    # evaluation inside demo, rac or train gives what robo-rl eval gives on the same checkpoint and
    # seeds, whatever the caller drew before; the caller's own random stream is left as it was.
    with seeded_noise(seed):
        return _run_eval(policy, task, chunking, episodes, n_envs, seed, videos, out, inference_steps, max_steps,
                         progress, count_recoveries, predict, record, disturb, room)


@contextlib.contextmanager
def seeded_noise(seed: int) -> Iterator[None]:
    """torch's generators (CPU and CUDA) seeded with `seed` inside the block, as they were after it."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _run_eval(policy, task, chunking, episodes, n_envs, seed, videos, out, inference_steps, max_steps, progress,
              count_recoveries, predict, record, disturb, room):
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.rollout import evaluate_policy

    shapes, cfg = policy.shapes, policy.config
    keys = [*shapes.lowdim, *shapes.images]
    image_size = next(iter(shapes.images.values()), None)
    try:
        chunk_cfg = ChunkingConfig(**dict(chunking))
    except TypeError as e:
        raise ConfigError(f"chunking: {e}") from None
    from robo_rl.policies.inference import predictor

    predict = predictor(policy, inference_steps) if predict is None else predict  # value-guided selection passes its own
    if record:  # the same rollouts, also written to an episode store with per-step stages
        from robo_rl.sim.critic_data import record_rollouts

        return record_rollouts(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg, record, episodes=episodes,
                               n_envs=n_envs, seed=seed, image_size=image_size, max_steps=max_steps, progress=progress,
                               disturb=disturb, room=room)
    return evaluate_policy(predict, task, keys, cfg.n_obs, cfg.horizon, chunk_cfg,
                           episodes=episodes, n_envs=n_envs, seed=seed, image_size=image_size, videos=videos,
                           video_dir=out / "videos" if out is not None else None, max_steps=max_steps, progress=progress,
                           count_recoveries=count_recoveries, disturb=disturb, room=room)


def write_eval(summary: Any, out: Path, **extra: Any) -> dict[str, Any]:
    """eval.json in `out`: the summary plus `extra` (checkpoint, step, ...); returns the dict."""
    result = {**summary.to_dict(), **extra}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def evaluate_with_recoveries(policy: Any, task: str, chunking: Mapping[str, Any], episodes: int, n_envs: int, seed: int,
                             max_recoveries: int, out: Path | None, videos: int = 0, predict: Any = None,
                             shards: int = 1, beside: tuple[Path, str] | None = None,
                             progress: bool = True) -> dict[str, Any]:
    """Success with its interval, stage reach and the test-time-scaling curve of one policy
    (`predict`: its predictor, when the caller has one to share).

    `shards` > 1: the episodes in that many consecutive parts, each with its own noise seed and
    torch on one thread, so that a part gives the same episodes wherever it runs. `beside`: the
    policy's (checkpoint, device); the parts after the first then run in a spawned process while
    this one runs the first (two cores: about half the time)."""
    spans = shard_spans(episodes, shards)
    child = (EvaluationProcess(beside[0], beside[1], task, chunking, spans[1:], n_envs, seed, out, videos)
             if beside is not None and len(spans) > 1 else None)
    try:
        with one_thread() if len(spans) > 1 else contextlib.nullcontext():
            parts = run_parts(policy, task, chunking, spans[:1] if child else spans, n_envs, seed, out, videos,
                              predict, progress)
    except BaseException:
        if child is not None:
            child.cancel()
        raise
    if child is not None:
        parts += child.parts()
    return recovery_row(merge_shards(parts), max_recoveries, out)


def recovery_row(summary: Any, max_recoveries: int, out: Path | None) -> dict[str, Any]:
    """evaluate_with_recoveries' row of an evaluation (written to out/eval.json too)."""
    d = summary.to_dict()
    if out is not None:
        write_eval(summary, out)
    recoveries = [e.recoveries for e in summary.episodes]
    return {"success_rate": d["success_rate"], "ci95_low": d["ci95_low"], "ci95_high": d["ci95_high"],
            "stage_reach": d["stage_reach"], "mean_length": d["mean_length"], "disturbed": d["disturbed"],
            "mean_recoveries": sum(recoveries) / max(1, len(recoveries)),
            "success_within": [summary.success_within(k) for k in range(max_recoveries + 1)],
            "videos": d["videos"]}


# ---------------------------------------------------------------------- an evaluation beside other work
# The twin steps on one core, so on a 2-core laptop an evaluation can run beside RaC's rollouts, or
# in two halves at once. A part's result depends only on its episodes, its noise seed and torch's
# thread count, which is 1 in every part (`one_thread`), wherever the part runs.

def shard_spans(episodes: int, shards: int) -> list[tuple[int, int]]:
    """(first episode, episodes) of each of `shards` consecutive parts: 100 in 2 -> (0, 50), (50, 50)."""
    if shards < 1:
        raise ConfigError(f"evaluate: shards must be >= 1, got {shards}")
    shards = min(shards, episodes)
    bounds = [episodes * k // shards for k in range(shards + 1)]
    return [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(shards)]


def merge_shards(parts: list[Any]) -> Any:
    """One EvalSummary of consecutive parts (the first part's videos; wall time of the longest)."""
    from robo_rl.sim.rollout import EvalSummary

    if len(parts) == 1:
        return parts[0]
    episodes = sorted((e for p in parts for e in p.episodes), key=lambda e: e.seed)
    return EvalSummary(parts[0].task, episodes, parts[0].stage_names, max(p.wall_s for p in parts),
                       [v for p in parts for v in p.videos])


class one_thread:
    """torch on one CPU thread inside the block (the evaluation parts' setting), as before after it."""

    def __enter__(self) -> None:
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_num_threads(self.before)


def evaluate_parts(checkpoint: str, device: str, task: str, chunking: Mapping[str, Any], spans: list[tuple[int, int]],
                   n_envs: int, seed: int, out: str | None, videos: int) -> list[Any]:
    """The EvalSummary of each (first episode, episodes) part of a checkpoint's evaluation, one
    after the other on one thread: what an EvaluationProcess runs."""
    from robo_rl.policies import load_policy, read_checkpoint

    policy = load_policy(read_checkpoint(Path(checkpoint)), device=device)
    with one_thread():
        return run_parts(policy, task, chunking, spans, n_envs, seed, Path(out) if out else None, videos,
                         progress=False)


def run_parts(policy: Any, task: str, chunking: Mapping[str, Any], spans: list[tuple[int, int]], n_envs: int,
              seed: int, out: Path | None, videos: int, predict: Any = None, progress: bool = True) -> list[Any]:
    """The EvalSummary of each (first episode, episodes) part, one after the other: a part's noise
    seed is its first episode's, and only the part that starts at episode 0 records videos."""
    return [run_eval(policy, task, chunking, n, n_envs, seed + start, videos if start == 0 else 0, out,
                     count_recoveries=True, predict=predict, progress=progress)
            for start, n in spans]


class EvaluationProcess:
    """`evaluate_parts` in a spawned process (robo_rl/beside.py), while this one does other work;
    `parts()` waits for its EvalSummaries, `result()` for their row (evaluate_with_recoveries').
    The child exits when this process dies, and an error in it is raised here."""

    def __init__(self, checkpoint: Path, device: str, task: str, chunking: Mapping[str, Any],
                 spans: list[tuple[int, int]], n_envs: int, seed: int, out: Path | None, videos: int,
                 max_recoveries: int = 5):
        from robo_rl.beside import Beside

        self._out, self._max_recoveries = out, max_recoveries
        self._child = Beside(evaluate_parts, str(checkpoint), device, task, dict(chunking), spans, n_envs, seed,
                             str(out) if out is not None else None, videos)

    def parts(self) -> list[Any]:
        return self._child.result()

    def result(self) -> dict[str, Any]:
        return recovery_row(merge_shards(self.parts()), self._max_recoveries, self._out)

    def cancel(self) -> None:
        self._child.cancel()
