"""The MPIJob API: models, parsing, upstream defaulting and validation. Pure; no I/O.

Handlers call :func:`parse`, then :func:`with_defaults`, then :func:`validate`; everything else
(builders, status rules, admission) reads the resulting :class:`MPIJob`.
"""

from mpijob.api.defaults import with_defaults
from mpijob.api.errors import FieldError, InvalidMPIJob, validation_message
from mpijob.api.models import (
    JobCondition,
    JobKey,
    MPIJob,
    MPIJobSpec,
    MPIJobStatus,
    ObjectMeta,
    ReplicaSpec,
    ReplicaStatus,
    RunPolicy,
    SchedulingPolicy,
)
from mpijob.api.parsing import managed_by, parse
from mpijob.api.resources import gpu_ids
from mpijob.api.validation import validate
from mpijob.objects import JSON

__all__ = [
    "JSON",
    "FieldError",
    "InvalidMPIJob",
    "JobCondition",
    "JobKey",
    "MPIJob",
    "MPIJobSpec",
    "MPIJobStatus",
    "ObjectMeta",
    "ReplicaSpec",
    "ReplicaStatus",
    "RunPolicy",
    "SchedulingPolicy",
    "gpu_ids",
    "managed_by",
    "parse",
    "validate",
    "validation_message",
    "with_defaults",
]
