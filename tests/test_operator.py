"""The simulated operator on deliberately failing policies, driven by the RaC intervention
controller as a human would be: takeover, RECOVERY, CORRECTION, END."""

import numpy as np
import pytest

from robo_rl.data.schema import Segment
from robo_rl.rac import InterventionConfig, InterventionController
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.expert import ExpertNoise
from robo_rl.sim.operator import OperatorConfig, SimOperator, expert_finishes, expert_stage_seconds

ARM_JOINTS = [i for i in range(14) if i not in (6, 13)]


def run(task, sabotage, seed=0, config=None, steps=None, mode="rac", noise=None):
    env = BimanualEnv(task, max_steps=steps)
    env.reset(seed=seed)
    policy = env.expert(noise or ExpertNoise.none())
    ctl = InterventionController(SimOperator(env, config, rng=np.random.default_rng(seed)), InterventionConfig(mode=mode))
    labels, actions, info = [], [], {}
    for k in range(steps or env.max_steps):
        a = sabotage(env, policy.act(), k)
        act, label = ctl.step(a, env.robot.time, env.task.stage(env.robot))
        labels.append(label)
        actions.append(act)
        _, _, term, trunc, info = env.step(act)
        if ctl.done or term or trunc:
            break
    ctl.finish()
    return env, ctl, labels, np.array(actions), info


def open_right_gripper_mid_transfer(env, a, k):
    if env.task.stage(env.robot) >= 1:
        a = a.copy()
        a[13] = 1.0
    return a


def test_dropped_cube_is_recovered_then_corrected_then_the_episode_ends():
    # more steps than the task's 400: the correction regrasps, lifts and then hands over
    env, ctl, labels, actions, info = run("transfer_cube", open_right_gripper_mid_transfer, steps=700)
    assert len(ctl.interventions) == 1, ctl.interventions
    rec = ctl.interventions[0]
    assert "regressed" in rec.reason and rec.ended == "sub-task done"
    assert rec.recovery_steps > 0 and rec.correction_steps > 0
    assert ctl.done
    # labels: POLICY, then RECOVERY, then CORRECTION, contiguous, in that order
    order = [labels[0]] + [b for a, b in zip(labels, labels[1:]) if a != b]
    assert order == [Segment.POLICY, Segment.RECOVERY, Segment.CORRECTION], order
    # the correction completed the sub-task under way when the cube fell (the hand-over), not
    # only the lift that came undone
    assert info["stage"] >= 2
    # the takeover is smooth: the first operator command continues from the last policy command
    first = labels.index(Segment.RECOVERY)
    assert np.abs(actions[first] - actions[first - 1])[ARM_JOINTS].max() < 0.03


def test_a_recovery_leaves_an_arm_the_task_never_uses_where_it_is():
    """PackCube without its lid: the cube is dropped mid-carry; the recovery lifts the right hand
    away and back to the cube, and the left arm, which the task never moves, keeps its command
    (lifted with the right, it stayed up through the correction, which the demos never show)."""
    def drop_cube(env, a, k):
        if env.task.stage(env.robot) == 1:
            a = a.copy()
            a[13] = 1.0
        return a

    env, ctl, labels, actions, info = run("pack_cube_nolid", drop_cube, steps=900)
    assert "regressed" in ctl.interventions[0].reason and ctl.interventions[0].recovery_steps > 20
    operated = np.array([lab in (Segment.RECOVERY, Segment.CORRECTION) for lab in labels])
    first = int(np.argmax(operated))
    left, right = slice(0, 6), slice(7, 13)
    assert np.abs(actions[operated][:, left] - actions[first - 1, left]).max() < 0.02, "the idle left arm moved"  # the jitter of the demos (0.002 rad), no lift
    assert np.abs(actions[operated][:, right] - actions[first - 1, right]).max() > 0.1, "the right arm recovered"
    assert info["stage"] >= 2


