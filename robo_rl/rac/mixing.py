"""Data composition for fine-tuning on intervention data (RaC: Hu et al. 2025, arXiv 2509.07953).

Which steps train, and how much each counts, is one weight per step over the union of the
pre-training demos and the intervention episodes. Three groups of steps:

    demo          every step of the pre-training demos (TELEOP / SCRIPTED labels)
    intervention  RECOVERY and CORRECTION steps: what the operator did
    policy        POLICY steps of intervention episodes: what the policy did before a takeover

`mode` picks the base weight per label:

    rac          recovery and correction train, policy steps do not (Hu et al.)
    corrections  only the correction segments (recovery masked): the ablation
    hg_dagger    intervention steps only, plain behaviour cloning (Kelly et al.)
    sirius       everything, the ~15 policy steps before a takeover near zero, interventions
                 carrying a fixed share (default 50%) of the weight (Liu et al., IWR)
    all          every step weighs 1

`no_recovery_after` masks the recovery of takeovers by their reason: ["dead end"], the default, keeps what the
operator's corrections after a dead end teach and drops its letting go of a lifted part (which a
camera policy may not tell from a good grip; docs/history.md, "RaC rounds on camera Insertion").
`no_intervention_after` masks whole interventions by their takeover reason, recovery and correction:
the ablation that asks whether what the operator did after such a takeover helps at all.

`successful_rollouts` also trains the policy's own steps in the rollouts it finished without a
takeover (RaC as a secondary summary describes it): the round's finished insertions.

Interventions whose correction never finished its sub-task (the operator's timeout, its plan
running out, the episode's time running out) teach nothing about finishing it: with
`finished_only` (the default) their operator steps weigh 0. A correction that pushed on through
an unreachable pose or a dropped part is also where a simulated operator's commands go wrong.

`segment_weights` overrides the mode's table (0 masks a label). Shares then rescale whole groups:
`demo_share` is the demos' part of the total weight, which under weighted sampling is the mean
fraction of each batch drawn from the demos (the mixing ratio; 0.5 is HIL-SERL's half-half);
`intervention_share` is the intervention steps' part. A group without a share keeps its natural
proportion of what the shares leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from robo_rl.data.schema import Segment
from robo_rl.errors import ConfigError
from robo_rl.rac.intervention import UNFINISHED_ENDINGS

OPERATOR_LABELS = (int(Segment.RECOVERY), int(Segment.CORRECTION))
MODES: dict[str, dict[str, float]] = {
    "rac": {"POLICY": 0.0, "RECOVERY": 1.0, "CORRECTION": 1.0},
    "corrections": {"POLICY": 0.0, "RECOVERY": 0.0, "CORRECTION": 1.0},
    "hg_dagger": {"POLICY": 0.0, "RECOVERY": 1.0, "CORRECTION": 1.0},
    "sirius": {"POLICY": 1.0, "RECOVERY": 1.0, "CORRECTION": 1.0},
    "all": {},
}


@dataclass
class CompositionConfig:
    mode: str = "rac"
    segment_weights: Mapping[str, float] | None = None  # {label: weight} over the mode's table
    demo_share: float | None = 0.5          # demos' share of the total weight (None: by their step count)
    intervention_share: float | None = None  # RECOVERY + CORRECTION share (sirius default 0.5)
    pre_takeover_steps: int | None = None   # policy steps before a takeover that get pre_takeover_weight (sirius: 15)
    pre_takeover_weight: float = 0.0
    finished_only: bool = True              # operator steps of unfinished corrections weigh 0
    no_recovery_after: Sequence[str] = ("dead end",)  # takeover reasons (prefixes) whose recovery weighs 0
    no_intervention_after: Sequence[str] = ()  # takeover reasons (prefixes) whose operator steps all weigh 0
    successful_rollouts: bool = False       # the policy's own steps in rollouts it finished with no takeover train

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"composition mode={self.mode!r}; choose one of {', '.join(MODES)}")
        if self.mode == "sirius":
            self.intervention_share = 0.5 if self.intervention_share is None else self.intervention_share
            self.pre_takeover_steps = 15 if self.pre_takeover_steps is None else self.pre_takeover_steps
        self.pre_takeover_steps = int(self.pre_takeover_steps or 0)
        for name in ("no_recovery_after", "no_intervention_after"):
            reasons = getattr(self, name)
            setattr(self, name, (reasons,) if isinstance(reasons, str) else tuple(str(r) for r in reasons or ()))
        for name in ("demo_share", "intervention_share"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"composition {name}={v} must be in [0, 1]")
        if (self.demo_share or 0.0) + (self.intervention_share or 0.0) > 1.0 + 1e-9:
            raise ConfigError(f"composition demo_share + intervention_share = "
                              f"{(self.demo_share or 0) + (self.intervention_share or 0):.2f} > 1")
        if self.pre_takeover_steps < 0 or self.pre_takeover_weight < 0:
            raise ConfigError("composition pre_takeover_steps and pre_takeover_weight must be >= 0")

    def label_table(self) -> np.ndarray:
        table = np.ones(len(Segment), dtype=np.float64)
        for name, w in {**MODES[self.mode], **dict(self.segment_weights or {})}.items():
            try:
                label = Segment.parse(name)
            except Exception:
                raise ConfigError(f"composition segment_weights: unknown label {name!r}; labels are "
                                  f"{[s.name for s in Segment]}") from None
            if w < 0:
                raise ConfigError(f"composition segment weight for {name} is {w}; weights must be >= 0")
            table[int(label)] = float(w)
        return table


def pre_takeover_mask(segments: np.ndarray, episode_starts: np.ndarray, n: int) -> np.ndarray:
    """True on the (up to) n POLICY steps right before each switch to RECOVERY or CORRECTION,
    within the same episode."""
    seg = np.asarray(segments)
    mask = np.zeros(len(seg), dtype=bool)
    if n <= 0 or len(seg) == 0:
        return mask
    operator = np.isin(seg, OPERATOR_LABELS)
    starts = np.zeros(len(seg), dtype=bool)
    starts[np.asarray(episode_starts, dtype=np.int64)] = True
    takeover = np.flatnonzero(operator & ~np.r_[False, operator[:-1]] & ~starts)  # first operator step of a run
    episode_of = np.cumsum(starts) - 1
    for t in takeover:
        lo = max(t - n, 0)
        same = (episode_of[lo:t] == episode_of[t]) & (seg[lo:t] == int(Segment.POLICY))
        mask[lo:t] |= same
    return mask


def unfinished_mask(segments: np.ndarray, episode_starts: np.ndarray,
                    interventions: Sequence[Sequence[Mapping[str, Any]]]) -> np.ndarray:
    """True on the operator steps of each intervention whose correction did not finish
    (`ended` in UNFINISHED_ENDINGS). `interventions[e]`: episode e's records (extra["interventions"]),
    whose `step` counts from the episode's first step."""
    return intervention_mask(segments, episode_starts, interventions,
                             lambda rec: rec.get("ended") in UNFINISHED_ENDINGS, OPERATOR_LABELS)


