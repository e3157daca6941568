"""RaC: the intervention protocol (state machine, labels, records) and fine-tuning data mixing."""

from robo_rl.rac.intervention import (
    CORRECTION_DONE,
    RECOVERY_DONE,
    TAKE_OVER,
    Intervention,
    InterventionConfig,
    InterventionController,
    Operator,
    OperatorEvent,
    Phase,
)

__all__ = ["CORRECTION_DONE", "RECOVERY_DONE", "TAKE_OVER", "Intervention", "InterventionConfig",
           "InterventionController", "Operator", "OperatorEvent", "Phase"]