def test_a_cube_picked_back_out_of_its_box_is_let_go_and_the_latch_corrected():
    """PackCube without its lid: once the cube is in the box the policy closes on it again and
    lifts it out. The recovery lets go of it (it falls back into the box) instead of carrying it
    out, the failure itself; the correction then presses the latch."""
    def regrasp(env, a, k, seen={"in_box": False}):
        seen["in_box"] = seen["in_box"] or env.task.stage(env.robot) >= 2
        if seen["in_box"]:
            a = a.copy()
            a[13] = 0.0
        return a

    env, ctl, labels, actions, info = run("pack_cube_nolid", regrasp, steps=1000)
    rec = ctl.interventions[0]
    assert "regressed from cube_in_box" in rec.reason, rec.reason
    recovery = np.flatnonzero(np.array(labels) == Segment.RECOVERY)
    assert actions[recovery[:int(0.4 * env.robot.spec.control_hz)], 13].max() > 0.9, "the hand opens first"
    assert Segment.CORRECTION in labels and info["stage"] == 3  # latched: the episode ends with the task done


def test_a_policy_that_stalls_is_taken_over_for_lack_of_progress():
    frozen = {}

    def stall(env, a, k):  # reaches for the cube, then freezes in mid-air
        if k >= 40:
            return frozen.setdefault("a", a)
        return a

    env, ctl, labels, _, info = run("transfer_cube", stall, config=OperatorConfig(patience_s=1.5))
    assert "no progress" in ctl.interventions[0].reason
    assert ctl.interventions[0].time == pytest.approx(1.5, abs=0.05)  # patience counts from the last stage change (t = 0)
    assert Segment.CORRECTION in labels and info["stage"] >= 1 and ctl.done
    # a stall leaves nothing out of place: no recovery manoeuvre, only the held takeover tick
    assert ctl.interventions[0].recovery_steps <= 1
    _, ctl, labels, _, info = run("transfer_cube", stall, config=OperatorConfig(patience_s=1.5, recover_on_stall=True))
    assert ctl.interventions[0].recovery_steps > 20 and info["stage"] >= 1 and ctl.done


def test_a_grasp_closing_on_nothing_is_taken_over():
    def grab_air(env, a, k):  # closes the right gripper high above the cube
        a = a.copy()
        if k >= 30:
            a[13] = 0.0
        return a

    env, ctl, labels, _, info = run("transfer_cube", grab_air, config=OperatorConfig(grasp_s=0.5))
    assert "misaligned grasp" in ctl.interventions[0].reason
    assert ctl.done and info["stage"] >= 1


def gripping(along):
    """A policy that grips Insertion's peg `along` metres from where the demos grip it (toward the
    tip when negative: 2 cm is 8 cm from the tip, from where the expert itself never inserts)."""
    return {**ExpertNoise.none().__dict__, "grasp_along": (along, along)}


def no_change(env, a, k):
    return a


def test_a_peg_lifted_by_its_tip_is_a_dead_end_let_go_and_gripped_again():
    env, ctl, labels, actions, info = run("insertion", no_change, steps=900, noise=ExpertNoise(**gripping(-0.02)))
    rec = ctl.interventions[0]
    assert rec.reason.startswith("dead end") and "both_lifted" in rec.reason, rec.reason
    # recovery: the right hand opens (lets the peg go) before the correction grips again
    recovery = actions[np.array(labels) == Segment.RECOVERY]
    assert recovery[:, 13].max() > 0.9 and recovery[:, 6].max() > 0.9
    assert rec.ended == "sub-task done" and ctl.done and info["stage"] >= 1
    # the correction's grip is one the expert can finish from, which the policy's was not
    assert expert_finishes(env.unwrapped, 400)
    # HG-DAgger's operator sees the same dead end; it corrects at once, without the recovery
    _, ctl, _, _, _ = run("insertion", no_change, steps=200, noise=ExpertNoise(**gripping(-0.02)), mode="hg_dagger",
                         config=OperatorConfig(recover=False))
    assert ctl.interventions[0].reason.startswith("dead end") and ctl.interventions[0].recovery_steps <= 1


def test_a_peg_gripped_where_the_demos_grip_it_is_left_to_the_policy():
    env, ctl, labels, _, info = run("insertion", no_change, noise=ExpertNoise(**gripping(0.0)))
    assert not ctl.interventions and info["success"] and set(labels) == {Segment.POLICY}


