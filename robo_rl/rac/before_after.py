"""The before/after experiment `robo-rl demo` runs: pre-train a policy on demos, evaluate it, run
RaC rounds with it (robo_rl/rac/experiment.py), train the control the same way on the demos
alone, and evaluate both on the pre-trained policy's seeds: three rows and a verdict.

Like the rounds, it never touches the twin: the verb passes how a round collects, how a policy is
evaluated, and (optionally) how the pre-trained policy is evaluated in a second process beside
the first round. Every stage goes through `Stages`, so that `resume=true` goes on where a killed
run stopped (a training from its last checkpoint).

The control answers "the new data, or just more training?". Retrained from fresh weights with
the pre-training's recipe, steps and seed, training on the demos alone is the pre-training
itself: the control's row is then the pre-trained one. Fine-tuned, the control is the same
fine-tune on the demos alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from robo_rl.rac.experiment import Collect, Rounds, Stages, gain_verdict, run_rounds, trained


@dataclass
class BeforeAfter:
    """What the experiment trains and where it writes."""

    out: Path
    demos: Path
    n_demos: int
    pretrain: Any  # LearnerConfig of the pre-training
    train: Any  # LearnerConfig of each round's training and of the control's
    rounds: int
    from_scratch: bool  # each round retrains from fresh weights; false: fine-tunes the pre-trained ones
    composition: Any  # CompositionConfig of each round's training data
    device: str
    checkpoint_extra: Mapping[str, Any]  # metadata the pre-training's checkpoints carry (task, obs keys, ...)


class EvaluateRow(Protocol):
    def __call__(self, policy: Any, name: str, checkpoint: Path) -> dict[str, Any]:
        """`policy` (saved at `checkpoint`) on the experiment's fixed seeds, its outputs under a
        folder named after `name`: a row with at least success_rate, ci95_low and ci95_high."""


class PendingRow(Protocol):
    """An evaluation running elsewhere (another process): its row when it is done."""

    def result(self) -> dict[str, Any]: ...

    def cancel(self) -> None: ...


def run_before_after(plan: BeforeAfter, policy: Any, sample: Callable[..., Any], collect: Collect,
                     evaluate: EvaluateRow, stages: Stages, resume: bool,
                     evaluate_beside: Callable[[Path], PendingRow] | None = None,
                     control_beside: bool = False) -> dict[str, Any]:
    """Pre-train `policy` on batches from `sample(batch_size, generator, weighted)`, then the rounds
    and the control. `control_beside`: on a CPU, fine-tune the control in a second process beside
    the round's fine-tune, one thread each (one round only). Returns the three rows (before,
    control, after), the verdict, each round's collection counts and the stages run beside."""
    from robo_rl.beside import Beside
    from robo_rl.learn import Learner, last_checkpoint
    from robo_rl.policies import load_policy, read_checkpoint
    from robo_rl.policies.inference import predictor

    out = plan.out
    pre_last = last_checkpoint(out / "pretrain")

    def pretrain() -> dict[str, Any]:
        print(f"2/6 pre-train a flow policy ({sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params) on "
              f"{plan.n_demos} demos, {plan.pretrain.steps} steps")
        trainer = Learner(policy, plan.pretrain, out / "pretrain", sample, extra=dict(plan.checkpoint_extra))
        if resume and trainer.resume_from_last():
            print(f"   resumed at step {trainer.step}")
        return trained(trainer.fit())

    stages.run("2 pre-train", pretrain)
    ckpt = read_checkpoint(pre_last)
    base = load_policy(ckpt, device=plan.device)

    # 5. the control, the same training on the demos alone: after the rounds, or beside the round's
    # fine-tune once its rollouts are in (on a 2-core CPU two one-thread trainings side by side end
    # sooner than one after the other on both threads: docs/results.md, "RaC with a camera policy")
    control_rounds = Rounds("no_new_data", 1, ckpt, [(plan.demos, plan.n_demos)], lambda r: out / "control",
                            lambda r: out / "control", plan.train, plan.composition, False, plan.device,
                            stage_names=("", "5 {how}, control", ""))
    control_stage = control_rounds.stage(1, 1)
    # 3-4. the rounds: each collects with the policy of the round before and trains on the demos
    # plus every intervention so far
    rounds = Rounds("rac", plan.rounds, ckpt, [(plan.demos, plan.n_demos)], lambda r: out / "interventions" / f"round{r}",
                    lambda r: out / f"rac-round{r}", plan.train, plan.composition, plan.from_scratch, plan.device)
    beside = (control_beside and not plan.from_scratch and plan.rounds == 1 and plan.device == "cpu"
              and not {control_stage, rounds.stage(1, 1)} & set(stages.done))
    if beside:
        rounds, control_rounds = (replace(r, learner=replace(plan.train, threads=1)) for r in (rounds, control_rounds))
    control_pending: PendingRow | None = None
    # the pre-trained policy's row: evaluated beside round 1 where the caller can (the twin steps
    # on one core each), and taken after the round's rollouts
    pending: PendingRow | None = None
    if evaluate_beside is not None and not {"2 evaluate pre-trained", rounds.stage(0, 1)} & set(stages.done):
        pending = evaluate_beside(pre_last)
    pretrained_beside = pending is not None
    before: dict[str, Any] | None = None
    if pending is None:
        before = stages.run("2 evaluate pre-trained", lambda: evaluate(base, "pretrained", pre_last))

    def after_collect(r: int) -> None:
        nonlocal pending, before, control_pending
        if pending is not None:
            print("   the pre-trained policy's evaluation, beside the round: waiting for it")
            before = stages.run("2 evaluate pre-trained", pending.result)
            pending = None
        if beside:
            print(f"5/6 control: fine-tune on the demos alone, no new data, {plan.train.steps} steps, in a second "
                  "process beside the round's fine-tune (one thread each)")
            control_pending = Beside(train_control, str(pre_last), [(str(plan.demos), plan.n_demos)], plan.composition,
                                     control_rounds.learner, str(out / "control"), resume)

    try:
        after_policy, round_rows = run_rounds(rounds, base, predictor(base), collect, stages=stages, resume=resume,
                                              after_collect=after_collect, predictor=predictor)
        if control_pending is not None:
            print("   the control's fine-tune, beside it: waiting for it")
            stages.run(control_stage, control_pending.result)
    except BaseException:
        for child in (pending, control_pending):
            if child is not None:
                child.cancel()
        raise
    assert before is not None  # after_collect ran

    if plan.from_scratch:
        print("5/6 control: retraining on the demos alone is the pre-training itself (same recipe, steps and seed)")
    elif control_pending is not None:
        control_policy = load_policy(read_checkpoint(last_checkpoint(out / "control")), device=plan.device)
    else:
        print(f"5/6 control: fine-tune on the demos alone, no new data, {plan.train.steps} steps")
        control_policy, _ = run_rounds(control_rounds, base, None, collect, stages=stages, resume=resume)

    # 6. both on the pre-trained policy's seeds
    print(f"6/6 evaluate after RaC{'' if plan.from_scratch else ' and the control'}")
    after = stages.run("6 evaluate after RaC", lambda: evaluate(
        after_policy, "after-rac", last_checkpoint(out / f"rac-round{plan.rounds}")))
    control = before if plan.from_scratch else stages.run("6 evaluate control", lambda: evaluate(
        control_policy, "control", last_checkpoint(out / "control")))
    return {"before": before, "control": control, "after": after, "control_is_pretraining": plan.from_scratch,
            "verdict": gain_verdict(before, control, after),
            "rounds": [{"round": row["round"], "collect": row["collect"], "operator_samples": row["operator_samples"]}
                       for row in round_rows],
            "operator_samples": round_rows[-1]["operator_samples"],
            # the stages that ran in a second process, by stage name: their time is the wait after the round
            "beside": {**({"2 evaluate pre-trained": "beside round 1"} if pretrained_beside else {}),
                       **({control_stage: "beside round 1's fine-tune"} if control_pending is not None else {})}}


def train_control(checkpoint: str, demos: list[tuple[str, int | None]], composition: Any, learner: Any,
                  run_dir: str, resume: bool) -> dict[str, Any]:
    """The control's fine-tune as a second process runs it (`control_beside`): what `run_rounds`
    trains for the no_new_data method, with its stage's result."""
    from robo_rl.policies import read_checkpoint
    from robo_rl.rac.finetune import finetune

    return trained(finetune(read_checkpoint(Path(checkpoint)), demos, [], composition, learner, run_dir,
                            progress=False, resume=resume)[1])
