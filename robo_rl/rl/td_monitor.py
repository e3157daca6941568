"""TD-overfitting monitor (Fu et al. 2025, arXiv 2508.14881).

A small critic trained with a large batch keeps lowering its training TD error while its TD error on
transitions it never trained on rises. `split_heldout` sets such transitions aside and `HeldoutTD`
tracks both errors and flags the divergence. Its window and tolerance defaults come from
`robo_rl.rl.utd.UTDConfig`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from robo_rl.errors import RoboRLError
from robo_rl.rl.utd import DEFAULT, UTDConfig


def split_heldout(n_transitions: int, fraction: float, seed: int = 0,
                  episode_ends: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, heldout_idx): sorted, disjoint, together every index in [0, n_transitions).

    Without `episode_ends`, round(fraction · n) transitions (at least one) are drawn at random. With
    `episode_ends` (exclusive cumulative ends, as an EpisodeStore's meta/episode_ends; the last must be
    n_transitions), whole episodes are drawn at random until at least that many transitions are held
    out, so no held-out transition shares an episode with a training one; at least one episode stays
    on each side.
    """
    n = int(n_transitions)
    if n < 2:
        raise RoboRLError(f"split_heldout: n_transitions={n_transitions}; need at least 2 to hold any out")
    if not 0.0 < fraction < 1.0:
        raise RoboRLError(f"split_heldout: fraction={fraction}; give a share strictly between 0 and 1")
    rng = np.random.default_rng(seed)
    target = max(1, int(round(fraction * n)))
    if episode_ends is None:
        held = np.sort(rng.permutation(n)[: min(target, n - 1)])
    else:
        ends = np.asarray(episode_ends, dtype=np.int64)
        if ends.ndim != 1 or ends.size < 2:
            raise RoboRLError("split_heldout: episode_ends needs at least 2 episodes to hold one out")
        starts = np.concatenate([[0], ends[:-1]])
        if np.any(ends <= starts) or ends[-1] != n:
            raise RoboRLError(f"split_heldout: episode_ends must increase strictly and end at n_transitions={n}, "
                              f"got ...{ends[-3:].tolist()}")
        order = rng.permutation(ends.size)
        taken, count = [], 0
        for e in order[:-1]:  # the last one drawn always stays for training
            taken.append(e)
            count += int(ends[e] - starts[e])
            if count >= target:
                break
        held = np.sort(np.concatenate([np.arange(starts[e], ends[e]) for e in taken]))
    mask = np.zeros(n, dtype=bool)
    mask[held] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _log_slope(steps: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of log(value) against the window's steps rescaled to [0, 1]: the fitted
    change of log value from the window's first record to its last."""
    t = (steps - steps[0]) / max(steps[-1] - steps[0], 1e-12)
    return float(np.polyfit(t, np.log(np.maximum(values, 1e-30)), 1)[0])


class HeldoutTD:
    """Training vs held-out TD error over training, to catch TD-overfitting.

    `heldout_idx` are transitions the learner never trains on (`split_heldout`); `batch` can hold those
    transitions themselves (whatever the critic's TD-error function takes), kept fixed so every
    measurement is on the same set. Call `record(step, train_td, heldout_td)` periodically.

    `overfitting(window)` is True when, over the last `window` records (at least 3), both:
      * the least-squares slope of log(held-out TD) against step (steps rescaled to [0, 1] over the
        window) is above +tolerance: held-out error rose by more than ~tolerance × 100 % across it;
      * the same slope of log(train TD) is below 0: training error kept falling.
    Fewer than `window` records: False.
    """

    def __init__(self, heldout_idx: Sequence[int] | np.ndarray | None = None, batch: Any = None,
                 window: int | None = None, tolerance: float | None = None, config: UTDConfig = DEFAULT):
        self.heldout_idx = None if heldout_idx is None else np.asarray(heldout_idx, dtype=np.int64)
        self.batch = batch
        self.window = int(config.heldout_window if window is None else window)
        self.tolerance = float(config.heldout_tolerance if tolerance is None else tolerance)
        if self.window < 3:
            raise RoboRLError(f"HeldoutTD: window={self.window}; a slope needs at least 3 records")
        self.steps: list[int] = []
        self.train: list[float] = []
        self.heldout: list[float] = []
        self.first_flag_step: int | None = None

    def measure(self, td_error: Callable[[Any], float]) -> float:
        """td_error(self.batch) as a float: the held-out TD error of the critic as it is now."""
        if self.batch is None:
            raise RoboRLError("HeldoutTD.measure: no held-out batch was given")
        return float(td_error(self.batch))

    def record(self, step: int, train_td: float, heldout_td: float) -> bool:
        """Add a measurement; returns `overfitting()` after it."""
        train_td, heldout_td = float(train_td), float(heldout_td)
        if not (math.isfinite(train_td) and math.isfinite(heldout_td)) or train_td < 0 or heldout_td < 0:
            raise RoboRLError(f"HeldoutTD.record: step {step}: TD errors must be finite and >= 0, "
                              f"got train={train_td}, heldout={heldout_td}")
        if self.steps and step <= self.steps[-1]:
            raise RoboRLError(f"HeldoutTD.record: step {step} is not after the last recorded step {self.steps[-1]}")
        self.steps.append(int(step))
        self.train.append(train_td)
        self.heldout.append(heldout_td)
        flag = self.overfitting()
        if flag and self.first_flag_step is None:
            self.first_flag_step = int(step)
        return flag

    def slopes(self, window: int | None = None) -> tuple[float, float] | None:
        """(train slope, held-out slope) of log TD error over the last `window` records, or None."""
        k = self.window if window is None else int(window)
        if k < 3 or len(self.steps) < k:
            return None
        steps = np.asarray(self.steps[-k:], dtype=float)
        return (_log_slope(steps, np.asarray(self.train[-k:])), _log_slope(steps, np.asarray(self.heldout[-k:])))

    def overfitting(self, window: int | None = None) -> bool:
        s = self.slopes(window)
        return s is not None and s[1] > self.tolerance and s[0] < 0.0

    def summary(self) -> dict[str, Any]:
        s = self.slopes()
        return {
            "records": len(self.steps),
            "heldout_transitions": None if self.heldout_idx is None else int(self.heldout_idx.size),
            "last_step": self.steps[-1] if self.steps else None,
            "train_td": self.train[-1] if self.train else None,
            "heldout_td": self.heldout[-1] if self.heldout else None,
            "gap_ratio": (self.heldout[-1] / self.train[-1]) if self.train and self.train[-1] > 0 else None,
            "train_slope": None if s is None else s[0],
            "heldout_slope": None if s is None else s[1],
            "window": self.window,
            "tolerance": self.tolerance,
            "overfitting": self.overfitting(),
            "first_flag_step": self.first_flag_step,
        }