def recovery_after_mask(segments: np.ndarray, episode_starts: np.ndarray,
                        interventions: Sequence[Sequence[Mapping[str, Any]]], reasons: Sequence[str]) -> np.ndarray:
    """True on the RECOVERY steps of each intervention whose takeover reason starts with one of
    `reasons` (e.g. "dead end")."""
    prefixes = tuple(reasons)
    return intervention_mask(segments, episode_starts, interventions,
                             lambda rec: str(rec.get("reason", "")).startswith(prefixes), (int(Segment.RECOVERY),))


def intervention_after_mask(segments: np.ndarray, episode_starts: np.ndarray,
                            interventions: Sequence[Sequence[Mapping[str, Any]]], reasons: Sequence[str]) -> np.ndarray:
    """True on every operator step (recovery and correction) of each intervention whose takeover
    reason starts with one of `reasons`."""
    prefixes = tuple(reasons)
    return intervention_mask(segments, episode_starts, interventions,
                             lambda rec: str(rec.get("reason", "")).startswith(prefixes), OPERATOR_LABELS)


def clean_success_mask(segments: np.ndarray, episode_starts: np.ndarray, successes: Sequence[bool],
                       interventions: Sequence[Sequence[Mapping[str, Any]]] | None) -> np.ndarray:
    """True on the POLICY steps of each episode the policy finished with no takeover."""
    seg = np.asarray(segments)
    mask = np.zeros(len(seg), dtype=bool)
    starts = np.asarray(episode_starts, dtype=np.int64)
    ends = np.r_[starts[1:], len(seg)]
    for e, (start, end) in enumerate(zip(starts, ends)):
        if successes[e] and not (interventions and interventions[e]):
            mask[start:end] = seg[start:end] == int(Segment.POLICY)
    return mask


