"""The simulated operator: the twin's stand-in for the human who intervenes during a policy
rollout in RaC (Hu et al. 2025, arXiv 2509.07953).

It watches with privileged state and takes over when failure looks imminent:
- stage regressed: a sub-task that was done came undone for `regress_s` (object dropped, lid
  knocked off). Not a one-stage dip while the hand still holds the sub-task's object: lowering a
  held cube into the box unsets "lifted" before "in box" is set, and that is placing, not failing;
- no progress: the stage has not advanced for longer than the demos' expert ever needs for it
  (`patience_factor` x its longest time in that stage over `patience_seeds` human-like demos), or
  for a fixed `patience_s` if set (shorter than the expert's own time, it takes over from a policy
  that is merely slow);
- grasp misaligned: a gripper the current sub-task needs has been closed for `grasp_s` seconds
  without holding its object.
- dead end (`lookahead`): the policy has just finished a sub-task, but from the state it left
  the expert, taking over now and keeping what the hands hold, could not finish the task (a peg
  lifted by its tip cannot go into the socket). A person sees that at a glance; the twin asks a
  copy of itself: the expert is played in a scratch copy of the physics until the task is done or
  its plan runs out (`dead_end_seen`). Once per sub-task the policy finishes.
- out of time (off by default): the episode nears its end with the task unfinished.
Then it follows the RaC rules:
1. RECOVERY: back to a familiar, in-distribution state for the sub-task already attempted: open
   grippers that hold nothing useful, lift away, return to the sub-task's pre-grasp pose (the
   first pose the demos' expert goes to for this stage). A hand still on the sub-task's object
   (a lid that tilted on the rim while being lowered) closes on it and lifts it back up instead;
   a hand holding what the lost stage did not need (a cube picked back out of its box) lets go.
   After a dead end every hand lets go, so the correction grips again where the demos grip.
   Only when the scene has gone wrong (a sub-task came undone, a grasp closed on air): after a
   stall nothing is out of place, so the operator corrects at once (`recover_on_stall=True`
   recovers anyway).
2. CORRECTION: complete the current sub-task with the expert, planned from where things are.
   After a regression that is the sub-task under way when things came undone: a lid dropped on
   the rim while being placed is corrected until it is seated, not only until it is lifted again.
3. END: when the sub-task is done (its stage advanced and held for `done_hold_s`; a contact that
   flickers as an object settles is not done), the episode ends. The task's time limit cuts a
   correction short (it then weighs 0) unless `finish_past_limit`: a person finishes the
   correction they started, so the limit ends only the policy's turn.

It gives up (ending "unreachable", which weighs 0 like a timeout) when its plan would move a joint
more than `max_joint_step` in one tick (the expert's IK flipping between solution branches for a
pose out of reach), and holds the last command instead of sending it.

It is a `robo_rl.rac.Operator`, the interface a human on a teleop device gets too: each tick
`signal` says take_over / recovery_done / correction_done (or nothing) and, while in control,
`command` gives the joints to send. `robo_rl.rac.InterventionController` owns the phase, the
labels, the END rule and the smooth switch of control.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from robo_rl.rac.intervention import (CORRECTION_DONE, PLAN_FINISHED, RECOVERY_DONE, TAKE_OVER, TIMEOUT, UNREACHABLE,
                                      OperatorEvent, Phase)
from robo_rl.sim.expert import ARMS, ExpertNoise, Pose, ScriptedExpert, Segment, arm_slice, grip_index
from robo_rl.sim.tasks import grasped, touching_any_finger


@dataclass
class OperatorConfig:
    patience_s: float | None = None  # no stage progress for this long -> take over (None: per stage, below)
    patience_factor: float = 1.5  # per-stage patience = this x the expert's longest time in the stage
    patience_seeds: int = 10  # human-like expert demos that time each stage
    min_patience_s: float = 2.0
    done_hold_s: float = 0.2  # the correction's stage advance must hold this long to count as done
    grasp_s: float = 0.6  # a needed gripper closed on nothing for this long -> take over
    closed_below: float = 0.3  # gripper command under this counts as closed
    regress: bool = True  # take over when a finished sub-task comes undone
    regress_s: float = 0.3  # ... for this long (shorter dips are contact flicker)
    lift_m: float = 0.08  # recovery: how far to lift away
    end_margin_s: float = 0.0  # > 0: take over this long before the time limit if unfinished (0: off;
    # the human-like expert itself may need all but the last 0.7 s of PackCube's 20 s)
    correction_timeout_s: float = 12.0  # give up a correction that has not finished by then
    finish_past_limit: bool = False  # a correction under way at the task's time limit goes on until it ends
    # (a person finishes what they started: the limit ends the policy's turn, not the operator's)
    max_joint_step: float = 0.6  # rad: give up when the plan would move an arm joint more in one tick
    lookahead: bool = True  # take over at a dead end: a finished sub-task the expert cannot go on from
    lookahead_settle_s: float = 0.5  # the look-ahead waits this long after the expert's plan ends
    recover: bool = True  # False (HG-DAgger's operator): correct at once, no recovery manoeuvre
    recover_on_stall: bool = False  # also recover after a "no progress" takeover (see the module docstring)
    expert_noise: ExpertNoise = field(default_factory=ExpertNoise)


def gripper_command(env, action: np.ndarray, arm: str) -> float:
    return float(action[grip_index(env.robot.spec, arm)])


def placing_dip(env, best: int, stage: int) -> bool:
    """`stage` is one below `best` while the hands that reached `best` still hold their objects
    (see the module docstring): part of the manipulation, not a sub-task lost."""
    targets = env.task.grasp_targets(best)
    return stage == best - 1 and bool(targets) and all(grasped(env.robot, geom, arm) for arm, geom in targets)


def closed_on_nothing(env, action: np.ndarray, arm: str, geom: str, closed_below: float) -> bool:
    """`action` closes `arm`'s gripper while its fingers do not hold `geom`."""
    return gripper_command(env, action, arm) < closed_below and not grasped(env.robot, geom, arm)


