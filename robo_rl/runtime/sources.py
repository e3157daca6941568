"""Every action source of the episode loop (robo_rl/runtime/episodes.py), and `as_sources`, which
makes Sources of what a caller has:

    PolicyChunks      a policy thinking in its own thread (an InferenceWorker): chunks on absolute
                      time, late actions dropped, blended at hand-over, or ensembled, or with rtc
    LockstepChunks    a policy for robots stepped in lockstep: one batched call per tick
    OperatorCommands  a human on a teleop device commands every tick (robo-rl teleop / record)
    Interventions     a policy drives and a human may take over: the RaC protocol's arbitration,
                      each tick labelled POLICY, RECOVERY or CORRECTION, for one robot or many
                      (robo-rl record checkpoint=, and the twin's intervention collection)
    RecordedActions   a recorded episode's actions played back at their rate (robo-rl replay robot=)
    PerRobot          single-robot sources (ActionSource), one per robot, as Sources

PolicyChunks. Chunks carry absolute time: action i of a chunk predicted from the observation
taken at time t is meant for t + i / hz. The worker predicts a chunk from the newest observation
window whenever the current chunk has `n_action_steps` or fewer actions left; the loop never
waits for it. When a chunk arrives, the actions whose time has passed while the policy was
thinking are dropped (and counted), and execution starts at the one due now. The first
`blend_steps` commands after a hand-over move linearly from the old chunk's continuation to the
new chunk, so the commanded joints do not jump.
- Temporal ensembling (`ensemble=True`, ACT's; the camera recipe's default): the worker predicts
  again as soon as it is idle (at most every `query_every` ticks), and each tick's command is the
  weighted mean of the actions due now in every chunk that still covers it, each on its own
  absolute time; there is no hand-over to blend.
- Real-time chunking (`rtc=True`, robo_rl/policies/rtc.py): each request also hands the
  predictor the current chunk's actions from the request's tick on and the delay d in ticks,
  estimated from the slowest recent inference; the new chunk then agrees with the old one where
  they overlap (its first d actions are the old ones, which run while it is computed), so there
  is no blend.

OperatorCommands and RecordedActions command one robot (wrapped in PerRobot) and have
`segment`, the label of the action they gave last; Interventions is Sources for many robots,
with `segment(i)`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from robo_rl.data.schema import Segment
from robo_rl.rac.intervention import InterventionController, Phase
from robo_rl.runtime.chunking import ChunkExecutor, ChunkingConfig, ensemble_mean
from robo_rl.runtime.episodes import ControllerConfig, ControllerReport, observation_value
from robo_rl.runtime.inference import InferenceWorker, TimedChunk


def observation_window(history: list[Any]) -> dict[str, np.ndarray]:
    """The default policy input from the last To observations: joint positions, camera frames and
    any extra keys, each (1, To, ...)."""
    window = {"obs/qpos": np.stack([o.qpos for o in history])[None]}
    for cam in history[-1].images:
        window[f"obs/images/{cam}"] = np.stack([o.images[cam] for o in history])[None]
    for key in history[-1].extra:
        window[key] = np.stack([o.extra[key] for o in history])[None]
    return window


class ActionSource(Protocol):
    """Who commands the robot. The Controller asks once per tick, after observing."""

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        """The command due at `deadline` (the tick's scheduled time) given the newest observations,
        or None to hold the last command."""
        ...

    def close(self) -> None: ...


class PolicyChunks:
    """A policy as an action source: chunks predicted in an InferenceWorker thread from the newest
    observation window, executed on absolute time (late actions dropped), blended at hand-over,
    or with `config.rtc` made to agree with the old chunk by the predictor itself."""

    def __init__(self, predict: Callable[[Mapping[str, np.ndarray]], np.ndarray], config: ControllerConfig,
                 make_window: Callable[[list[Any]], dict[str, np.ndarray]] = observation_window):
        self.config, self.make_window = config, make_window
        self.period = 1.0 / config.hz
        self.worker = InferenceWorker(predict)
        self.current: TimedChunk | None = None
        self._blend_from: TimedChunk | None = None
        self._blend_left = 0
        self._last_action: np.ndarray | None = None
        self._handover = False
        self.live: list[TimedChunk] = []      # ensemble: the chunks still covering a tick, oldest first
        self._last_request: float | None = None

    def begin(self) -> None:
        """A new episode: no chunk, no blend, and nothing the worker computed before counts."""
        self.worker.discard()
        self.current, self._blend_from, self._blend_left = None, None, 0
        self._last_action, self._handover = None, False
        self.live, self._last_request = [], None

    def action(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        if self.config.ensemble:
            return self._ensembled(deadline, history, report)
        cfg, period = self.config, self.period
        # a new chunk: drop what is already past, blend from the old one's continuation
        chunk = self._take(deadline, report)
        if chunk is not None:
            if self.current is not None and cfg.blend_steps > 0 and not cfg.rtc:
                self._blend_from, self._blend_left = self.current, cfg.blend_steps
            self._handover = self.current is not None
            self.current = chunk
        current = self.current
        index = None if current is None else int(round((deadline - current.start) / period))
        due = current is None or len(current.actions) - index <= cfg.n_action_steps
        if len(history) == cfg.n_obs and due and self.worker.idle:  # no window built while one is computing
            extra = {}
            if cfg.rtc and current is not None:  # the old plan from this tick on, and how late the new one will be
                delay = int(math.ceil(self.worker.slowest_recent(cfg.rtc_latency_window) / 1e3 / period))
                extra = {"previous": current.actions[max(index, 0):][None], "delay": delay}
            self.worker.request(deadline, self.make_window(history), **extra)
        if current is None or not 0 <= index < len(current.actions):
            return None
        action = current.actions[index]
        if self._blend_left > 0:
            j = int(round((deadline - self._blend_from.start) / period))
            if 0 <= j < len(self._blend_from.actions):
                w = self._blend_left / (cfg.blend_steps + 1)
                action = w * self._blend_from.actions[j] + (1 - w) * action
            self._blend_left -= 1
        if self._handover and self._last_action is not None:  # the first tick on a new chunk
            report.handover_jumps.append(float(np.abs(np.asarray(action) - self._last_action).max()))
        self._handover, self._last_action = False, np.asarray(action, np.float64)
        return action

    def _take(self, deadline: float, report: ControllerReport) -> TimedChunk | None:
        """The chunk the worker finished, if any, counted with the actions whose time has passed."""
        chunk = self.worker.take()
        if chunk is not None:
            report.chunks += 1
            passed = int(np.floor((deadline - chunk.start) / self.period + 1e-6))
            report.dropped_actions += max(0, min(passed, len(chunk.actions)))
            # asked for at one tick, a chunk is due at the next: ensembling wants a fresh one every tick
            report.late_chunks += passed > 1
        return chunk

    def _ensembled(self, deadline: float, history: list[Any], report: ControllerReport) -> np.ndarray | None:
        """Temporal ensembling on absolute time: every chunk that has an action due at `deadline`
        takes part, so a slow inference only means fewer chunks in the mean, never a held tick."""
        cfg, period = self.config, self.period
        chunk = self._take(deadline, report)
        if chunk is not None:
            self._handover = bool(self.live)
            self.live.append(chunk)
        due = [(c, int(round((deadline - c.start) / period))) for c in self.live]
        due = [(c, i) for c, i in due if i < len(c.actions)]
        self.live = [c for c, _ in due]
        wait = cfg.query_every * period - 1e-6
        if (len(history) == cfg.n_obs and self.worker.idle
                and (self._last_request is None or deadline - self._last_request >= wait)):
            self.worker.request(deadline, self.make_window(history))
            self._last_request = deadline
        actions = [c.actions[i] for c, i in due if i >= 0]
        if not actions:
            return None
        action = ensemble_mean(actions, cfg.ensemble_decay)  # self.live is oldest first, as ACT weights it
        if self._handover and self._last_action is not None:  # the first tick a new chunk joins the mean
            report.handover_jumps.append(float(np.abs(action - self._last_action).max()))
        self._handover, self._last_action = False, np.asarray(action, np.float64)
        return action

    def close(self) -> None:
        self.worker.close()

    def latencies(self) -> list[float]:
        return self.worker.latencies()


class PerRobot:
    """Single-robot action sources (each with `action(deadline, history, report)`, and optionally
    `segment`, `ended`, `latencies`), one per robot, as Sources."""

    asynchronous = True  # a thread-predicting policy: ask it every tick, it answers when ready

    def __init__(self, sources: Sequence[Any]):
        self.sources = list(sources)

    def begin(self, i: int) -> None:
        begin = getattr(self.sources[i], "begin", None)
        if begin is not None:
            begin()

    def actions(self, deadline, histories, reports):
        return {i: self.sources[i].action(deadline, h, reports[i]) for i, h in histories.items()}

    def segment(self, i: int) -> Segment:
        return getattr(self.sources[i], "segment", Segment.POLICY)

    def ended(self, i: int) -> bool:
        return bool(getattr(self.sources[i], "ended", False))

    def end(self, i: int, task_done: bool) -> None:
        pass

    def latencies(self) -> list[float]:
        return [x for s in self.sources if hasattr(s, "latencies") for x in s.latencies()]

    def close(self) -> None:
        for s in self.sources:
            s.close()


class LockstepChunks:
    """A policy for robots stepped in lockstep: one batched `predict(window) -> (B, H, A)` call per
    tick for the robots whose chunk schedule (ChunkExecutor) needs a new chunk, on windows of
    `keys` from the loop's history padded with the episode's first observation (as the sampler pads)."""

    asynchronous = False  # computed in the tick: a robot it was not asked for replans when it comes back

    def __init__(self, predict: Callable[[Mapping[str, np.ndarray]], np.ndarray], chunking: ChunkingConfig,
                 horizon: int, n_robots: int, keys: Sequence[str], n_obs: int):
        self.predict, self.keys, self.n_obs = predict, list(keys), n_obs
        self.execs = [ChunkExecutor(chunking, horizon) for _ in range(n_robots)]

    def begin(self, i: int) -> None:
        self.execs[i].reset()

    def actions(self, deadline, histories, reports):
        need = [i for i in histories if self.execs[i].needs_prediction()]
        if need:
            windows = [[histories[i][0]] * (self.n_obs - len(histories[i])) + histories[i] for i in need]
            batch = {k: np.stack([np.stack([observation_value(o, k) for o in w]) for w in windows]) for k in self.keys}
            for chunk, i in zip(self.predict(batch), need):
                self.execs[i].push(chunk)
                reports[i].chunks += 1
        return {i: self.execs[i].next().astype(np.float32) for i in histories}

    def segment(self, i: int) -> Segment:
        return Segment.POLICY

    def ended(self, i: int) -> bool:
        return False

    def end(self, i: int, task_done: bool) -> None:
        pass

    def latencies(self) -> list[float]:
        return []

    def close(self) -> None:
        pass


def as_sources(source: Any, config: ControllerConfig, n_robots: int = 1,
               make_window: Callable[[list[Any]], dict[str, np.ndarray]] | None = None) -> Any:
    """Sources from what a caller has: Sources as they are; one robot's action source (`action`);
    or a bare `predict(window)` function, which becomes a thread-predicting PolicyChunks."""
    if callable(getattr(source, "actions", None)):  # (RecordedActions keeps its recording in `.actions`)
        return source
    if hasattr(source, "action"):
        return PerRobot([source])
    kwargs = {} if make_window is None else {"make_window": make_window}
    return PerRobot([PolicyChunks(source, config, **kwargs) for _ in range(n_robots)])




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
