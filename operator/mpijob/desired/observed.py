"""What the caches saw of a job's children, and readers of raw child objects.

:class:`Observed` is the input of one sync: every child the job controls, as the watches (and
the creations not yet seen on them) show it. Children arrive as plain dicts from the API; the
accessors here tolerate missing fields, so a half-written object never raises. Read by
:mod:`mpijob.desired.sync` and :mod:`mpijob.desired.status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mpijob import keys
from mpijob.api import JSON, MPIJob
from mpijob.desired import names


@dataclass(frozen=True)
class Observed:
    """The job's children as the caches see them; only objects the job controls.

    ``None`` means the child does not exist (or is not controlled by the job), so a sync
    creates it: a child deleted by hand comes back on the next sync.
    """

    launcher_job: JSON | None = None
    """The launcher batch/v1 Job."""
    pods: Sequence[JSON] = ()
    """Pods labelled with the job's name: workers and launcher pods."""
    pod_group: JSON | None = None
    """The job's PodGroup, in gang mode."""
    service: JSON | None = None
    """The headless Service (its selector and ``publishNotReadyAddresses`` at least)."""
    config_map: JSON | None = None
    """The hostfile ConfigMap, with its data."""
    secret: JSON | None = None
    """The SSH Secret: its metadata and the names of its keys (never the key material)."""
    claims: Mapping[str, JSON] = field(default_factory=dict)
    """The workers' ResourceClaims (DRA binding), by name."""


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, or an empty string."""
    return str((obj.get("metadata") or {}).get("name") or "")


def phase_of(pod: Mapping[str, Any]) -> str:
    """``status.phase`` of a pod, or an empty string."""
    return str((pod.get("status") or {}).get("phase") or "")


def role_of(pod: Mapping[str, Any]) -> str:
    """The pod's ``training.kubeflow.org/job-role`` label: worker or launcher."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_JOB_ROLE, ""))


#: A pod as the caches give it, or as read (a mapping).
PodT = TypeVar("PodT", bound=Mapping[str, Any])


def workers_of(job: MPIJob, pods: Sequence[PodT]) -> list[PodT]:
    """The job's worker pods among ``pods``: the role label, and controlled by the job."""
    uid = job.metadata.uid
    return [p for p in pods if role_of(p) == keys.ROLE_WORKER and names.is_controlled_by(p, uid)]


def desired_workers(job: MPIJob, workers: Sequence[PodT]) -> list[PodT]:
    """The ones of the job's worker pods (:func:`workers_of`) that the job wants: those named
    for an index below ``replicas`` (a worker left from a larger size is only deleted)."""
    wanted = set(names.worker_names(job))
    return [p for p in workers if name_of(p) in wanted]


def evicted(pod: Mapping[str, Any]) -> bool:
    """Whether the kubelet evicted the pod (node pressure): Failed, with reason ``Evicted``."""
    return phase_of(pod) == "Failed" and (pod.get("status") or {}).get("reason") == EVICTED


def holds_on(pod: Mapping[str, Any]) -> bool:
    """Running or Pending, and not being deleted: a worker that still holds what it asked for."""
    return phase_of(pod) in ("Running", "Pending") and not _deleted(pod)


def launcher_pods_of(pods: Sequence[JSON]) -> list[JSON]:
    """Pods with the launcher role label (the launcher Job's, and any leftovers)."""
    return [p for p in pods if role_of(p) == keys.ROLE_LAUNCHER]


def gang_members(job: MPIJob, pods: Sequence[JSON], launcher_job: JSON | None) -> list[JSON]:
    """The pods of the job's gang: its workers and the pods its launcher Job controls (by
    controller reference, never by label alone: anyone may label a pod)."""
    launcher_uid = ((launcher_job or {}).get("metadata") or {}).get("uid")
    launchers = [
        p
        for p in launcher_pods_of(pods)
        if launcher_uid and names.is_controlled_by(p, launcher_uid)
    ]
    return [*workers_of(job, pods), *launchers]


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_reachable(pod: Mapping[str, Any]) -> bool:
    """Ready, not terminating, and with an IP: what the job's headless Service publishes under
    the pod's hostname (a Ready pod's address; not-ready ones too when the launcher is a
    worker), so a launcher may reach it by name."""
    return (
        pod_ready(pod)
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
        and bool((pod.get("status") or {}).get("podIP"))
    )


