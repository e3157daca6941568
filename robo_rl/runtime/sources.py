"""Action sources for the Controller besides a bare policy (PolicyChunks, in controller.py):

    OperatorCommands  a human on a teleop device commands every tick (robo-rl teleop / record)
    Interventions     a policy drives and a human may take over: the RaC protocol's arbitration,
                      each tick labelled POLICY, RECOVERY or CORRECTION, for one robot or many
                      (robo-rl record checkpoint=, and the twin's intervention collection)
    RecordedActions   a recorded episode's actions played back at their rate (robo-rl replay robot=)

OperatorCommands and RecordedActions command one robot (the episode loop wraps them in PerRobot)
and have `segment`, the label of the action they gave last; Interventions is Sources for many
robots (robo_rl/runtime/episodes.py), with `segment(i)`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import Segment
from robo_rl.rac.intervention import InterventionController, Phase
from robo_rl.runtime.controller import ControllerReport


class OperatorCommands:
    """An Operator (robo_rl.rac.intervention.Operator: `signal` then `command` each tick) in
    control for the whole run. Its first command continues from where the robot is."""

    segment = Segment.TELEOP

    def __init__(self, operator: Any):
        self.operator = operator
        self._last: np.ndarray | None = None

    def begin(self) -> None:
        self._last = None  # a new episode continues from where the robot is then

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray:
        if self._last is None:
            self._last = np.asarray(history[-1].qpos, dtype=np.float32)
        self.operator.signal(Phase.CORRECTION, None)  # polls the device; RaC events mean nothing here
        self._last = np.asarray(self.operator.command(Phase.CORRECTION, self._last), dtype=np.float32)
        return self._last

    def close(self) -> None:
        pass


class Interventions:
    """A policy (Sources: LockstepChunks in the twin, PerRobot(PolicyChunks) on a real robot)
    under one InterventionController per robot: the operator takes over when it signals so, and
    the controller decides who commands each tick and how the step is labelled. `ended(i)` turns
    true at RaC's END (the correction is done): the episode stops there. The same code runs the
    twin's simulated operator and a human on real arms."""

    def __init__(self, policy: Any, controllers: Sequence[InterventionController],
                 stages: Sequence[Callable[[], int] | None] | None = None):
        self.policy, self.controllers = policy, list(controllers)
        n = len(self.controllers)
        self.stages = list(stages) if stages is not None else [None] * n
        # A thread-predicting policy keeps predicting while the human drives, so a hand-back
        # (HG-DAgger) finds a chunk ready; one computed in the tick is asked only for the robots
        # it drives, and plans afresh at a hand-back.
        self.plan_while_operating = bool(getattr(policy, "asynchronous", True))
        self._t0: list[float | None] = [None] * n
        self._last: list[np.ndarray | None] = [None] * n
        self._segments = [Segment.POLICY] * n

    def begin(self, i: int) -> None:
        self.policy.begin(i)
        self.controllers[i].reset()
        self._t0[i], self._last[i], self._segments[i] = None, None, Segment.POLICY

    def actions(self, deadline: float, histories: Mapping[int, list[Any]],
                reports: Mapping[int, ControllerReport]) -> dict[int, np.ndarray]:
        ctls = self.controllers
        asked = histories if self.plan_while_operating else {i: h for i, h in histories.items() if not ctls[i].in_control}
        proposed = self.policy.actions(deadline, asked, reports) if asked else {}
        out = {}
        for i, history in histories.items():
            if self._t0[i] is None:
                self._t0[i], self._last[i] = deadline, np.asarray(history[-1].qpos, dtype=np.float32)
            ctl, was_operator = ctls[i], ctls[i].in_control
            policy_action = proposed.get(i)
            if policy_action is None and not was_operator:
                policy_action = self._last[i]  # no chunk yet: hold, and count it as the loop would
                reports[i].missing_actions += 1
            stage = self.stages[i]() if self.stages[i] is not None else -1
            command, self._segments[i] = ctl.step(policy_action, time=deadline - self._t0[i], stage=stage)
            if was_operator and not ctl.in_control and not ctl.done and not self.plan_while_operating:
                self.policy.begin(i)  # the hand-back: the policy plans from here
            self._last[i] = out[i] = np.asarray(command, dtype=np.float32)
        return out

    def segment(self, i: int) -> Segment:
        return self._segments[i]

    def ended(self, i: int) -> bool:
        return self.controllers[i].done

    def end(self, i: int, task_done: bool) -> None:
        self.controllers[i].finish(task_done)

    def latencies(self) -> list[float]:
        return self.policy.latencies()

    def close(self) -> None:
        self.policy.close()


class RecordedActions:
    """Recorded absolute joint commands, one per tick. First `approach_ticks` ticks move linearly
    from where the robot is to the first recorded action, so playback never starts with a jump."""

    segment = Segment.TELEOP

    def __init__(self, actions: np.ndarray, approach_ticks: int = 100):
        self.actions = np.asarray(actions, dtype=np.float32)
        self.approach_ticks = int(approach_ticks)
        self.tick = 0
        self._start: np.ndarray | None = None

    @property
    def ended(self) -> bool:
        return self.tick >= self.approach_ticks + len(self.actions)

    @property
    def played(self) -> int | None:
        """The index of the recorded action given last; None while approaching."""
        k = self.tick - 1 - self.approach_ticks
        return k if 0 <= k < len(self.actions) else None

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        if self._start is None:
            self._start = np.asarray(history[-1].qpos, dtype=np.float32)
        k, self.tick = self.tick, self.tick + 1
        if k < self.approach_ticks:
            w = (k + 1) / self.approach_ticks
            return (1 - w) * self._start + w * self.actions[0]
        k -= self.approach_ticks
        return self.actions[k] if k < len(self.actions) else None

    def close(self) -> None:
        pass