def intervention_mask(segments: np.ndarray, episode_starts: np.ndarray,
                      interventions: Sequence[Sequence[Mapping[str, Any]]], chosen: Any,
                      labels: Sequence[int]) -> np.ndarray:
    """True on the steps labelled one of `labels` within each intervention for which
    `chosen(record)` holds, from its takeover tick to its last operator step."""
    seg = np.asarray(segments)
    mask = np.zeros(len(seg), dtype=bool)
    starts = np.asarray(episode_starts, dtype=np.int64)
    ends = np.r_[starts[1:], len(seg)]
    operator = np.isin(seg, OPERATOR_LABELS)
    wanted = np.isin(seg, labels)
    for start, end, records in zip(starts, ends, interventions):
        for rec in records or ():
            if not chosen(rec):
                continue
            t = start + int(rec.get("step", 0))
            while start <= t < end and operator[t]:  # the takeover tick to the intervention's last step
                mask[t] = wanted[t]
                t += 1
    return mask


def composition_weights(sources: Sequence[Mapping[str, Any]], cfg: CompositionConfig) -> list[np.ndarray]:
    """Per-step weights for each source: {"segments": labels per step, "episode_starts": first
    step of each episode, "demo": True for the pre-training demos, "interventions": each
    episode's intervention records (optional; for `finished_only`, `no_recovery_after` and
    `no_intervention_after`),
    "successes": each episode's success (optional; for `successful_rollouts`)}. Weights are scaled so their
    mean over all steps is 1."""
    table = cfg.label_table()
    base, group = [], []
    for src in sources:
        seg = np.asarray(src["segments"], dtype=np.int64)
        w = table[seg]
        demo, starts, records = src.get("demo", False), src.get("episode_starts"), src.get("interventions")
        if not demo and cfg.pre_takeover_steps:
            w = np.where(pre_takeover_mask(seg, starts, cfg.pre_takeover_steps), cfg.pre_takeover_weight, w)
        if not demo and records is not None:
            if cfg.finished_only:
                w = np.where(unfinished_mask(seg, starts, records), 0.0, w)
            if cfg.no_recovery_after:
                w = np.where(recovery_after_mask(seg, starts, records, cfg.no_recovery_after), 0.0, w)
            if cfg.no_intervention_after:
                w = np.where(intervention_after_mask(seg, starts, records, cfg.no_intervention_after), 0.0, w)
        if not demo and cfg.successful_rollouts and src.get("successes") is not None:
            w = np.where(clean_success_mask(seg, starts, src["successes"], records), 1.0, w)
        g = np.full(len(seg), "demo" if demo else "policy", dtype=object)
        if not demo:
            g[np.isin(seg, OPERATOR_LABELS)] = "intervention"
        base.append(w)
        group.append(g)
    w_all, g_all = np.concatenate(base), np.concatenate(group)
    if w_all.sum() <= 0:
        raise ConfigError(f"composition mode={cfg.mode}: every step has weight 0; nothing to train on")
    totals = {g: float(w_all[g_all == g].sum()) for g in ("demo", "intervention", "policy")}
    shares = {"demo": cfg.demo_share, "intervention": cfg.intervention_share, "policy": None}
    for g, share in shares.items():
        if share and totals[g] <= 0:
            raise ConfigError(f"composition {g}_share={share} but the {g} steps have no weight "
                              f"(mode={cfg.mode}, or no such steps in the data)")
    fixed = sum(s for s in shares.values() if s is not None)
    free_total = sum(totals[g] for g, s in shares.items() if s is None)
    target = {}
    for g, s in shares.items():
        if s is not None:
            target[g] = s
        else:
            target[g] = (1.0 - fixed) * totals[g] / free_total if free_total > 0 else 0.0
    for g, total in totals.items():
        if total > 0:
            w_all[g_all == g] *= target[g] / total
    w_all *= len(w_all) / w_all.sum()
    return [part.astype(np.float32) for part in np.split(w_all, np.cumsum([len(b) for b in base])[:-1])]


