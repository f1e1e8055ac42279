"""Pydantic models of a kubeflow.org/v2beta1 MPIJob, field for field with the upstream CRD.

Optional fields stay ``None`` when the object leaves them out, so that defaulting
(:mod:`mpijob.api.defaults`) and validation (:mod:`mpijob.api.validation`) can tell "unset"
from "zero" exactly as upstream's Go pointers do. Pod templates are kept as plain dicts: they
are deep-copied into children and never modelled. Unknown fields are kept (``extra="allow"``)
so that a newer upstream field survives a round trip.

Built by :func:`mpijob.api.parse`; read by the builders, the status rules, admission and the
handlers. :data:`~mpijob.objects.JSON` and :data:`JobKey` name the two shapes every layer passes
around.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictStr,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from mpijob import keys

JobKey = tuple[str, str]
"""(namespace, name) of an MPIJob: the work queue's key."""

_INT32 = 2**31
_INT64 = 2**63

Int32 = Annotated[int, Field(strict=True, ge=-_INT32, le=_INT32 - 1)]
"""A JSON integer that fits Go's int32; strings and floats are refused as Go's decoder does."""
Int64 = Annotated[int, Field(strict=True, ge=-_INT64, le=_INT64 - 1)]
"""A JSON integer that fits Go's int64."""


def utc_seconds(value: datetime) -> datetime:
    """``value`` in UTC, to the second, as ``metav1.Time`` holds it (naive means UTC)."""
    if value.tzinfo is not UTC:
        # Naive, or UTC as another object (pydantic parses "Z" into a zone of its own): the
        # same instant with datetime's UTC; no conversion unless the offset is not zero.
        offset = value.utcoffset()
        value = value.astimezone(UTC) if offset else value.replace(tzinfo=UTC)
    return value.replace(microsecond=0) if value.microsecond else value


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with second precision and a four-digit year, as Kubernetes writes
    ``metav1.Time``. (``isoformat`` rather than ``strftime``: a third of the cost, and every
    status a sync compares is written out with its times.)"""
    return utc_seconds(value).isoformat()[:19] + "Z"


def format_micro_time(value: datetime) -> str:
    """RFC 3339 in UTC with microsecond precision, as Kubernetes writes ``metav1.MicroTime``
    (a Lease's acquire and renew times)."""
    at = value.astimezone(UTC) if value.tzinfo else value
    return at.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(value: object) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339 string or datetime) in UTC, or None if it is not one."""
    if isinstance(value, datetime):
        return utc_seconds(value)
    if isinstance(value, str) and value:
        try:
            return utc_seconds(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


Time = Annotated[
    datetime,
    AfterValidator(utc_seconds),
    PlainSerializer(format_time, return_type=str, when_used="json"),
]
"""A Kubernetes timestamp: parsed from RFC 3339, kept in UTC to the second."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
    )


# --- metadata --------------------------------------------------------------------------------


class ObjectMeta(_Model):
    """The parts of the MPIJob's metadata the operator reads; the rest is kept as it came."""

    name: StrictStr = ""
    """Object name; children derive their names from it."""
    generate_name: StrictStr | None = None
    """Prefix the API server used to generate ``name``, if any."""
    namespace: StrictStr = ""
    """Namespace of the MPIJob and of every child."""
    uid: StrictStr = ""
    """UID, carried by every child's owner reference."""
    resource_version: StrictStr | None = None
    """Version of the object as last read."""
    generation: Int64 | None = None
    """Spec generation."""
    labels: dict[str, StrictStr] | None = None
    """Labels of the MPIJob."""
    annotations: dict[str, StrictStr] | None = None
    """Annotations of the MPIJob (the Volcano queue name is read from here)."""
    creation_timestamp: Time | None = None
    """When the API server stored the object."""
    deletion_timestamp: Time | None = None
    """Set once deletion started; the operator then leaves the job alone."""


# --- spec ------------------------------------------------------------------------------------


