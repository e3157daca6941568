"""RaC's intervention state machine: transitions, labels, the END rule, ignored events, and a
switch of control without a jump in the commanded joints."""

import numpy as np
import pytest

from robo_rl.data.schema import Segment
from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.rac import InterventionConfig, InterventionController, OperatorEvent, Phase


class ScriptedKeys:
    """A human at a keyboard, as a script: {tick: event} and a fixed far-away leader-arm pose."""

    name = "keys"

    def __init__(self, events: dict[int, str], pose: np.ndarray):
        self.events, self.pose, self.tick = events, pose, 0

    def signal(self, phase, policy_action):
        kind = self.events.get(self.tick)
        self.tick += 1
        return OperatorEvent(kind, "pressed") if kind else None

    def command(self, phase, last_command):
        return self.pose


def drive(events, mode="rac", ticks=40, max_step=0.05):
    pose = np.full(3, 1.0, np.float32)
    ctl = InterventionController(ScriptedKeys(events, pose), InterventionConfig(mode=mode, max_step=max_step))
    labels, out = [], []
    for k in range(ticks):
        if ctl.done:
            break
        a, label = ctl.step(np.zeros(3, np.float32), time=k * 0.02, stage=k // 10)
        labels.append(label)
        out.append(a)
    return ctl, labels, np.array(out)


def test_rac_transitions_labels_and_end():
    ctl, labels, out = drive({5: "take_over", 12: "recovery_done", 20: "correction_done"})
    assert ctl.done and ctl.phase == Phase.END
    assert labels[:5] == [Segment.POLICY] * 5
    assert labels[5:12] == [Segment.RECOVERY] * 7
    assert labels[12:20] == [Segment.CORRECTION] * 8
    assert len(labels) == 21  # END: the tick the correction ends is the last; no policy step follows
    assert Segment.POLICY not in labels[5:]
    (rec,) = ctl.interventions
    assert (rec.step, rec.stage, rec.reason, rec.recovery_steps, rec.correction_steps) == (5, 0, "pressed", 7, 8)
    assert rec.time == pytest.approx(0.1) and rec.ended == "pressed"
    with pytest.raises(RoboRLError, match="ended"):
        ctl.step(np.zeros(3))


def test_takeover_and_handback_are_smooth():
    """The operator's pose is 1 rad away: the output walks there at max_step per tick, never
    jumps; under HG-DAgger the hand-back to the policy (at 0) is rate-limited the same way."""
    ctl, labels, out = drive({5: "take_over", 30: "recovery_done", 32: "correction_done"}, mode="hg_dagger",
                             ticks=60, max_step=0.05)
    steps = np.abs(np.diff(out, axis=0)).max(axis=1)
    assert steps.max() <= 0.05 + 1e-6
    assert out[5 + 20 - 1, 0] == pytest.approx(1.0)  # caught up after 20 ticks of 0.05, then follows exactly
    assert labels[33] == Segment.POLICY and out[-1, 0] == pytest.approx(0.0)  # control came back, output reached it
    assert not ctl.done and len(ctl.interventions) == 1


def test_events_out_of_phase_are_ignored_and_counted():
    ctl, labels, _ = drive({2: "correction_done", 3: "recovery_done", 4: "take_over", 6: "take_over", 9: "recovery_done",
                            11: "correction_done"})
    assert ctl.done and len(ctl.interventions) == 1
    assert [(s, e) for s, e, _ in ctl.ignored_events] == [(2, "correction_done"), (3, "recovery_done"), (6, "take_over")]


def test_hg_dagger_limit_and_unfinished_intervention():
    ctl, labels, _ = drive({1: "take_over", 2: "recovery_done", 3: "correction_done", 5: "take_over"}, mode="hg_dagger",
                           ticks=10)
    assert len(ctl.interventions) == 2 and ctl.in_control
    ctl.finish()  # time ran out during the second one
    assert ctl.interventions[1].ended == "episode_end"
    pose = np.ones(3, np.float32)
    c = InterventionController(ScriptedKeys({1: "take_over", 2: "recovery_done", 3: "correction_done", 5: "take_over"}, pose),
                               InterventionConfig(mode="hg_dagger", max_interventions=1))
    for k in range(10):
        c.step(np.zeros(3))
    assert len(c.interventions) == 1 and c.ignored_events == [(5, "take_over", "autonomous")]


def test_bad_intervention_config_is_a_one_line_error():
    with pytest.raises(ConfigError, match="mode='dagger'"):
        InterventionConfig(mode="dagger")
