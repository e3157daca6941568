"""Action sources for the Controller besides a bare policy (PolicyChunks, in controller.py):

    OperatorCommands  a human on a teleop device commands every tick (robo-rl teleop / record)
    Interventions     a policy drives and a human may take over: the RaC protocol's arbitration,
                      each tick labelled POLICY, RECOVERY or CORRECTION (robo-rl record checkpoint=)
    RecordedActions   a recorded episode's actions played back at their rate (robo-rl replay robot=)

Each has `segment`, the label of the action it gave last, which a recorder writes with the step.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from robo_rl.data.schema import Segment
from robo_rl.rac.intervention import InterventionController, Phase
from robo_rl.runtime.controller import ControllerReport, PolicyChunks


class OperatorCommands:
    """An Operator (robo_rl.rac.intervention.Operator: `signal` then `command` each tick) in
    control for the whole run. Its first command continues from where the robot is."""

    segment = Segment.TELEOP

    def __init__(self, operator: Any):
        self.operator = operator
        self._last: np.ndarray | None = None

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray:
        if self._last is None:
            self._last = np.asarray(history[-1].qpos, dtype=np.float32)
        self.operator.signal(Phase.CORRECTION, None)  # polls the device; RaC events mean nothing here
        self._last = np.asarray(self.operator.command(Phase.CORRECTION, self._last), dtype=np.float32)
        return self._last

    def close(self) -> None:
        pass


class Interventions:
    """A policy (PolicyChunks) under an InterventionController: the operator takes over when it
    signals so, and the controller decides who commands each tick and how the step is labelled.
    `ended` turns true at RaC's END (the correction is done): the episode stops there."""

    def __init__(self, policy: PolicyChunks, interventions: InterventionController,
                 stage: Callable[[], int] | None = None):
        self.policy, self.interventions, self.stage = policy, interventions, stage
        self.segment = Segment.POLICY
        self._t0: float | None = None
        self._last: np.ndarray | None = None

    @property
    def ended(self) -> bool:
        return self.interventions.done

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray:
        if self._t0 is None:
            self._t0 = deadline
            self._last = np.asarray(history[-1].qpos, dtype=np.float32)
        # the policy keeps predicting while the human drives, so a hand-back (HG-DAgger) has a chunk
        policy_action = self.policy.action(deadline, history, report)
        if policy_action is None and not self.interventions.in_control:
            policy_action = self._last  # no chunk yet: hold, and count it as the Controller would
            report.missing_actions += 1
        stage = self.stage() if self.stage is not None else -1
        command, self.segment = self.interventions.step(policy_action, time=deadline - self._t0, stage=stage)
        self._last = command
        return command

    def close(self) -> None:
        self.interventions.finish()
        self.policy.close()

    def latencies(self) -> list[float]:
        return self.policy.latencies()


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