@pytest.mark.slow  # ~19 s (AMD EPYC, AVX2); the dropped-cube test covers recovery then correction by default
def test_long_horizon_lid_knocked_off_is_corrected():
    """PackCube: the policy lets go of the lid in mid-air; the operator recovers and re-seats it."""
    def drop_lid(env, a, k):
        if env.task.stage(env.robot) == 3 and env.task.lid_lifted(env.robot):
            a = a.copy()
            a[6] = 1.0
        return a

    env, ctl, labels, _, info = run("pack_cube", drop_lid, seed=1)
    rec = ctl.interventions[0]
    assert rec.stage <= 2 and rec.recovery_steps > 0
    assert ctl.done
    # the correction completes the sub-task that was under way (placing), not just the re-lift,
    # and it is done only once the hand has let go of the seated lid: a correction that ended
    # with the lid still held taught the policy to hold it on the box and never let go
    assert rec.ended == "sub-task done" and info["stage"] >= 4
    from robo_rl.sim.tasks import grasped

    assert not grasped(env.robot, "lid_handle", "left")


@pytest.mark.slow  # 21 s (AMD EPYC, AVX2 only): PackCube's lid, a GPU-size path; the default run keeps the cube's recoveries
def test_a_lid_tilted_on_the_rim_in_hand_is_lifted_back_up_not_let_go():
    """PackCube: the policy lowers the lid off to one side, so it tilts on the rim with one finger
    still on the handle. The recovery keeps the lid (closes and lifts it back up) instead of
    letting go and backing away, and the correction seats it."""
    from robo_rl.sim.tasks import body_pos, grasped

    def lower_off_target(env, a, k):
        if env.task.stage(env.robot) == 3 and body_pos(env.robot, "lid")[2] < 0.1:
            a = a.copy()
            a[1] -= 0.2  # left shoulder: the lid comes down beside the box's centre
        return a

    env, ctl, labels, actions, info = run("pack_cube", lower_off_target, seed=2, steps=1500)
    rec = ctl.interventions[0]
    assert "regressed" in rec.reason and rec.recovery_steps > 0, rec
    recovery = np.array([label == Segment.RECOVERY for label in labels])
    assert actions[recovery, 6].max() < 0.5  # the left gripper never opened during the recovery
    assert rec.ended == "sub-task done" and info["stage"] >= 4
    assert not grasped(env.robot, "lid_handle", "left")


def test_hg_dagger_hands_control_back_to_the_policy():
    """The baseline: after the correction the policy drives again (POLICY steps follow the
    intervention), and a second failure is taken over again."""
    frozen = {}

    def stall(env, a, k):  # freezes in mid-air, and goes back there whenever it gets control
        return frozen.setdefault("a", a) if k >= 40 else a

    env, ctl, labels, _, info = run("transfer_cube", stall, mode="hg_dagger", steps=600,
                                    config=OperatorConfig(patience_s=1.5))
    assert not ctl.done
    first_correction = labels.index(Segment.CORRECTION)
    assert Segment.POLICY in labels[first_correction:]  # control came back
    # back in control, the policy returns to its frozen pose and drops the cube: a second takeover
    assert len(ctl.interventions) >= 2 and all(r.ended for r in ctl.interventions)