def composition_report(sources: Sequence[Mapping[str, Any]], weights: Sequence[np.ndarray]) -> str:
    """One line on where the batch goes: the rounds' share of it, how many of their steps carry
    it, and how much more often one of them is drawn than one demo step. A share far above the
    steps that carry it is a few corrections replayed again and again (docs/results.md)."""
    def part(demo: bool) -> tuple[float, int]:
        ws = [w for src, w in zip(sources, weights) if bool(src.get("demo")) == demo]
        return float(sum(w.sum() for w in ws)), int(sum((w > 0).sum() for w in ws))

    (demo_w, demo_n), (round_w, round_n) = part(True), part(False)
    if round_n == 0 or demo_n == 0:
        return f"{demo_n + round_n} steps train, all from the {'demos' if demo_n else 'rounds'}"
    ratio = (round_w / round_n) / (demo_w / demo_n)
    return (f"the rounds' {round_n} training steps are {round_w / (demo_w + round_w):.0%} of each batch, "
            f"the demos' {demo_n} the rest: a round step is drawn {ratio:.1f}x as often as a demo step")


class MixedSampler:
    """Windows from several WindowSamplers as one: weighted=True draws sources in proportion to
    their total weight and windows within a source in proportion to theirs (so a composition's
    shares are batch fractions); weighted=False draws uniformly over all windows. Adds "source"."""

    def __init__(self, samplers: Sequence[Any]):
        if not samplers:
            raise ConfigError("MixedSampler: no samplers")
        self.samplers = list(samplers)

    def __len__(self) -> int:
        return sum(len(s) for s in self.samplers)

    def sample(self, batch_size: int, rng: Any = None, weighted: bool = False) -> dict[str, Any]:
        import torch

        mass = np.array([float(s.weights.sum()) if weighted else len(s) for s in self.samplers], dtype=np.float64)
        if isinstance(rng, torch.Generator):
            p = torch.as_tensor(mass / mass.sum(), dtype=torch.float32, device=rng.device)
            counts = torch.multinomial(p, batch_size, replacement=True, generator=rng).bincount(minlength=len(mass)).tolist()
        else:
            rng = rng if rng is not None else np.random.default_rng()
            counts = rng.multinomial(batch_size, mass / mass.sum()).tolist()
        parts = [(i, s.sample(n, rng, weighted)) for i, (s, n) in enumerate(zip(self.samplers, counts)) if n > 0]
        out = {}
        for key in parts[0][1]:
            vals = [p[key] for _, p in parts]
            out[key] = torch.cat(vals) if torch.is_tensor(vals[0]) else np.concatenate(vals)
        src = [np.full(len(p["index"]), i, dtype=np.int64) for i, p in parts]
        out["source"] = torch.as_tensor(np.concatenate(src), device=out["index"].device) if torch.is_tensor(out["index"]) \
            else np.concatenate(src)
        return out