class SimOperator:
    """Watches a rollout of a BimanualEnv and intervenes (see the module docstring); implements
    `robo_rl.rac.Operator`, so an InterventionController drives it as it would a human."""

    name = "sim"

    def __init__(self, env, config: OperatorConfig | None = None, rng: np.random.Generator | None = None):
        self.env = env.unwrapped if hasattr(env, "unwrapped") else env
        self.cfg = config or OperatorConfig()
        self.rng = rng or np.random.default_rng(0)
        spec = self.env.robot.spec  # the arm joints in the 14-D command, for the give-up rule
        self._arm_joints = np.concatenate([np.arange(spec.action_dim)[arm_slice(spec, arm)] for arm in ARMS])
        if self.cfg.patience_s is not None:
            self.patience_s = (float(self.cfg.patience_s),) * len(self.env.task.stage_names)
        else:
            longest = expert_stage_seconds(self.env.task.name, self.cfg.patience_seeds)
            self.patience_s = tuple(max(self.cfg.min_patience_s, self.cfg.patience_factor * t) for t in longest)
        self.reset()

    def reset(self) -> None:
        """Before each episode."""
        self._step = 0
        self._watch_from(0)
        self._plan: ScriptedExpert | None = None
        self._plan_phase: Phase | None = None
        self._phase_start = 0
        self._stage_at_takeover = 0  # the correction is done once the stage is above this
        self._regressed = False
        self._dead_end = False
        self._recover_now = self.cfg.recover
        self._done_since: int | None = None
        self._seen = Phase.AUTONOMOUS
        self._unreachable = False
        self._sent: np.ndarray | None = None  # the policy's command of the tick before: the last one sent

    def _watch_from(self, stage: int) -> None:
        self._max_stage, self._stage_since = stage, self._step
        self._looked_at = stage  # the best stage the look-ahead has judged (the first is never judged)
        self._lost_steps = 0
        self._closed_empty: dict[str, int] = {}

    # ------------------------------------------------------------------ the Operator protocol
    def signal(self, phase: Phase, policy_action: np.ndarray | None) -> OperatorEvent | None:
        stage = self.env.task.stage(self.env.robot)
        last_sent, self._sent = self._sent, policy_action
        if phase != self._seen:
            if phase == Phase.AUTONOMOUS:  # HG-DAgger handed control back: watch afresh from here
                self._watch_from(stage)
                self._plan_phase = None  # the next takeover plans anew
            self._seen, self._phase_start, self._done_since = phase, self._step, None
        self._step += 1
        if self._unreachable and phase in (Phase.RECOVERY, Phase.CORRECTION):
            self._unreachable = False
            self._plan_phase = None  # a recovery cut short: the correction plans from here
            return OperatorEvent(RECOVERY_DONE if phase == Phase.RECOVERY else CORRECTION_DONE, UNREACHABLE)
        if phase == Phase.AUTONOMOUS:
            reason = self._failure(stage, policy_action, last_sent)
            if reason is not None:
                # the sub-task to complete: after a regression, the one that was under way when
                # things came undone (a lid dropped on the rim while placing is corrected until it
                # is seated, not only until it is lifted again); otherwise the current one
                self._regressed = reason.startswith("stage regressed")
                self._dead_end = reason.startswith("dead end")
                self._stage_at_takeover = self._max_stage if self._regressed else self._working_stage(stage)
                self._recover_now = self.cfg.recover and (self.cfg.recover_on_stall or not reason.startswith("no progress"))
                return OperatorEvent(TAKE_OVER, reason)
            return None
        if phase == Phase.RECOVERY:
            if not self._recover_now:
                return OperatorEvent(RECOVERY_DONE, "no recovery" if not self.cfg.recover else "already in a familiar state")
            if self._plan_phase == Phase.RECOVERY and self._plan.done:
                if not self._regressed:  # recovery may have let go of something: correct from there
                    self._stage_at_takeover = min(self._stage_at_takeover, stage)
                return OperatorEvent(RECOVERY_DONE)
            return None
        if phase == Phase.CORRECTION and self._plan_phase == Phase.CORRECTION:
            dt = 1.0 / self.env.robot.spec.control_hz
            if stage > self._stage_at_takeover and self._let_go(stage):
                self._done_since = self._step if self._done_since is None else self._done_since
                if (self._step - self._done_since) * dt >= self.cfg.done_hold_s:
                    return OperatorEvent(CORRECTION_DONE, "sub-task done")
            else:
                self._done_since = None
            if self._plan.done:
                return OperatorEvent(CORRECTION_DONE, PLAN_FINISHED)
            if (self._step - self._phase_start) * dt > self.cfg.correction_timeout_s:
                return OperatorEvent(CORRECTION_DONE, TIMEOUT)
        return None

    def command(self, phase: Phase, last_command: np.ndarray) -> np.ndarray:
        if self._plan_phase != phase:  # plan each phase from where things are when it begins
            stage = self.env.task.stage(self.env.robot)
            if phase == Phase.RECOVERY and not self._recover_now:
                return np.asarray(last_command, dtype=np.float32)  # the takeover tick: hold, then correct
            if phase == Phase.RECOVERY:
                self._plan = self._recovery_plan(stage, last_command)
            else:
                self._plan = self.env.task.expert(self.env.robot, self.rng, self.cfg.expert_noise, start_command=last_command)
            self._plan_phase = phase
        before = self._plan.command.copy()
        command = self._plan.act()
        arms = self._arm_joints
        if np.abs(self._plan.command[arms] - before[arms]).max() > self.cfg.max_joint_step:
            self._unreachable = True  # signalled next tick; this one holds still
            return np.asarray(last_command, dtype=np.float32)
        return command

    def _let_go(self, stage: int) -> bool:
        """No hand still holds what the finished sub-task placed, i.e. an object no arm needs in
        the new stage. A lid seated but still held is not done: a correction that ended there
        taught the policy to hold the lid on the box and never let go. A cube handed to the other
        arm is still needed, so a hand-over is done with both hands on it."""
        task, robot = self.env.task, self.env.robot
        needed_now = {geom for _, geom in task.grasp_targets(stage)}
        return not any(grasped(robot, geom, arm) for arm, geom in task.grasp_targets(self._stage_at_takeover)
                       if geom not in needed_now)

    # ------------------------------------------------------------------ detection
    def _working_stage(self, stage: int) -> int:
        """The stage whose sub-task is under way: the best reached during a placing dip."""
        return self._max_stage if placing_dip(self.env, self._max_stage, stage) else stage

    def _failure(self, stage: int, policy_action: np.ndarray | None, last_sent: np.ndarray | None) -> str | None:
        env, cfg = self.env, self.cfg
        dt = 1.0 / env.robot.spec.control_hz
        if stage > self._max_stage:
            self._max_stage, self._stage_since = stage, self._step
        lost = stage < self._max_stage and not placing_dip(env, self._max_stage, stage)
        self._lost_steps = self._lost_steps + 1 if lost else 0
        if cfg.regress and self._lost_steps * dt >= cfg.regress_s:
            return f"stage regressed from {env.task.stage_names[self._max_stage]} to {env.task.stage_names[stage]}"
        if cfg.lookahead and 0 < stage == self._max_stage > self._looked_at and stage < len(env.task.stage_names) - 1:
            self._looked_at = stage
            # from the command the state came from, not this tick's, which may already be the failure
            # (a hand opening on the cube it carries: that is a regression a few ticks on)
            # a whole episode's time: a dead end is a grip the expert cannot finish from, not one
            # it lacks the time for (that is the stall rule's and end_margin_s's)
            if not expert_finishes(env, env.max_steps, cfg.lookahead_settle_s, last_sent):
                return f"dead end: the expert cannot finish from {env.task.stage_names[stage]}"
        working = self._working_stage(stage)
        if (self._step - self._stage_since) * dt > self.patience_s[working]:
            return f"no progress in {env.task.stage_names[working]} for {self.patience_s[working]:.1f} s"
        if policy_action is not None:
            for arm, geom in env.task.grasp_targets(stage):
                empty = closed_on_nothing(env, policy_action, arm, geom, cfg.closed_below)
                self._closed_empty[arm] = self._closed_empty.get(arm, 0) + 1 if empty else 0
                if self._closed_empty[arm] * dt > cfg.grasp_s:
                    return f"{arm} gripper closed without holding {geom} (misaligned grasp)"
        steps_left = env.max_steps - self._step  # this operator's ticks in the episode
        if cfg.end_margin_s > 0 and steps_left * dt < cfg.end_margin_s and stage < len(env.task.stage_names) - 1:
            return f"{steps_left * dt:.1f} s left and the task is unfinished"
        return None

    # ------------------------------------------------------------------ recovery
    def _recovery_plan(self, stage: int, start: np.ndarray) -> ScriptedExpert:
        """Open what holds nothing useful, lift away, go to the sub-task's pre-grasp pose."""
        env, robot = self.env, self.env.robot
        holding = {arm for arm, geom in env.task.grasp_targets(stage) if grasped(robot, geom, arm)}
        # After a regression, a hand that holds an object the lost stage did not need (a cube picked
        # back out of the box it had been put in) lets go of it: that grasp is the failure. Kept, the
        # recovery closed on the cube in the box and lifted it out, re-enacting the failure under the
        # RECOVERY label (20 of 70 takeovers in a CPU demo round; docs/history.md, CPU demo row 24).
        let_go = set()
        if self._regressed:
            lost_stage_needs = set(env.task.grasp_targets(self._max_stage))
            let_go = {arm for arm, geom in env.task.grasp_targets(stage) if arm in holding and (arm, geom) not in lost_stage_needs}
            holding -= let_go
        # After a regression, a hand still on the sub-task's object with one finger (a lid being
        # lowered that tilted on the rim) keeps it: it closes, lifts it back up and holds it there
        # for the correction to place again, as a person would, instead of letting go and backing
        # away. (On PackCube, rounds with these lid corrections trained to 24-38% against 50%
        # without them; keeping the lid gave 24-32%: not the fix, docs/history.md "PackCube with slips and 30 s".)
        if self._dead_end:  # the grip itself is the failure: let go, grip again where the demos do
            let_go, holding = holding, set()
        kept = set()
        if self._regressed:
            kept = {arm for arm, geom in env.task.grasp_targets(stage) if touching_any_finger(robot, geom, arm)} - holding - let_go
        holding |= kept
        # An arm that the rest of the task never moves (PackCube without its lid: the left arm) stays
        # where it is. Lifted away, it stayed up for the whole correction, the demos never move it,
        # and a retrain on those rounds fell to 0%. (Planned with an rng of its own: which arms a
        # plan moves does not depend on its draws, and the operator's stream stays as it was.)
        rest = env.task.expert(robot, np.random.default_rng(0), ExpertNoise.none()).segments
        idle = {arm for arm in ARMS if all(getattr(seg, arm) is None for seg in rest)} - holding
        reference: dict[str, Segment | None] = {}

        def pregrasp(arm: str):
            """Where the demos' expert goes first for this stage, planned when recovery gets there
            (a dropped object may still be falling at takeover)."""
            def target() -> Pose | None:
                if arm in kept:
                    return None  # hold the lifted object where it is
                if "first" not in reference:
                    plan = env.task.expert(robot, self.rng, ExpertNoise.none())
                    reference["first"] = plan.segments[0] if plan.segments else None
                first = reference["first"]
                t = getattr(first, arm) if first is not None else None
                return t() if callable(t) else t
            return target

        def release(arm: str):
            return lambda: ScriptedExpert.hold(robot, arm, 0.0 if arm in holding else 1.0)

        def lift(arm: str):
            def target() -> Pose:
                pos, rot = ScriptedExpert.site_pose(robot, arm)
                return Pose(pos + [0, 0, self.cfg.lift_m], rot, 0.0 if arm in holding else 1.0)
            return target

        def moved(make, arm: str):  # an idle arm's target is None: it holds its last command
            return None if arm in idle else make(arm)

        segs = [
            Segment("recovery_release", 0.4, left=moved(release, "left"), right=moved(release, "right")),
            Segment("recovery_lift", 0.8, left=moved(lift, "left"), right=moved(lift, "right")),
            Segment("recovery_pregrasp", 1.0, left=moved(pregrasp, "left"), right=moved(pregrasp, "right")),
        ]
        return ScriptedExpert(robot, segs, self.rng, ExpertNoise.none(), start_command=start)


