"""A PodGroup's ``minResources``: what the first ``minMember`` pods of a gang request together.

The rule is upstream's (mpi-operator ``calPGMinResource``):

1. ``schedulingPolicy.minResources``, when set, is used as given.
2. Otherwise, with ``minMember`` 0 there are no minimum resources.
3. Otherwise the replica types are ordered by the value of their template's PriorityClass,
   highest first (a missing or unknown class counts as 0), and the first ``minMember`` pods in
   that order are summed. On a tie the launcher comes first, as upstream treats workers as the
   lower priority.
4. Each pod contributes every container's requests, and for a resource it does not request, its
   limit. Init containers and pod overhead are left out, as upstream does.

One deliberate difference: upstream truncates by setting the *second* type's replicas to
``minMember - 1``, which is right only when the first type has one replica. When workers
outrank the launcher it counts ``minMember - 1`` launchers plus every worker. We take the
first ``minMember`` pods in priority order, which gives upstream's numbers in every other case
and the intended ones in that one.

PriorityClass values are looked up by the caller and passed in as a mapping, so this module
stays pure. Used by :mod:`mpijob.desired.podgroup`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mpijob import keys
from mpijob.pods.quantity import Quantity

ResourceList = dict[str, Quantity]
"""Resource name to quantity, as in a core/v1 ResourceList."""


@dataclass(frozen=True)
class ReplicaPriority:
    """One replica type of a job with the priority its pods are scheduled at."""

    replica_type: str
    """``Launcher`` or ``Worker``."""
    replicas: int
    """How many pods of this type the job has."""
    template: Mapping[str, Any]
    """The type's pod template."""
    priority: int = 0
    """The value of the template's PriorityClass; 0 when it has none or it does not exist."""


def replicas_order(entries: Iterable[ReplicaPriority]) -> list[ReplicaPriority]:
    """Replica types by priority, highest first; equal priorities keep their given order."""
    return sorted(entries, key=lambda entry: -entry.priority)


def template_priority(template: Mapping[str, Any], priority_values: Mapping[str, int]) -> int:
    """The value of a pod template's PriorityClass, or 0 when it has none or it is unknown."""
    name = (template.get("spec") or {}).get("priorityClassName") or ""
    return priority_values.get(name, 0)


def add_resources(
    total: Mapping[str, Quantity] | None,
    requirements: Mapping[str, Any] | None,
    replicas: int = 1,
) -> ResourceList | None:
    """``total`` plus ``replicas`` times a container's resources; None stays None.

    Requests count first; a limit counts only for a resource with no request.
    """
    if total is None:
        return None
    merged: dict[str, Any] = dict((requirements or {}).get("limits") or {})
    merged.update((requirements or {}).get("requests") or {})
    result = dict(total)
    for name, text in merged.items():
        amount = Quantity.parse(text).times(replicas)
        result[name] = result[name] + amount if name in result else amount
    return result


def min_resources(
    entries: Sequence[ReplicaPriority],
    min_member: int | None,
) -> ResourceList | None:
    """The summed resources of the first ``min_member`` pods of ``entries`` by priority.

    ``min_member`` None sums every pod; 0 gives None (no minimum), as upstream.
    """
    if min_member == 0:
        return None
    ordered = replicas_order(entries)
    remaining = sum(entry.replicas for entry in ordered) if min_member is None else min_member
    total: ResourceList = {}
    for entry in ordered:
        count = min(entry.replicas, max(remaining, 0))
        remaining -= count
        for container in (entry.template.get("spec") or {}).get("containers") or []:
            total = add_resources(total, container.get("resources"), count) or {}
    return total


def replica_priorities(
    replica_specs: Mapping[str, Any],
    priority_values: Mapping[str, int],
    *,
    include_launcher: bool = True,
) -> list[ReplicaPriority]:
    """The job's replica types, Launcher first, with their priorities.

    ``replica_specs`` maps a type to an object with ``replicas`` and ``template`` (the api
    model's ReplicaSpec); unset replicas take upstream's defaults, 1 and 0.
    """
    entries = []
    for replica_type, default in ((keys.REPLICA_LAUNCHER, 1), (keys.REPLICA_WORKER, 0)):
        spec = replica_specs.get(replica_type)
        if spec is None or (replica_type == keys.REPLICA_LAUNCHER and not include_launcher):
            continue
        replicas = default if spec.replicas is None else spec.replicas
        priority = template_priority(spec.template, priority_values)
        entries.append(ReplicaPriority(replica_type, replicas, spec.template, priority))
    return entries


def to_manifest(resources: Mapping[str, Quantity]) -> dict[str, str]:
    """A ResourceList as it is written into a manifest, with canonical quantities."""
    return {name: str(amount) for name, amount in sorted(resources.items())}