class SchedulingPolicy(_Model):
    """Gang-scheduling hints, copied into the PodGroup."""

    min_available: Int32 | None = None
    """Minimum number of pods to start together; defaults to Worker replicas + 1."""
    queue: StrictStr = ""
    """Volcano queue name."""
    min_resources: dict[str, Any] | None = None
    """Resources the whole gang needs (a ResourceList of quantities), used verbatim if set."""
    priority_class: StrictStr = ""
    """PriorityClass of the PodGroup."""
    schedule_timeout_seconds: Int32 | None = None
    """scheduler-plugins scheduling timeout, in seconds."""


class RunPolicy(_Model):
    """Policies of the job's run: cleanup, deadlines, retries, suspension, ownership."""

    clean_pod_policy: StrictStr | None = None
    """Which worker pods to delete when the job finishes: None, Running or All."""
    ttl_seconds_after_finished: Int32 | None = None
    """Copied to the launcher Job: seconds after it finishes before it is deleted."""
    active_deadline_seconds: Int64 | None = None
    """Copied to the launcher Job: seconds it may run before it is failed."""
    backoff_limit: Int32 | None = None
    """Copied to the launcher Job: retries before it is failed (Kubernetes defaults it to 6)."""
    scheduling_policy: SchedulingPolicy | None = None
    """Gang-scheduling hints."""
    suspend: StrictBool | None = None
    """True suspends the job: workers are deleted and the launcher Job is suspended."""
    managed_by: StrictStr | None = None
    """The controller that reconciles this job; any value but ours leaves it alone."""


class ReplicaSpec(_Model):
    """One replica type (Launcher or Worker): how many, which pod template, which restart policy."""

    replicas: Int32 | None = None
    """Desired number of pods; defaults to 1 for the Launcher and 0 for the Worker."""
    template: dict[str, Any] = Field(default_factory=dict)
    """The pod template (a core/v1 PodTemplateSpec), passed through untouched."""
    restart_policy: StrictStr = ""
    """Never or OnFailure; defaults to OnFailure for the Launcher and Never for the Worker."""


class MPIJobSpec(_Model):
    """Desired state of an MPIJob."""

    slots_per_worker: Int32 | None = None
    """Slots per host in the hostfile; defaults to 1."""
    run_launcher_as_worker: StrictBool | None = None
    """True adds the launcher to the hostfile, as the first host."""
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    """Policies of the job's run."""
    mpi_replica_specs: dict[str, ReplicaSpec | None] | None = None
    """The Launcher (required) and Worker (optional) replica specs, keyed by type."""
    ssh_auth_mount_path: StrictStr = ""
    """Where the SSH Secret is mounted in every pod; defaults to /root/.ssh."""
    launcher_creation_policy: StrictStr = ""
    """AtStartup, or WaitForWorkersReady to create the launcher once every worker is Ready."""
    mpi_implementation: StrictStr = ""
    """OpenMPI, Intel or MPICH; decides the hostfile format and the launcher env."""

    def replica(self, replica_type: str) -> ReplicaSpec | None:
        """The replica spec of a type, or None when there is none."""
        return (self.mpi_replica_specs or {}).get(replica_type)

    @property
    def launcher(self) -> ReplicaSpec | None:
        """The Launcher replica spec."""
        return self.replica(keys.REPLICA_LAUNCHER)

    @property
    def worker(self) -> ReplicaSpec | None:
        """The Worker replica spec, if the job has workers."""
        return self.replica(keys.REPLICA_WORKER)

    @property
    def worker_replicas(self) -> int:
        """The number of worker pods wanted (0 without a Worker spec)."""
        worker = self.worker
        return worker.replicas or 0 if worker is not None else 0

    @property
    def launcher_is_worker(self) -> bool:
        """Whether the launcher is also a host in the hostfile."""
        return bool(self.run_launcher_as_worker)

    @property
    def suspended(self) -> bool:
        """Whether the job is suspended."""
        return bool(self.run_policy.suspend)


# --- status ----------------------------------------------------------------------------------


class _Flat(_Model):
    """A model whose declared fields never change in place (strings, numbers, times), so a copy of
    the model is a deep copy. Statuses are copied several times a sync, and pydantic's generic
    deep copy of one costs five times this. A model that carries unknown fields (``extra``: any
    JSON) gets the generic copy."""

    def _flat(self) -> bool:
        return not self.__pydantic_extra__

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        return self.__copy__() if self._flat() else super().__deepcopy__(memo)


