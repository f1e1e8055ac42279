"""Names, labels and owner references shared by every child of an MPIJob.

Names are deterministic (upstream's suffixes), so a restarted operator finds what it created.
Used by every builder here and by the handlers to look children up; :func:`worker_index` is the
one reading of which worker of which job a pod is, for everyone who asks (placement's
accounting, the checks of a held placement, GPU shares).
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


def launch_secret_name(job: MPIJob) -> str:
    """``<job>-launch``: the keys of a job launched by the operator's agent."""
    return job.name + keys.LAUNCH_SUFFIX


def secret_name(job: MPIJob) -> str:
    """The job's one Secret: its launch keys with ``mpijob.io/launch: agent``, else its SSH keys."""
    return launch_secret_name(job) if job.launch_agent else ssh_secret_name(job)


def launcher_name(job: MPIJob) -> str:
    """``<job>-launcher``: the batch Job, and the launcher pod's hostname."""
    return job.name + keys.LAUNCHER_SUFFIX


def worker_name(job: MPIJob, index: int) -> str:
    """``<job>-worker-<index>``: the worker pod and its hostname."""
    return f"{_worker_prefix(job.name)}{index}"


def _worker_prefix(job: str) -> str:
    return f"{job}{keys.WORKER_SUFFIX}-"


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


def worker_index(
    pod: Mapping[str, Any],
    namespace: str,
    job: str,
    uid: str | None,
    replicas: int | None = None,
) -> int | None:
    """The index of the worker of the MPIJob ``namespace/job`` (``uid``) that ``pod`` is, as
    the operator creates it; None for any other pod.

    Everything is read, and all of it must agree, because a tenant who may create pods in the
    namespace can write each part (labels, an owner reference to their own job, any free name)
    and a pod taken for a placed worker has its GPUs accounted by the job's decision:

    - the name is exactly :func:`worker_name` of an index written as the operator writes it
      (ASCII decimal, no sign, no leading zero: ``<job>-worker-00`` is no worker), below
      ``replicas`` when the caller knows them;
    - the pod is in the job's namespace;
    - it carries the operator's labels: ``operator-name``, ``job-name`` of the job and role
      ``worker``;
    - its controller owner reference is an MPIJob of that name and ``uid`` (no uid: no worker).
    """
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or "")
    prefix = _worker_prefix(job)
    digits = name[len(prefix) :]
    if not job or not name.startswith(prefix) or not (digits.isascii() and digits.isdigit()):
        return None
    index = int(digits)
    if str(index) != digits or (replicas is not None and index >= replicas):
        return None  # "00", "007": not a name the operator gives
    if meta.get("namespace") != namespace:
        return None
    labels = meta.get("labels") or {}
    if (
        labels.get(keys.LABEL_OPERATOR_NAME) != keys.OPERATOR_NAME
        or labels.get(keys.LABEL_JOB_NAME) != job
        or labels.get(keys.LABEL_JOB_ROLE) != keys.ROLE_WORKER
    ):
        return None
    if not is_controlled_by(pod, uid) or controlling_job(pod) != job:
        return None
    return index
