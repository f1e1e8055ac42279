"""Jobs queued by Kueue: Kueue admits, this operator places.

Kueue decides whether and when a job labelled ``kueue.x-k8s.io/queue-name`` runs (its
ClusterQueue's quota, its priority, preemption) and on which nodes (the ResourceFlavor's node
labels, merged into the pod templates): it admits a job by unsuspending it. Kueue counts quota,
not GPUs on a node, so a job it admitted may still find no GPU set our placement accepts among
the nodes its selector allows; the waiting condition then says that Kueue admitted it, so that
Kueue's ``Admitted`` Workload and our ``GangAdmitted=False`` read as one story.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.gang.queue import Decision, Wait


def local_queue(job: MPIJob) -> str | None:
    """The LocalQueue Kueue queues the job in, if it is queued by Kueue."""
    return (job.metadata.labels or {}).get(keys.KUEUE_QUEUE_LABEL) or None


def explain(job: MPIJob, decision: Decision[Any]) -> Decision[Any]:
    """``decision``, its waiting message saying that Kueue admitted the job (an unsuspended job
    with a queue is one Kueue admitted)."""
    queue = local_queue(job)
    if queue is None or job.spec.suspended or not isinstance(decision, Wait) or decision.refused:
        return decision
    return replace(
        decision,
        message=f"admitted by Kueue (LocalQueue {queue}), not placed yet: {decision.message}",
    )
