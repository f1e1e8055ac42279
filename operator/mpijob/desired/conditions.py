"""Upstream's rules for setting one condition on an MPIJob status (``setCondition``).

Same status and reason: nothing changes. Same status, other reason: replaced, keeping
``lastTransitionTime``. Running and Restarting exclude each other. Succeeded or Failed turns
existing Running and Failed conditions False. The set condition goes last. Used by
:mod:`mpijob.desired.status` and by any code that owns a condition of its own.
"""

from __future__ import annotations

from datetime import datetime

from mpijob import keys
from mpijob.api import JobCondition, MPIJobStatus
from mpijob.api.models import utc_seconds


def set_condition(
    status: MPIJobStatus,
    condition_type: str,
    status_value: str,
    reason: str,
    message: str,
    now: datetime,
) -> bool:
    """Set a condition in place by upstream's rules; True when something changed.

    Same status and reason: nothing changes. Same status, other reason: replaced, keeping
    ``lastTransitionTime``. Running and Restarting exclude each other. Succeeded or Failed
    turns existing Running and Failed conditions False. The set condition goes last.
    """
    now = utc_seconds(now)
    current = status.condition(condition_type)
    if current is not None and current.status == status_value and current.reason == reason:
        return False
    transition = now
    if current is not None and current.status == status_value:
        transition = current.last_transition_time or now
    kept = []
    for cond in status.conditions:
        if cond.type == condition_type or {cond.type, condition_type} == {
            keys.COND_RUNNING,
            keys.COND_RESTARTING,
        }:
            continue
        if condition_type in (keys.COND_FAILED, keys.COND_SUCCEEDED) and cond.type in (
            keys.COND_RUNNING,
            keys.COND_FAILED,
        ):
            kept.append(cond.model_copy(update={"status": "False"}))
        else:
            kept.append(cond)
    kept.append(
        JobCondition(
            type=condition_type,
            status=status_value,
            reason=reason,
            message=message,
            last_update_time=now,
            last_transition_time=transition,
        )
    )
    status.conditions = kept
    return True