class JobCondition(_Flat):
    """One condition of the job (Created, Running, Restarting, Succeeded, Suspended, Failed)."""

    type: StrictStr
    """Condition type."""
    status: StrictStr
    """True, False or Unknown."""
    reason: StrictStr = ""
    """One-word CamelCase reason of the last transition."""
    message: StrictStr = ""
    """Human-readable detail of the last transition."""
    last_update_time: Time | None = None
    """When the condition was last set."""
    last_transition_time: Time | None = None
    """When the status last changed."""


class ReplicaStatus(_Flat):
    """Pod counts of one replica type. Zero counts are left out when written, as upstream does."""

    active: Int32 = 0
    """Running pods."""
    succeeded: Int32 = 0
    """Succeeded pods."""
    failed: Int32 = 0
    """Failed pods (for the launcher: the Job's failed count, historical)."""
    label_selector: dict[str, Any] | None = None
    """Deprecated; never set by the operator."""
    selector: StrictStr = ""
    """Never set by the operator."""

    def _flat(self) -> bool:
        return self.label_selector is None and super()._flat()

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v not in (0, "", None)}


class MPIJobStatus(_Model):
    """Observed state of an MPIJob, written through the status subresource."""

    conditions: list[JobCondition] = Field(default_factory=list)
    """Conditions, one per type, newest change last."""
    replica_statuses: dict[str, ReplicaStatus] = Field(default_factory=dict)
    """Pod counts keyed by replica type (Launcher, Worker)."""
    start_time: Time | None = None
    """When the job first ran unsuspended (reset on resume)."""
    completion_time: Time | None = None
    """When the job succeeded or failed."""
    last_reconcile_time: Time | None = None
    """Part of the upstream schema, which never sets it; we stamp it on each status write."""

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        """Its conditions and replica counts copied one by one (each :class:`_Flat`): five times
        cheaper than pydantic's generic deep copy."""
        if self.__pydantic_extra__:
            return super().__deepcopy__(memo)
        copied = self.__copy__()
        # Into __dict__: setting the attributes would also mark them as set by the user.
        copied.__dict__["conditions"] = [c.__deepcopy__() for c in self.conditions]
        copied.__dict__["replica_statuses"] = {
            k: v.__deepcopy__() for k, v in self.replica_statuses.items()
        }
        return copied

    def condition(self, condition_type: str) -> JobCondition | None:
        """The condition of a type, or None."""
        return next((c for c in self.conditions if c.type == condition_type), None)

    def is_true(self, condition_type: str) -> bool:
        """Whether the condition of a type exists with status True."""
        found = self.condition(condition_type)
        return found is not None and found.status == "True"

    @property
    def finished(self) -> bool:
        """Whether Succeeded or Failed is True."""
        return self.is_true(keys.COND_SUCCEEDED) or self.is_true(keys.COND_FAILED)

    def to_body(self) -> dict[str, Any]:
        """The JSON body of ``.status``, with unset and empty fields left out (Go omitempty)."""
        body = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {k: v for k, v in body.items() if v not in ([], {})}


# --- the object ------------------------------------------------------------------------------


class MPIJob(_Model):
    """A kubeflow.org/v2beta1 MPIJob."""

    api_version: StrictStr = keys.API_VERSION
    """Always kubeflow.org/v2beta1."""
    kind: StrictStr = keys.KIND
    """Always MPIJob."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Standard object metadata."""
    spec: MPIJobSpec = Field(default_factory=MPIJobSpec)
    """Desired state."""
    status: MPIJobStatus = Field(default_factory=MPIJobStatus)
    """Observed state."""

    @property
    def name(self) -> str:
        """The MPIJob's name."""
        return self.metadata.name

    @property
    def namespace(self) -> str:
        """The MPIJob's namespace."""
        return self.metadata.namespace

    @property
    def launch_agent(self) -> bool:
        """Whether ``mpijob.io/launch: agent`` asks for the operator's launch agent (no sshd)."""
        return (self.metadata.annotations or {}).get(keys.LAUNCH) == keys.LAUNCH_AGENT

    @property
    def key(self) -> str:
        """``<namespace>/<name>``, as upstream writes it in messages."""
        return f"{self.metadata.namespace}/{self.metadata.name}"
