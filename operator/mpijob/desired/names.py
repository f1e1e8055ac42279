"""Names, labels and owner references shared by every child of an MPIJob.

Names are deterministic (upstream's suffixes), so a restarted operator finds what it created.
Used by every builder here and by the handlers to look children up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob


def service_name(job: MPIJob) -> str:
    """The headless Service: exactly the job's name."""
    return job.name


def config_map_name(job: MPIJob) -> str:
    """``<job>-config``."""
    return job.name + keys.CONFIG_SUFFIX


def ssh_secret_name(job: MPIJob) -> str:
    """``<job>-ssh``."""
    return job.name + keys.SSH_SUFFIX


def launcher_name(job: MPIJob) -> str:
    """``<job>-launcher``: the batch Job, and the launcher pod's hostname."""
    return job.name + keys.LAUNCHER_SUFFIX


def worker_name(job: MPIJob, index: int) -> str:
    """``<job>-worker-<index>``: the worker pod and its hostname."""
    return f"{job.name}{keys.WORKER_SUFFIX}-{index}"


def worker_names(job: MPIJob) -> list[str]:
    """Names of every desired worker, in index order."""
    return [worker_name(job, i) for i in range(job.spec.worker_replicas)]


def job_labels(job: MPIJob, role: str | None = None) -> dict[str, str]:
    """Labels that select the job's pods; with ``role``, only the pods of that role."""
    labels = {keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME, keys.LABEL_JOB_NAME: job.name}
    if role is not None:
        labels[keys.LABEL_JOB_ROLE] = role
    return labels


def worker_selector(job: MPIJob) -> dict[str, str]:
    """Label selector of the job's worker pods."""
    return job_labels(job, keys.ROLE_WORKER)


def launcher_selector(job: MPIJob) -> dict[str, str]:
    """Label selector of the job's launcher pods."""
    return job_labels(job, keys.ROLE_LAUNCHER)


def app_labels(job: MPIJob) -> dict[str, str]:
    """``app: <job>``, carried by the Service, ConfigMap, Secret and launcher Job."""
    return {keys.LABEL_APP: job.name}


def owner_reference(job: MPIJob) -> dict[str, Any]:
    """The controller owner reference every child carries, so deletion cascades."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "name": job.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: MPIJob, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """Metadata of a child: its name, the job's namespace, labels and the owner reference."""
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``obj``'s controller owner reference, or None: the one owner that reconciles it."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def controlling_job(obj: Mapping[str, Any]) -> str | None:
    """The name of the MPIJob that controls ``obj``, or None when no MPIJob does."""
    ref = controller_of(obj)
    if ref is None or (ref.get("apiVersion"), ref.get("kind")) != (keys.API_VERSION, keys.KIND):
        return None
    return str(ref.get("name") or "") or None


def is_controlled_by(obj: Mapping[str, Any], owner_uid: str | None) -> bool:
    """Whether ``obj``'s controller owner reference points at the owner with that UID."""
    ref = controller_of(obj)
    return ref is not None and bool(owner_uid) and ref.get("uid") == owner_uid