def job_condition(launcher_job: Mapping[str, Any], condition_type: str) -> dict[str, Any] | None:
    """The batch Job's condition of that type when its status is True, else None."""
    for cond in (launcher_job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == condition_type and cond.get("status") == "True":
            return dict(cond)
    return None


def controlled_by(
    pods: Sequence[Mapping[str, Any]], owner: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The pods whose controller is ``owner``; all of them when the owner has no UID yet."""
    uid = (owner.get("metadata") or {}).get("uid")
    if not uid:
        return list(pods)
    return [pod for pod in pods if names.is_controlled_by(pod, uid)]


# --- why a pod failed, as the kubelet reported it ---------------------------------------------

#: Waiting reasons of a container that will not start without a change to the pod or the
#: cluster (the image, the configuration), as opposed to one merely starting.
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
    }
)

#: The reason the kubelet gives a pod it evicted for node pressure.
EVICTED = "Evicted"

#: Pod-level reasons the kubelet sets on a pod it stopped or refused: evicted for node pressure,
#: past ``activeDeadlineSeconds``, ended by a node shutdown, refused at admission.
POD_FAILURE_REASONS = frozenset(
    {
        EVICTED,
        "DeadlineExceeded",
        "Terminated",
        "Shutdown",
        "NodeLost",
        "NodeAffinity",
        "UnexpectedAdmissionError",
        "OutOfmemory",
        "OutOfcpu",
    }
)


#: Whose failure a :class:`PodFailure` is: the pod's uid and the container's name (empty for a
#: pod-level reason); its ``at`` says which of that container's failures.
FailureKey = tuple[str, str]


@dataclass(frozen=True)
class PodFailure:
    """One pod's failure, as the kubelet reported it: which container, why, with what code."""

    pod: str
    role: str
    """``worker`` or ``launcher``."""
    reason: str
    """``OOMKilled``, ``Error``, ``Evicted``, ``DeadlineExceeded``, ``ImagePullBackOff``, ..."""
    container: str = ""
    """Empty for a pod-level reason (an eviction names no container)."""
    exit_code: int | None = None
    message: str = ""
    """The kubelet's message (an eviction's says which resource ran low)."""
    at: str = ""
    """When it happened (RFC 3339, as the API writes it; empty when unknown): orders failures."""
    uid: str = ""
    """The pod's uid."""

    @property
    def key(self) -> FailureKey:
        """Whose failure this is: one container of one pod (the pod's uid: a pod made again
        under the same name is another)."""
        return (self.uid, self.container)

    def describe(self) -> str:
        """``worker pod p container c OOMKilled (exit code 137)``, with the message if any."""
        text = f"{self.role} pod {self.pod}" if self.role else f"pod {self.pod}"
        if self.container:
            text += f" container {self.container}"
        text += f" {self.reason}"
        if self.exit_code is not None:
            text += f" (exit code {self.exit_code})"
        if self.message:
            text += f": {self.message.strip()}"
        return text


def pod_failure(pod: Mapping[str, Any]) -> PodFailure | None:
    """Why ``pod`` failed or cannot start, from its status as the kubelet wrote it; None when
    nothing says so.

    The first of :func:`failures_of` (a pod-level reason of the kubelet, else a container that
    terminated with a non-zero exit code); else a container stuck waiting
    (:data:`STUCK_WAITING_REASONS`: image pulls, bad configuration, crash loops).
    """
    found = failures_of(pod)
    if found:
        return found[0]
    status = pod.get("status") or {}
    if _deleted(pod) and _disruption(status) is None:
        return None
    for container in _container_statuses(status):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING_REASONS:
            return PodFailure(
                name_of(pod),
                role_of(pod),
                str(waiting["reason"]),
                container=str(container.get("name") or ""),
                message=str(waiting.get("message") or "")[:200],
                at=str(status.get("startTime") or ""),
                uid=_uid(pod),
            )
    return None


def failures_of(pod: Mapping[str, Any]) -> list[PodFailure]:
    """Every failure ``pod``'s status shows, in order: a pod-level reason of the kubelet
    (``Evicted``, ``DeadlineExceeded``, with its message) alone; else each container run that
    ended with a non-zero exit code (``OOMKilled``, ``Error``, ...): a container's current run
    and, once it restarted, its last one (``lastState``). A pod stopped by a disruption (the
    Eviction API, preemption) names the disruption's reason in its message; one deleted by
    anyone else (a cleanup, the Job controller) shows none. Containers are read in the pod's
    order, init containers first.
    """
    status = pod.get("status") or {}
    name, role, uid = name_of(pod), role_of(pod), _uid(pod)
    disruption = _disruption(status)
    if _deleted(pod) and disruption is None:
        return []  # stopped because someone deleted it (a cleanup, the Job controller)
    extra = ""
    if disruption is not None:
        extra = f"{disruption.get('reason') or 'DisruptionTarget'}"
        if disruption.get("message"):
            extra += f" ({disruption['message']})"
    if status.get("reason") in POD_FAILURE_REASONS:
        return [
            PodFailure(
                name,
                role,
                str(status["reason"]),
                message=str(status.get("message") or extra),
                at=_finished_at(status) or str(status.get("startTime") or ""),
                uid=uid,
            )
        ]
    found = []
    for container in _container_statuses(status):
        for state in ((container.get("state") or {}), (container.get("lastState") or {})):
            terminated = state.get("terminated") or {}
            code = terminated.get("exitCode")
            if terminated and code not in (None, 0):
                found.append(
                    PodFailure(
                        name,
                        role,
                        str(terminated.get("reason") or "Error"),
                        container=str(container.get("name") or ""),
                        exit_code=int(code),
                        message=extra or str(terminated.get("message") or "").strip()[:200],
                        at=str(terminated.get("finishedAt") or ""),
                        uid=uid,
                    )
                )
    return found


def _disruption(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's ``DisruptionTarget=True`` condition: the Eviction API or a preemption stops it."""
    return next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ),
        None,
    )


def _deleted(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _container_statuses(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]


def _finished_at(status: Mapping[str, Any]) -> str:
    times = [
        str(((c.get("state") or {}).get("terminated") or {}).get("finishedAt") or "")
        for c in status.get("containerStatuses") or []
    ]
    return min((t for t in times if t), default="")


def first_failures(pods: Sequence[Mapping[str, Any]]) -> list[PodFailure]:
    """Every failure among ``pods``, the earliest first (one without a time last).

    The kubelet's times have whole seconds, and a launcher fails because its workers did
    (``mpirun`` loses its ranks), often within the same second: at the same time a worker comes
    before a launcher. Then by pod name, so the order never depends on a listing's."""
    found = [f for f in map(pod_failure, pods) if f is not None]
    return sorted(found, key=lambda f: (not f.at, f.at, f.role != keys.ROLE_WORKER, f.pod))