def test_recovery_counter_counts_a_redone_sub_task_not_contact_flicker():
    """A clean expert run counts no recovery manoeuvre (objects settling make the stage flicker);
    a policy that drops the cube and, re-planning from there, picks it up again counts one."""
    from robo_rl.sim.operator import RecoveryCounter

    env = BimanualEnv("transfer_cube")
    env.reset(seed=0)
    expert, counter = env.expert(ExpertNoise.none()), RecoveryCounter(env)
    for _ in range(env.max_steps):
        _, _, term, trunc, info = env.step(expert.act())
        counter.update(info["executed_action"])
        if term or trunc:
            break
    assert info["success"] and counter.count == 0

    env = BimanualEnv("transfer_cube", max_steps=800)  # time for a second attempt
    env.reset(seed=0)
    expert, counter, dropped_at = env.expert(ExpertNoise.none()), RecoveryCounter(env), None
    for k in range(env.max_steps):
        a = expert.act()
        if dropped_at is None and env.task.stage(env.robot) >= 1:
            dropped_at = k
        if dropped_at is not None and k < dropped_at + 40:
            a = a.copy()
            a[13] = 1.0  # let go for 0.8 s
        if dropped_at is not None and k == dropped_at + 40:
            expert = env.expert(ExpertNoise.none(), start_command=a)  # retry from where things are
        _, _, term, trunc, info = env.step(a)
        counter.update(info["executed_action"])
        if term or trunc:
            break
    assert info["success"] and counter.count == 1


def test_hg_dagger_operator_plans_each_correction_afresh():
    """HG-DAgger's operator (no recovery) corrects from where things are at each takeover, never
    resuming the plan of an earlier correction."""
    env = BimanualEnv("transfer_cube", max_steps=800)
    env.reset(seed=0)
    policy = env.expert(ExpertNoise.none())
    op = SimOperator(env, OperatorConfig(recover=False), rng=np.random.default_rng(0))
    ctl = InterventionController(op, InterventionConfig(mode="hg_dagger"))
    plans = []
    for k in range(env.max_steps):
        act, label = ctl.step(open_right_gripper_mid_transfer(env, policy.act(), k), env.robot.time, env.task.stage(env.robot))
        if label == Segment.CORRECTION and (not plans or plans[-1][0] != len(ctl.interventions)):
            plans.append((len(ctl.interventions), op._plan))
        _, _, term, trunc, _ = env.step(act)
        if term or trunc:
            break
    assert len(ctl.interventions) >= 2 and all(r.recovery_steps <= 1 for r in ctl.interventions)
    assert len({id(p) for _, p in plans}) == len(plans)


def test_no_takeover_while_a_human_like_expert_drives_the_long_horizon_task():
    """The per-stage patience comes from the demos' own expert timing, so a policy as slow as the
    slowest demo is never taken over (a fixed 4 s patience did, in the first stages)."""
    for seed in (3, 4):
        env = BimanualEnv("pack_cube")
        env.reset(seed=seed)
        expert = env.expert(ExpertNoise())
        op = SimOperator(env, rng=np.random.default_rng(seed))
        longest = expert_stage_seconds("pack_cube", op.cfg.patience_seeds)
        assert len(op.patience_s) == len(env.task.stage_names) and all(p > t for p, t in zip(op.patience_s, longest))
        ctl = InterventionController(op)
        info = {}
        for _ in range(env.max_steps):
            act, label = ctl.step(expert.act(), env.robot.time, env.task.stage(env.robot))
            _, _, term, trunc, info = env.step(act)
            if term or trunc:
                break
        assert ctl.interventions == [], ctl.interventions
        assert info["success"]


def knock_cube_to(xy, at_step=60):
    """Moves the cube (the scene's first free body) to `xy` on the table at `at_step`."""
    import mujoco

    def knock(env, a, k):
        if k == at_step:
            model, data = env.robot.model, env.robot.data
            free = next(i for i in range(model.njnt) if model.jnt_type[i] == mujoco.mjtJoint.mjJNT_FREE)
            data.qpos[model.jnt_qposadr[free]:model.jnt_qposadr[free] + 2] = xy
            data.qvel[model.jnt_dofadr[free]:model.jnt_dofadr[free] + 6] = 0.0
            mujoco.mj_forward(model, data)
        return a
    return knock