def expert_finishes(env, max_steps: int, settle_s: float = 0.5, start_command: np.ndarray | None = None) -> bool:
    """Would the scripted expert, taking over now from `start_command` (the last command sent) and
    keeping what the hands hold, finish the task within `max_steps` ticks? Played without noise in a
    scratch copy of the physics (the twin itself does not move), until the task is done or
    `settle_s` after the plan's last segment."""
    robot, task = env.robot, env.task
    scratch = robot.physics_copy()
    last = len(task.stage_names) - 1
    expert = task.expert(scratch, np.random.default_rng(0), ExpertNoise.none(), start_command=start_command)
    settle = int(round(settle_s * robot.spec.control_hz))
    for _ in range(max_steps):
        scratch.act(expert.act())
        if task.stage(scratch) == last:
            return True
        if expert.done:
            settle -= 1
            if settle < 0:
                return False
    return False


@functools.lru_cache(maxsize=None)
def expert_stage_seconds(task: str, seeds: int = 10) -> tuple[float, ...]:
    """The longest time (s) the scripted expert, with the demos' human-like variation, spends in
    each stage before reaching the next, over `seeds` episodes (seeds no collection uses). The
    last stage (done) gets the longest of the others. Cached per process."""
    from robo_rl.sim.envs import BimanualEnv

    env = BimanualEnv(task, obs_mode="state")
    dt = 1.0 / env.robot.spec.control_hz
    n = len(env.task.stage_names)
    longest = [0.0] * n
    for s in range(seeds):
        env.reset(seed=950_000 + s)
        expert = env.expert(ExpertNoise())
        stage, since = 0, 0
        for t in range(env.max_steps):
            _, _, terminated, truncated, info = env.step(expert.act())
            if info["max_stage"] > stage:
                longest[stage] = max(longest[stage], (t + 1 - since) * dt)
                stage, since = int(info["max_stage"]), t + 1
            if terminated or truncated:
                break
    env.close()
    longest[n - 1] = max(longest[: n - 1], default=0.0)
    return tuple(longest)


