"""The RaC intervention protocol (Hu et al. 2025, arXiv 2509.07953) as a state machine over control ticks.

    AUTONOMOUS --take_over--> RECOVERY --recovery_done--> CORRECTION --correction_done--> END
                                                                      (hg_dagger: back to AUTONOMOUS)

An `Operator` (the simulated operator in the twin, or a human on a keyboard, gamepad or leader
arms) says *when* through events and *what* through its joint command while it holds control. The
controller owns the phase, decides who commands each tick, labels every step (POLICY, RECOVERY,
CORRECTION) and keeps one `Intervention` record per takeover: when, at which task stage, why,
and how many steps each segment lasted.

Rules it enforces:
- END: under RaC the episode ends when the correction does; no policy step follows an
  intervention. HG-DAgger (the baseline) hands control back to the policy instead.
- A smooth switch of control: the commanded joints never jump. After a switch the output moves
  toward the new source by at most `max_step` per tick until it has caught up (a human's leader
  arm may be far from where the follower is when they press "take over").
- Events that make no sense in the current phase (a stray "correction done" key while the policy
  drives) are ignored and counted, never acted on.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from robo_rl.data.schema import Segment
from robo_rl.errors import ConfigError, RoboRLError


class Phase(str, enum.Enum):
    AUTONOMOUS = "autonomous"
    RECOVERY = "recovery"
    CORRECTION = "correction"
    END = "end"


TAKE_OVER, RECOVERY_DONE, CORRECTION_DONE = "take_over", "recovery_done", "correction_done"
# how a correction ended without finishing its sub-task: the operator gave up (timeout, or a pose
# its arm cannot reach smoothly), its plan ran out, or the episode's time did; anything else (a
# human's key, "sub-task done", the whole task done under the operator's hands) is finished
TIMEOUT, PLAN_FINISHED, EPISODE_END, UNREACHABLE = "timeout", "plan finished", "episode_end", "unreachable"
UNFINISHED_ENDINGS = (TIMEOUT, PLAN_FINISHED, EPISODE_END, UNREACHABLE)
TASK_DONE = "task done"  # the episode ended on the task's success while the operator was in control
# event -> (the phase it is valid in, the phase it leads to; None: decided by the mode)
TRANSITIONS = {
    TAKE_OVER: (Phase.AUTONOMOUS, Phase.RECOVERY),
    RECOVERY_DONE: (Phase.RECOVERY, Phase.CORRECTION),
    CORRECTION_DONE: (Phase.CORRECTION, None),
}
LABELS = {Phase.AUTONOMOUS: Segment.POLICY, Phase.RECOVERY: Segment.RECOVERY,
          Phase.CORRECTION: Segment.CORRECTION, Phase.END: Segment.CORRECTION}
MODES = ("rac", "hg_dagger")


@dataclass
class OperatorEvent:
    kind: str          # take_over | recovery_done | correction_done
    reason: str = ""   # why (take_over: what looked like failure; correction_done: "timeout" etc.)


class Operator(Protocol):
    """Who may take over. Called once per control tick, `signal` before `command`."""

    name: str

    def signal(self, phase: Phase, policy_action: np.ndarray | None) -> OperatorEvent | None:
        """An event this tick (a key press, a button, the simulated operator's judgement), or None."""
        ...

    def command(self, phase: Phase, last_command: np.ndarray) -> np.ndarray:
        """The operator's joint command this tick; called only in RECOVERY and CORRECTION."""
        ...


@dataclass
class InterventionConfig:
    mode: str = "rac"          # rac: END after the correction | hg_dagger: control returns to the policy
    max_step: float = 0.05     # rad (or gripper units) per tick while the output catches up after a switch
    max_interventions: int = 0  # hg_dagger: stop taking over after this many (0: no limit)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"intervention mode={self.mode!r}; choose one of {', '.join(MODES)}")
        if self.max_step <= 0:
            raise ConfigError(f"intervention max_step must be > 0, got {self.max_step}")


@dataclass
class Intervention:
    """One takeover, as stored in an episode's metadata (`extra["interventions"]`)."""

    step: int                    # control tick of the takeover
    time: float                  # s since the episode began
    stage: int                   # task stage at the takeover (-1 where the robot has no stage notion)
    reason: str
    recovery_steps: int = 0
    correction_steps: int = 0
    ended: str = ""              # correction_done reason; "task done" or "episode_end" if the episode ended first

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class InterventionController:
    operator: Operator
    config: InterventionConfig = field(default_factory=InterventionConfig)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.phase = Phase.AUTONOMOUS
        self.interventions: list[Intervention] = []
        self.ignored_events: list[tuple[int, str, str]] = []  # (step, event, phase it arrived in)
        self._step = 0
        self._last: np.ndarray | None = None
        self._last_by_operator = False
        self._catching_up = False

    @property
    def done(self) -> bool:
        """RaC's END: the episode must stop now."""
        return self.phase == Phase.END

    @property
    def in_control(self) -> bool:
        """The operator commands the robot."""
        return self.phase in (Phase.RECOVERY, Phase.CORRECTION)

    def step(self, policy_action: np.ndarray | None, time: float = 0.0, stage: int = -1) -> tuple[np.ndarray, Segment]:
        """One tick: apply the operator's event (if any), then return (command, its label).
        `policy_action` may be None while the operator is in control."""
        if self.phase == Phase.END:
            raise RoboRLError("InterventionController.step: the episode has ended (RaC END); reset() for the next")
        was_operator = self.in_control
        event = self.operator.signal(self.phase, policy_action)
        if event is not None:
            self._apply(event, time, stage)
        if self.phase == Phase.END or (was_operator and not self.in_control and policy_action is None):
            # The correction just finished: hold the last command this tick (under HG-DAgger the
            # policy, which had no say this tick, drives from the next).
            self._step += 1
            return self._last.copy(), Segment.CORRECTION
        if self.in_control:
            rec = self.interventions[-1]
            if self.phase == Phase.RECOVERY:
                rec.recovery_steps += 1
            else:
                rec.correction_steps += 1
            target = np.asarray(self.operator.command(self.phase, self._last_or(policy_action)), dtype=np.float32)
        else:
            if policy_action is None:
                raise RoboRLError("InterventionController.step: the policy is in control but gave no action")
            target = np.asarray(policy_action, dtype=np.float32)
        if self._last_by_operator != self.in_control and self._last is not None:
            self._catching_up = True  # the source of commands changed since the last one sent
        out = self._follow(target)
        self._last, self._last_by_operator = out, self.in_control
        self._step += 1
        return out.copy(), LABELS[self.phase]

    def finish(self, task_done: bool = False) -> None:
        """The episode stopped while an intervention was still open: on the task's success
        (`task_done`: the correction finished the task, it ends before any done-hold) or for any
        other reason (the time limit, a stop: it did not)."""
        if self.interventions and not self.interventions[-1].ended and self.in_control:
            self.interventions[-1].ended = TASK_DONE if task_done else EPISODE_END

    # ------------------------------------------------------------------ internals
    def _apply(self, event: OperatorEvent, time: float, stage: int) -> None:
        valid_in, to = TRANSITIONS.get(event.kind, (None, None))
        limit = self.config.max_interventions
        if valid_in != self.phase or (event.kind == TAKE_OVER and limit and len(self.interventions) >= limit):
            self.ignored_events.append((self._step, event.kind, self.phase.value))
            return
        if event.kind == TAKE_OVER:
            self.interventions.append(Intervention(self._step, float(time), int(stage), event.reason))
        if event.kind == CORRECTION_DONE:
            self.interventions[-1].ended = event.reason or "correction_done"
            to = Phase.END if self.config.mode == "rac" else Phase.AUTONOMOUS
        self.phase = to

    def _last_or(self, fallback: np.ndarray | None) -> np.ndarray:
        if self._last is not None:
            return self._last
        if fallback is None:
            raise RoboRLError("InterventionController: the operator took over before any command was sent")
        return np.asarray(fallback, dtype=np.float32)

    def _follow(self, target: np.ndarray) -> np.ndarray:
        """Pass `target` through, except right after a switch of control: then move toward it by
        at most max_step per tick until within max_step, so the commanded joints never jump."""
        if not self._catching_up or self._last is None:
            return target
        delta = target - self._last
        if np.abs(delta).max() <= self.config.max_step:
            self._catching_up = False
            return target
        return self._last + np.clip(delta, -self.config.max_step, self.config.max_step)