def test_a_pose_out_of_reach_is_given_up_not_jumped_to():
    """The expert's IK, sent to a cube knocked beyond the arm's reach, flips between solution
    branches (joint jumps of up to 2 pi in a tick): the operator gives up instead, holds still,
    and the correction ends "unreachable", an unfinished ending that weighs 0 in training."""
    from robo_rl.rac.intervention import UNFINISHED_ENDINGS, UNREACHABLE

    def largest_operator_step(labels, actions):
        operator = np.isin([int(x) for x in labels[1:]], [int(Segment.RECOVERY), int(Segment.CORRECTION)])
        return np.abs(np.diff(actions[:, ARM_JOINTS], axis=0)).max(1)[operator].max()

    knock = knock_cube_to(np.array([-0.55, 0.3]))
    _, ctl, labels, actions, _ = run("transfer_cube", knock, steps=600, config=OperatorConfig(max_joint_step=100.0))
    assert largest_operator_step(labels, actions) > 2.0  # what the limit is for
    _, ctl, labels, actions, _ = run("transfer_cube", knock, steps=600)
    assert [r.ended for r in ctl.interventions] == [UNREACHABLE] and UNREACHABLE in UNFINISHED_ENDINGS
    assert largest_operator_step(labels, actions) < 0.6 and ctl.done


def test_end_margin_counts_the_episodes_ticks_when_the_twin_steps_it():
    # the episode loop steps a TaskTwin, not env.step: the operator counts the episode's ticks itself
    from robo_rl.sim.envs import TaskTwin

    env = BimanualEnv("transfer_cube", max_steps=100)
    twin = TaskTwin(env)
    twin.reset(0)
    policy = env.expert(ExpertNoise.none())  # 2 s is too short for the hand-over
    op = SimOperator(env, OperatorConfig(end_margin_s=0.5, lookahead=False), rng=np.random.default_rng(0))
    ctl = InterventionController(op, InterventionConfig(mode="rac"))
    for _ in range(100):
        act, _ = ctl.step(policy.act(), env.robot.time, env.task.stage(env.robot))
        twin.act(act)
        if ctl.in_control:
            break
    assert ctl.interventions and "left and the task is unfinished" in ctl.interventions[0].reason
    assert ctl.interventions[0].time == pytest.approx(1.5, abs=0.05)


def test_a_correction_that_finishes_the_task_is_labelled_task_done_not_cut_short():
    # The twin's episode ends on success, before the operator's done-hold: a correction that
    # finished the whole task must not read as one the time limit cut short (which weighs 0).
    from robo_rl.rac.intervention import TASK_DONE, UNFINISHED_ENDINGS
    from robo_rl.runtime.episodes import ControllerConfig, Episode, run_episodes
    from robo_rl.runtime.sources import Interventions, PerRobot
    from robo_rl.sim.envs import TaskTwin

    env = BimanualEnv("transfer_cube", max_steps=600)  # room for a 3-s patience after the hand-over
    twin = TaskTwin(env)

    class StallsAtTheLastStage:  # the expert until the cube is handed over, then it holds still
        def begin(self):
            self.expert, self.held = env.expert(ExpertNoise.none()), None

        def action(self, deadline, history, report):
            if self.held is None:
                a = self.expert.act()
                if env.task.stage(env.robot) >= 2:
                    self.held = a
                return a
            return self.held

        def close(self):
            pass

    class Hooks:
        outcome, episodes = None, 0

        def start(self, i):
            if self.episodes:
                return None
            self.episodes += 1
            twin.reset(0)
            return Episode()

        def step(self, i, obs, executed, segment, outcome):
            pass

        def end(self, i, report, outcome):
            self.outcome = outcome

    op = SimOperator(env, OperatorConfig(patience_s=3.0, lookahead=False), rng=np.random.default_rng(0))
    ctl = InterventionController(op, InterventionConfig(mode="rac"))
    hooks = Hooks()
    run_episodes([twin], Interventions(PerRobot([StallsAtTheLastStage()]), [ctl],
                                       [lambda: env.task.stage(env.robot)]),
                 ControllerConfig(hz=env.robot.spec.control_hz), hooks, lockstep=True)
    assert hooks.outcome.success and not ctl.done  # success ended it, before the correction's done-hold
    assert len(ctl.interventions) == 1 and "no progress" in ctl.interventions[0].reason
    rec = ctl.interventions[0]
    assert rec.correction_steps > 0 and rec.ended == TASK_DONE and TASK_DONE not in UNFINISHED_ENDINGS
