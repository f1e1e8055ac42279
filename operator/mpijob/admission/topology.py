"""Between Kubernetes objects and the placement engine: requests, node states, decisions.

The placement engine knows nothing of Kubernetes; this module translates, and stays pure:

- which jobs are placed topology-aware, and what they ask for (:func:`request_of`); which
  nodes their worker template's selector and node affinity admit (:func:`eligible`); a placed
  worker's template may not name its node (:func:`template_errors`);
- which opted-in nodes exist and which of their GPUs are taken (:func:`node_states`), from
  unfinished pods' ``mpijob.io/gpu-ids`` (terminating ones included) and from the decisions of
  admitted jobs whose pods may not exist yet;
- a decision written on the MPIJob (``mpijob.io/placement-decision``, compact JSON) so that a
  restarted operator knows every reservation, plus the one-line summary for people
  (``mpijob.io/placement``);
- the per-pod annotations and node of each worker (:func:`pod_placements`).

Called by :mod:`mpijob.handlers.admission` and the reconciler.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob, gpu_count, gpu_ids
from mpijob.api.errors import FieldError, forbidden
from mpijob.desired.sync import PodPlacement
from mpijob.placement import codec
from mpijob.placement.job import JobRequest, NodeState, Placement, WorkerAssignment

DECISION_VERSION = 1
TERMINAL_PHASES = ("Succeeded", "Failed")


# --- jobs ------------------------------------------------------------------------------------


def gpus_per_worker(job: MPIJob) -> int:
    """Whole GPUs one worker asks for."""
    worker = job.spec.worker
    return gpu_count(worker.template) if worker is not None else 0


def wants_topology(job: MPIJob, *, default: bool) -> bool:
    """Opted in by ``mpijob.io/gpu-topology: "true"`` (or the operator's default), with GPUs."""
    value = (job.metadata.annotations or {}).get(keys.GPU_TOPOLOGY, "").strip().lower()
    opted = value == "true" or (default and value != "false")
    return opted and job.spec.worker_replicas > 0 and gpus_per_worker(job) > 0


def template_errors(job: MPIJob, *, default: bool) -> list[FieldError]:
    """A topology-placed worker template must not name its node: the pod would bypass the
    scheduler and run there, on GPUs placement may have given to another job."""
    worker = job.spec.worker
    if worker is None or not wants_topology(job, default=default):
        return []
    if not (worker.template.get("spec") or {}).get("nodeName"):
        return []
    path = f"spec.mpiReplicaSpecs[{keys.REPLICA_WORKER}].template.spec.nodeName"
    return [
        forbidden(
            path,
            "topology-placed workers run on the nodes placement chooses; remove nodeName "
            f'(or set the annotation {keys.GPU_TOPOLOGY}: "false" to place this job yourself)',
        )
    ]


def eligible(job: MPIJob, node: Mapping[str, Any]) -> bool:
    """Whether the worker template's ``nodeSelector`` and required node affinity admit ``node``.

    Placement honours them, so a decision never contradicts the template (the pod would stay
    Pending on the node placement chose for it). Terms are ORed, expressions within a term
    ANDed, as the scheduler reads them; taints are the scheduler's business.
    """
    worker = job.spec.worker
    spec = ((worker.template if worker is not None else {}).get("spec")) or {}
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    selector: Mapping[str, str] = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": str(meta.get("name") or "")}
    return any(
        all(_matches(labels, e) for e in term.get("matchExpressions") or [])
        and all(_matches(fields, e) for e in term.get("matchFields") or [])
        and (term.get("matchExpressions") or term.get("matchFields"))
        for term in terms
    )


def _matches(values: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key, op = expression.get("key", ""), expression.get("operator", "")
    wanted = [str(v) for v in expression.get("values") or []]
    present = key in values
    match op:
        case "In":
            return present and values[key] in wanted
        case "NotIn":
            return not present or values[key] not in wanted
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            try:
                have, bound = int(values[key]), int(wanted[0])
            except (KeyError, IndexError, ValueError):
                return False
            return have > bound if op == "Gt" else have < bound
    return False


def request_of(job: MPIJob) -> JobRequest:
    return JobRequest(workers=job.spec.worker_replicas, gpus_per_worker=gpus_per_worker(job))


# --- decisions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The placement an admitted job holds, as written on the MPIJob."""

    assignments: tuple[WorkerAssignment, ...]
    ring_gbps: float


def dump_decision(placement: Placement) -> str:
    return json.dumps(
        {
            "v": DECISION_VERSION,
            "ring": placement.ring_gbps,
            "workers": [[a.node, list(a.gpus)] for a in placement.assignments],
        },
        separators=(",", ":"),
    )


def load_decision(job: MPIJob) -> Decision | None:
    """The job's decision, or None when it has none (or an unreadable one: placed anew)."""
    text = (job.metadata.annotations or {}).get(keys.PLACEMENT_DECISION)
    if not text:
        return None
    try:
        data = json.loads(text)
        if data.get("v") != DECISION_VERSION:
            return None
        assignments = tuple(
            WorkerAssignment(str(node), tuple(int(g) for g in gpus))
            for node, gpus in data["workers"]
        )
        if len(assignments) != job.spec.worker_replicas:
            return None  # scaled since: the old decision no longer describes the job
        return Decision(assignments, float(data["ring"]))
    except (ValueError, KeyError, TypeError):
        return None


def decision_patch(placement: Placement | None) -> dict[str, Any]:
    """The MPIJob metadata patch recording (or, with None, releasing) a decision."""
    if placement is None:
        annotations: dict[str, str | None] = {keys.PLACEMENT_DECISION: None, keys.PLACEMENT: None}
    else:
        annotations = {
            keys.PLACEMENT_DECISION: dump_decision(placement),
            keys.PLACEMENT: placement.summary,
        }
    return {"metadata": {"annotations": annotations}}


def pod_placements(decision: Decision, nodes: Mapping[str, NodeState]) -> list[PodPlacement]:
    """Per worker: its node, and the annotations that tell the device layer its GPUs."""
    out = []
    for assignment in decision.assignments:
        annotations = {
            keys.GPU_IDS: ",".join(str(g) for g in assignment.gpus),
            keys.RING_BANDWIDTH: f"{decision.ring_gbps:g}",
        }
        node = nodes.get(assignment.node)
        uuids = node.topology.uuids_of(assignment.gpus) if node is not None else None
        if uuids:
            annotations[keys.GPU_UUIDS] = ",".join(uuids)
        out.append(PodPlacement(assignment.node, annotations))
    return out


# --- nodes -----------------------------------------------------------------------------------


def opted_in(node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(keys.NODE_GPU_SCHEDULE_LABEL) != keys.NODE_GPU_SCHEDULE_TOPOLOGY:
        return False
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def used_by_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, set[int]]:
    """GPUs held by pods bound to a node and annotated with ``mpijob.io/gpu-ids``.

    A terminating pod keeps its GPUs until it is gone: its container still holds the device
    and its memory until it exits, which can take the whole grace period, or longer on a node
    that stopped answering. Only a pod that has finished (Succeeded or Failed) frees them.
    """
    used: dict[str, set[int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        ids = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.GPU_IDS)
        phase = (pod.get("status") or {}).get("phase")
        if not node or not ids or phase in TERMINAL_PHASES:
            continue
        used.setdefault(node, set()).update(gpu_ids(ids))
    return used


def used_by_decisions(decisions: Iterable[Decision]) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for decision in decisions:
        for assignment in decision.assignments:
            used.setdefault(assignment.node, set()).update(assignment.gpus)
    return used


def node_states(
    nodes: Iterable[Mapping[str, Any]], *used: Mapping[str, set[int]]
) -> list[NodeState]:
    """Opted-in, Ready, schedulable nodes with a readable topology, and their taken GPUs.

    A node whose annotation cannot be read is skipped (the agent, or a person, must fix it);
    placement never guesses a topology.
    """
    states = []
    for node in nodes:
        if not opted_in(node):
            continue
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        text = (meta.get("annotations") or {}).get(keys.GPU_TOPOLOGY)
        if not text:
            continue
        try:
            topology = codec.loads(text)
        except ValueError:
            continue
        taken = frozenset(g for u in used for g in u.get(name, ()) if 0 <= g < topology.size)
        states.append(NodeState(name, topology, taken))
    return sorted(states, key=lambda s: s.name)
