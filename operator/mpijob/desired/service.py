"""The headless Service that gives the launcher and every worker a DNS name.

Named exactly as the job; its selector matches the launcher and the workers, so the pods'
``hostname``/``subdomain`` resolve as ``<host>.<job>.<ns>.svc``. Called by the reconcile loop,
which also compares :func:`service_drift` against the live object.
"""

from __future__ import annotations

from typing import Any

from mpijob.api import MPIJob
from mpijob.desired import names


def build_service(job: MPIJob) -> dict[str, Any]:
    """The desired v1 Service of ``job``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.child_metadata(job, names.service_name(job), names.app_labels(job)),
        "spec": {
            "clusterIP": "None",
            "selector": names.job_labels(job),
            # The launcher-as-worker must be reachable before it is Ready, as a host of mpirun.
            "publishNotReadyAddresses": job.spec.launcher_is_worker,
        },
    }


def service_drift(job: MPIJob, live: dict[str, Any]) -> dict[str, Any] | None:
    """The spec fields to update on a live Service, or None when it matches.

    Upstream only corrects the selector and ``publishNotReadyAddresses``.
    """
    desired = build_service(job)["spec"]
    spec = live.get("spec") or {}
    changes = {
        key: desired[key]
        for key in ("selector", "publishNotReadyAddresses")
        if (spec.get(key) or False) != desired[key]
    }
    return changes or None