class RecoveryCounter:
    """Counts the recovery manoeuvres a policy performs on its own in one episode (for RaC's
    test-time-scaling measure): a sub-task that came undone for at least `lost_s` and was then
    redone (the stage fell below the best reached and climbed back to it; shorter dips are contact
    flicker as an object settles, and a placing dip is not a loss), and a grasp retried (a needed gripper closed on nothing for
    `grasp_s`, then opened again). Reads privileged state; never acts."""

    def __init__(self, env, config: OperatorConfig | None = None, lost_s: float = 0.5):
        self.env = env.unwrapped if hasattr(env, "unwrapped") else env
        self.cfg = config or OperatorConfig()
        self.lost_s = lost_s
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self._best = 0
        self._lost_steps = 0
        self._missed: dict[str, int] = {}

    def update(self, action: np.ndarray) -> None:
        """After each step, with the action that was executed."""
        env, cfg = self.env, self.cfg
        dt = 1.0 / env.robot.spec.control_hz
        stage = env.task.stage(env.robot)
        if stage >= self._best:
            if self._lost_steps * dt >= self.lost_s:
                self.count += 1  # redone what came undone
            self._lost_steps, self._best = 0, stage
        elif not placing_dip(env, self._best, stage):
            self._lost_steps += 1
        for arm, geom in env.task.grasp_targets(stage):
            if closed_on_nothing(env, action, arm, geom, cfg.closed_below):
                self._missed[arm] = self._missed.get(arm, 0) + 1
            else:
                if self._missed.get(arm, 0) * dt >= cfg.grasp_s and gripper_command(env, action, arm) >= cfg.closed_below:
                    self.count += 1  # a missed grasp, reopened to try again
                self._missed[arm] = 0
