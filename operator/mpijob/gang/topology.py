"""Between Kubernetes objects and the placement engine: requests, node states, decisions.

The placement engine knows nothing of Kubernetes; this module translates, and stays pure:

- which jobs are placed topology-aware, and what they ask for (:func:`request_of`); which
  nodes their worker template's selector and node affinity admit (:func:`eligible`, on
  :func:`mpijob.pods.predicates.admits`, which the share webhook also asks); a placed
  worker's template may not name its node (:func:`template_errors`);
- a job's decision as a PlacementDecision object (:func:`decision_object`), which only the
  operator writes, so that a restarted operator knows every reservation and no tenant can
  forge one; when it may be deleted (:func:`releasable`);
- which opted-in nodes exist and which of their GPUs are taken (:func:`holdings`,
  :func:`node_states`): by decisions, and by the GPU requests of bound, unfinished pods that
  no decision placed (terminating ones included), never by annotations a pod carries; a pod is
  a decision's placed worker only when it is the worker the operator created
  (:func:`mpijob.desired.names.worker_index`), and what it requests beyond its assignment is
  counted too;
- the per-pod annotations and node of each worker (:func:`pod_placements`), and the channel
  of its ComputeDomain when the job spans nodes of one NVLink clique;
- each node's place in the fabric, from its labels (:func:`locations`);
- whether a node under a placed job was lost (:func:`lost_nodes`): at once when deleted; when
  not Ready, only after a grace and not while most of the pool is not Ready with it.

Called by :mod:`mpijob.gang.service` and the reconciler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from mpijob import keys
from mpijob.api import JSON, JobKey, MPIJob, gpu_ids
from mpijob.api.errors import FieldError, forbidden
from mpijob.api.models import format_time, parse_time
from mpijob.desired import compute_domain, names
from mpijob.desired.sync import PodPlacement
from mpijob.gang import fit
from mpijob.gang.timeout import Released
from mpijob.placement import codec, fabric_labels
from mpijob.placement.fabric import Fabric, Location
from mpijob.placement.job import JobRequest, NodeState, Placement, WorkerAssignment
from mpijob.pods.predicates import admits, effective_gpus, terminal

# --- jobs ------------------------------------------------------------------------------------


def gpus_per_worker(job: MPIJob) -> int:
    """Whole GPUs one worker takes, as the scheduler counts them (init containers, sidecars
    and overhead included): what placement reserves is what its pod will hold."""
    return int(fit.worker_pod_requests(job).get(keys.GPU_RESOURCE, Decimal(0)))


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
    Pending on the node placement chose for it).
    """
    worker = job.spec.worker
    return admits(((worker.template if worker is not None else {}).get("spec")) or {}, node)


def request_of(job: MPIJob) -> JobRequest:
    return JobRequest(workers=job.spec.worker_replicas, gpus_per_worker=gpus_per_worker(job))


# --- decisions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The placement an admitted job holds, as its PlacementDecision records it."""

    uid: str
    """The MPIJob's uid: a same-named successor never inherits a decision."""
    assignments: tuple[WorkerAssignment, ...]
    ring_gbps: float
    summary: str = ""
    compute_domain: str = ""
    """The job's ComputeDomain, when it spans nodes of one NVLink clique; empty otherwise."""
    released: Released | None = None
    """Set once the placement was given back because the job's workers were refused or
    unschedulable: the decision then holds no GPUs and records the job's hold-off."""


def decision_object(job: MPIJob, placement: Placement, *, compute_domain: str = "") -> JSON:
    """The PlacementDecision recording ``placement`` for ``job``: in the job's namespace, under
    its name. No owner reference: the operator deletes it itself, once the job's pods are gone
    (garbage collection would delete it while they still hold their GPUs)."""
    return {
        "apiVersion": keys.DECISION_API_VERSION,
        "kind": keys.DECISION_KIND,
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {keys.LABEL_JOB_NAME: job.name},
        },
        "spec": {
            "job": {"name": job.name, "uid": job.metadata.uid},
            "ringGBps": placement.ring_gbps,
            "summary": placement.summary,
            "workers": [{"node": a.node, "gpus": list(a.gpus)} for a in placement.assignments],
            **({"computeDomain": compute_domain} if compute_domain else {}),
        },
    }


def released_object(body: Mapping[str, Any], reason: str, message: str, at: datetime) -> JSON:
    """The PlacementDecision ``body`` given back: no workers, so it holds no GPUs, and when and
    why, so that the job is held off (also by a restarted operator) until
    ``--placement-release-seconds`` after ``at``. Replaces ``body`` (its ``resourceVersion``:
    a concurrent change is a conflict). Deleted like any decision once the job is gone,
    finished or suspended, and replaced by the job's next placement."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    stamp = format_time(at)
    return {
        "apiVersion": keys.DECISION_API_VERSION,
        "kind": keys.DECISION_KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "labels": dict(meta.get("labels") or {}),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {
            "job": dict(spec.get("job") or {}),
            "ringGBps": 0.0,
            "summary": f"released ({reason}) at {stamp}",
            "workers": [],
            "released": {"reason": reason, "at": stamp, "message": message},
        },
    }


def parse_decision(body: Mapping[str, Any] | None) -> Decision | None:
    """A PlacementDecision's content; None for none, or one that does not read (then it holds
    nothing: only the operator writes these, so it is not ours to guess at)."""
    if not body:
        return None
    try:
        spec = body["spec"]
        assignments = tuple(
            WorkerAssignment(str(w["node"]), tuple(sorted(int(g) for g in w["gpus"])))
            for w in spec["workers"]
        )
        released = None
        if isinstance(spec.get("released"), Mapping):
            at = parse_time(spec["released"].get("at"))
            if at is not None:
                released = Released(str(spec["released"].get("reason") or ""), at)
        return Decision(
            str(spec["job"]["uid"]),
            assignments,
            float(spec.get("ringGBps") or 0.0),
            str(spec.get("summary") or ""),
            str(spec.get("computeDomain") or ""),
            released,
        )
    except (KeyError, TypeError, ValueError):
        return None


def load_decision(job: MPIJob, body: Mapping[str, Any] | None) -> Decision | None:
    """The job's decision: the PlacementDecision ``body`` if it was written for this job (its
    uid) and still describes it (as many workers); else None and the job is placed anew."""
    decision = parse_decision(body)
    if decision is None or decision.uid != job.metadata.uid:
        return None
    if len(decision.assignments) != job.spec.worker_replicas:
        return None  # scaled since: the old decision no longer describes the job
    return decision


def pod_placements(decision: Decision, nodes: Mapping[str, NodeState]) -> list[PodPlacement]:
    """Per worker: its node, and the annotations that tell the device layer its GPUs."""
    out = []
    channel = (
        compute_domain.channel_template(decision.compute_domain)
        if decision.compute_domain
        else None
    )
    for assignment in decision.assignments:
        annotations = {
            keys.GPU_IDS: ",".join(str(g) for g in assignment.gpus),
            keys.RING_BANDWIDTH: f"{decision.ring_gbps:g}",
        }
        node = nodes.get(assignment.node)
        uuids = node.topology.uuids_of(assignment.gpus) if node is not None else None
        if uuids:
            annotations[keys.GPU_UUIDS] = ",".join(uuids)
        out.append(PodPlacement(assignment.node, annotations, channel))
    return out


def locations(
    nodes: Iterable[Mapping[str, Any]],
    fabric: Fabric,
    hypernodes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Location]:
    """Each node's domains in the fabric, read from its labels, and for the levels on HyperNode
    tiers from the HyperNodes (none listed: no node is in a domain of those levels)."""
    labels = {
        str((node.get("metadata") or {}).get("name")): (node.get("metadata") or {}).get("labels")
        or {}
        for node in nodes
    }
    if fabric_labels.hypernode_tiers(fabric):
        labels = fabric_labels.with_hypernodes(labels, hypernodes)
    return {name: fabric.location(own) for name, own in labels.items()}


def releasable(
    decision: Decision, key: JobKey, job: MPIJob | None, pods: Iterable[Mapping[str, Any]]
) -> bool:
    """Whether the decision for the job ``key`` can be deleted now: its job is gone (or
    replaced by a same-named one), finished or suspended, and none of its placed workers holds a
    GPU any more (a terminating one still does: its container keeps the device until it exits).
    The record of a hold-off (``released``) goes only with its job.

    Only a placed worker keeps a decision (:func:`placed_worker`). Any other pod, even one
    naming the job as its controller (anyone who may create pods in the namespace can write such
    a reference), holds nothing of the decision's: bound, it is counted by its own GPU requests
    instead.
    """
    same = job is not None and job.metadata.uid == decision.uid
    if same and decision.released is not None:
        # The record of the job's hold-off holds no GPUs and goes with the job: a status that
        # says finished (its tenant may write one, and take it back) does not end the hold-off.
        return False
    running = job is not None and not (job.status.finished or job.spec.suspended)
    if running and same:
        return False
    return not any(placed_worker(p, key, decision) is not None for p in pods)


def placed_worker(pod: Mapping[str, Any], key: JobKey, decision: Decision) -> int | None:
    """The index of the worker ``pod`` is in the decision for job ``key``, while it holds that
    worker's GPUs: the worker the operator created (:func:`mpijob.desired.names.worker_index`,
    an index the decision has), bound to its assignment's node and not finished; None for any
    other pod."""
    if terminal(pod):
        return None
    index = _worker_of(pod, key, decision)
    if index is None:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    return index if node == decision.assignments[index].node else None


def _worker_of(pod: Mapping[str, Any], key: JobKey, decision: Decision) -> int | None:
    """Which of the decision's workers ``pod`` is, wherever it runs."""
    namespace, name = key
    return names.worker_index(pod, namespace, name, decision.uid, len(decision.assignments))


#: How long a node must have been not Ready before a placed job's worker that is gone from it
#: loses the node: until then a missing worker is only created again there. A node is not
#: Ready for a moment when its heartbeats could not reach the API server (a restart of the
#: control plane, a kubelet's), and a job placed anew loses its training's progress. Counted
#: from the Ready condition's ``lastTransitionTime``, or from when this process first saw the
#: node not Ready if that is later (a process started long after the transition has seen
#: nothing of it). Kubernetes' own node lifecycle controller waits before it acts on a node,
#: too: 50 s without heartbeats before not Ready, then each pod's 300 s toleration of it.
NODE_LOST_GRACE_SECONDS = 60.0

#: The share of the topology pool's nodes that, not Ready together, make no node of them
#: count as lost for being not Ready: the node lifecycle controller's unhealthy-zone threshold
#: (``--unhealthy-zone-threshold``, 0.55), at which it takes the zone for disrupted and evicts
#: from its nodes slowly, or not at all (a cluster under 50 nodes; every zone fully disrupted,
#: when it takes the control plane for the broken part). Most nodes not Ready at once is the
#: network's or the control plane's trouble, seldom that of each node. Kubernetes also wants
#: three such nodes at least; here any share counts, so a pool of one or two nodes that all
#: went not Ready loses none of them either.
DISRUPTION_SHARE = 0.55

#: While the pool is disrupted, how often a job whose worker is gone from a node that is not
#: Ready is looked at again (no event says when the other nodes are back).
DISRUPTED_RECHECK_SECONDS = 10.0


def ready(node: Mapping[str, Any]) -> bool:
    """Whether the node's ``Ready`` condition is ``True``."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def disrupted(not_ready: int, pool: int) -> bool:
    """Whether ``not_ready`` nodes of a pool of ``pool`` are :data:`DISRUPTION_SHARE` of it."""
    return pool > 0 and not_ready / pool >= DISRUPTION_SHARE


@dataclass(frozen=True)
class PoolHealth:
    """What the whole topology pool says, as the caller read it, for :func:`lost_nodes`."""

    not_ready_seen: Mapping[str, datetime] = field(default_factory=dict)
    """Node -> when this process first saw it not Ready (since it last saw it Ready)."""
    disrupted: bool = False
    """:data:`DISRUPTION_SHARE` of the pool is not Ready (:func:`disrupted`)."""
    recovered: datetime | None = None
    """When the pool was last no longer disrupted: every node still not Ready then gets a
    whole grace from there, as the node lifecycle controller gives each node a fresh grace
    when it leaves its full-disruption mode (nodes come back one by one, and the pool stops
    being disrupted before the last of them is Ready)."""


@dataclass(frozen=True)
class Lost:
    """Whether a node under a placed job was lost."""

    message: str = ""
    """Why the job must be placed anew; empty while it need not (yet)."""
    recheck: float | None = None
    """Seconds until time alone may lose a node (its grace ends, or the pool is looked at
    again while disrupted): look again then."""


def grace_left(node: Mapping[str, Any], now: datetime, health: PoolHealth, grace: float) -> float:
    """Seconds left at ``now`` of the grace of ``node``, not Ready: counted from its Ready
    condition's last transition, from when this process first saw it not Ready, or from when
    the pool last recovered from a disruption, whichever is latest (none known: from now)."""
    name = str((node.get("metadata") or {}).get("name") or "")
    conditions = (node.get("status") or {}).get("conditions") or []
    transition = next(
        (parse_time(c.get("lastTransitionTime")) for c in conditions if c.get("type") == "Ready"),
        None,
    )
    starts = [t for t in (transition, health.not_ready_seen.get(name), health.recovered) if t]
    waited = (now - max(starts)).total_seconds() if starts else 0.0
    return grace - max(0.0, waited)


def lost_nodes(
    decision: Decision,
    job: MPIJob,
    nodes: Mapping[str, Mapping[str, Any] | None],
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    health: PoolHealth = PoolHealth(),
    grace: float = NODE_LOST_GRACE_SECONDS,
) -> Lost:
    """Whether a placed job must be placed anew because of its nodes, and why.

    ``nodes`` maps each node of the decision to the Node, or None once it was deleted. A deleted
    node has lost its workers: nothing runs there any more, and its GPUs must not stay reserved.
    A node that was cordoned (drained) or left the topology pool keeps the job's worker while
    that worker lives there (bound, neither finished nor terminating: the cluster decides
    evictions), and loses it once the worker is gone, terminating, failed or not bound: a
    worker recreated there would wait for good, pinned to a node placement no longer offers.
    A node that is not Ready keeps it so too, and loses a worker that is gone only once it has
    been not Ready for ``grace`` seconds (:data:`NODE_LOST_GRACE_SECONDS`, :func:`grace_left`),
    and never while the pool is disrupted (:data:`DISRUPTION_SHARE`): until then the missing
    worker is created again on its node, and the job is looked at again when time alone may
    lose the node (``recheck``).
    """
    workers = {}
    for pod in pods:
        index = names.worker_index(
            pod, job.namespace, job.name, job.metadata.uid, job.spec.worker_replicas
        )
        if index is not None:
            workers[index] = pod
    found = []
    recheck: float | None = None
    for index, assignment in enumerate(decision.assignments):
        node = nodes.get(assignment.node)
        worker = workers.get(index)
        # Bound: one created again there and waiting for the node to take it keeps nothing.
        alive = (
            worker is not None
            and bool((worker.get("spec") or {}).get("nodeName"))
            and not terminal(worker)
            and not _terminating(worker)
        )
        if node is not None and (opted_in(node) or alive):
            continue
        why = _unusable(node)
        if node is not None and why == _NOT_READY:
            wait = (
                DISRUPTED_RECHECK_SECONDS
                if health.disrupted
                else grace_left(node, now, health, grace)
            )
            if health.disrupted or wait > 0:
                recheck = wait if recheck is None else min(recheck, wait)
                continue
            why = f"{why} (not Ready past the grace of {int(grace)}s)"
        found.append(f"node {assignment.node} {why}")
    if not found:
        return Lost(recheck=recheck)
    return Lost(f"{'; '.join(sorted(set(found)))}: its workers are removed and the job placed anew")


_NOT_READY = "is not Ready and its worker is gone"


def _unusable(node: Mapping[str, Any] | None) -> str:
    if node is None:
        return "was deleted"
    if (node.get("spec") or {}).get("unschedulable"):
        return "was cordoned and its worker is gone"
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(keys.NODE_GPU_SCHEDULE_LABEL) != keys.NODE_GPU_SCHEDULE_TOPOLOGY:
        return "left the topology pool and its worker is gone"
    return _NOT_READY


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


#: How long a placed worker's pod may stay unschedulable with its claim unallocated before the
#: job is placed anew: the scheduler retries a claim whose device is busy, so a moment passes.
TAKEN_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Taken:
    """Whether a placed job's pinned GPUs were taken before its claims were allocated."""

    message: str = ""
    """Why the job must be placed anew; empty while it need not (yet)."""
    recheck: float | None = None
    """Seconds until a worker that cannot be scheduled now reaches the grace: look again then."""


def gpus_taken(
    pods: Iterable[Mapping[str, Any]],
    claims: Mapping[str, Mapping[str, Any]],
    now: datetime,
    grace: float = TAKEN_GRACE_SECONDS,
) -> Taken:
    """Whether the job must be placed anew (dra binding): a worker whose pod uses a pinned claim
    has been unschedulable for ``grace`` seconds while its claim is unallocated, because another
    claim took one of its GPUs between the decision and the binding."""
    recheck: float | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        claim_name = (meta.get("annotations") or {}).get(keys.GPU_CLAIM)
        if not claim_name or (pod.get("spec") or {}).get("nodeName") or terminal(pod):
            continue
        claim = claims.get(claim_name)
        if claim is None or (claim.get("status") or {}).get("allocated"):
            continue
        if (stuck := _unschedulable(pod, now)) is None:
            continue
        waited, message = stuck
        if waited < grace:
            left = grace - waited
            recheck = left if recheck is None else min(recheck, left)
            continue
        ids = (meta.get("annotations") or {}).get(keys.GPU_IDS, "?")
        return Taken(
            f"worker {meta.get('name')}'s GPUs [{ids}] could not be allocated for "
            f"{int(waited)}s (another claim holds one: "
            f"{message or 'unschedulable'}); placing the job anew"
        )
    return Taken(recheck=recheck)


def _unschedulable(pod: Mapping[str, Any], now: datetime) -> tuple[float, str] | None:
    """Seconds ``pod`` has been unschedulable (``PodScheduled=False``, reason ``Unschedulable``)
    and the scheduler's message; None while it is not."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            since = parse_time(c.get("lastTransitionTime"))
            waited = (now - since).total_seconds() if since is not None else 0.0
            return waited, str(c.get("message") or "")
    return None


def unschedulable_workers(
    decision: Decision,
    key: JobKey,
    pods: Iterable[Mapping[str, Any]],
    now: datetime,
    seconds: float,
) -> Taken:
    """Whether a placed job must give its placement back because a worker of it has been
    unschedulable (``PodScheduled=False``, reason ``Unschedulable``) for ``seconds``: its
    decision would otherwise hold GPUs for a pod that never runs (a request no node can meet,
    a toleration it lacks), and the jobs behind it would wait for good."""
    recheck: float | None = None
    for pod in pods:
        if _worker_of(pod, key, decision) is None:
            continue
        pod_name = str((pod.get("metadata") or {}).get("name") or "")
        if (pod.get("spec") or {}).get("nodeName") or terminal(pod) or _terminating(pod):
            continue
        if (stuck := _unschedulable(pod, now)) is None:
            continue
        waited, message = stuck
        if waited < seconds:
            left = seconds - waited
            recheck = left if recheck is None else min(recheck, left)
            continue
        return Taken(
            f"worker {pod_name} has been unschedulable for {int(waited)}s "
            f"({message or 'no reason given'}); its placement is released and the "
            f"job is queued again in {int(seconds)}s"
        )
    return Taken(recheck=recheck)


# --- nodes -----------------------------------------------------------------------------------


def opted_in(node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(keys.NODE_GPU_SCHEDULE_LABEL) != keys.NODE_GPU_SCHEDULE_TOPOLOGY:
        return False
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return ready(node)


@dataclass(frozen=True)
class Snapshot:
    """What one admission pass reads from the caches."""

    nodes: list[JSON]
    """Opted-in nodes."""
    pods: list[JSON]
    """Pods that request GPUs (``nvidia.com/gpu``), anyone's."""
    decisions: dict[JobKey, Decision]
    """Every PlacementDecision, by the job it names."""
    allocated: dict[str, list[str]] = field(default_factory=dict)
    """Node -> NVIDIA GPU devices (``gpu-<minor>``) allocated to any ResourceClaim (dra mode)."""
    slices: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node -> device name -> GPU UUID, from the NVIDIA driver's ResourceSlices (dra mode)."""
    quotas: dict[str, list[JSON]] = field(default_factory=dict)
    """Namespace -> its ResourceQuotas that limit GPUs (:mod:`mpijob.gang.quota`)."""
    claims: dict[JobKey, list[JSON]] = field(default_factory=dict)
    """Job key -> the ResourceClaims a job of that name controls (dra mode)."""
    claims_as_gpus: bool = False
    """NVIDIA's DeviceClass maps its devices to ``nvidia.com/gpu`` (dra mode)."""
    hypernodes: list[JSON] = field(default_factory=list)
    """Volcano's HyperNodes (when the fabric reads HyperNode tiers and the API serves them)."""
    requested: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    """Node -> what its bound, unfinished pods (anyone's) request, as the scheduler sums it
    (:func:`mpijob.pods.predicates.pod_requests`): what :mod:`mpijob.gang.fit` fits against."""
    tainted: dict[str, set[str]] = field(default_factory=dict)
    """Node -> UUIDs of GPUs whose device taints in the driver's ResourceSlice keep new claims
    off them (dra mode)."""


@dataclass
class Holdings:
    """Which GPUs are taken, as far as the operator may believe it.

    Decisions are believed: only the operator writes them. A pod is counted by what the cluster
    says it holds, never by what it says of itself: a bound pod holds as many GPUs as it
    requests there, which ones unknown, less those its job's decision already counts when it is
    that decision's placed worker (:func:`placed_worker`, carrying exactly its assignment's
    ``mpijob.io/gpu-ids``). A placed worker requesting more than its assignment holds the rest
    as any other pod: the tenant writes the worker's template, the operator only its name,
    labels and owner.
    """

    known: dict[str, set[int]] = field(default_factory=dict)
    """Node -> GPU indices held by decisions."""
    uuids: dict[str, set[str]] = field(default_factory=dict)
    """Node -> UUIDs of GPUs the scheduler allocated to ResourceClaims (anyone's)."""
    unplaced: dict[str, int] = field(default_factory=dict)
    """Node -> GPUs held by pods that no decision placed (a count: the indices are unknown)."""
    holders: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    """Node -> (namespace, pod, GPUs) of those pods, to say who holds them when a job waits."""
    tainted: dict[str, set[str]] = field(default_factory=dict)
    """Node -> UUIDs of GPUs no new claim may get (device taints): taken, by nobody."""

    def note(self, nodes: Iterable[str], namespace: str) -> str:
        """Who holds GPUs on ``nodes`` outside our placement, for the message of a job waiting
        in ``namespace``: pods of that namespace by name, any other namespace's as a count only
        (a job's status is read by its own namespace's users, who must not learn what runs in
        another's)."""
        parts = []
        for node in sorted(set(nodes)):
            own = [f"{pod} ({n})" for ns, pod, n in self.holders.get(node, ()) if ns == namespace]
            other = sum(n for ns, _, n in self.holders.get(node, ()) if ns != namespace)
            if other:
                own.append(f"{other} GPU(s) by pods of other namespaces")
            if own:
                parts.append(f"{node}: {', '.join(own)}")
        return "held by pods this operator did not place: " + "; ".join(parts) if parts else ""


def holdings(
    decisions: Mapping[JobKey, Decision],
    pods: Iterable[Mapping[str, Any]],
    allocated: Mapping[str, Iterable[str]] | None = None,
    slices: Mapping[str, Mapping[str, str]] | None = None,
    tainted: Mapping[str, Iterable[str]] | None = None,
) -> Holdings:
    """GPUs held by ``decisions`` (by job key), by ``pods`` (bound, unfinished pods that
    request GPUs; terminating ones included) and by DRA allocations (``allocated`` devices per
    node, identified through the driver's ``slices``; a device no slice names counts as one GPU
    of unknown index); and the ``tainted`` GPUs (UUIDs per node), which no new claim gets."""
    out = Holdings(tainted={node: set(uuids) for node, uuids in (tainted or {}).items()})
    for node, devices in (allocated or {}).items():
        names_ = (slices or {}).get(node) or {}
        for device in devices:
            if uuid := names_.get(device):
                out.uuids.setdefault(node, set()).add(uuid)
            else:
                out.unplaced[node] = out.unplaced.get(node, 0) + 1
    for decision in decisions.values():
        for assignment in decision.assignments:
            out.known.setdefault(assignment.node, set()).update(assignment.gpus)
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node or terminal(pod):
            continue
        count = _gpus_of(pod) - _placed_gpus(pod, decisions)
        if count <= 0:
            continue
        meta = pod.get("metadata") or {}
        out.unplaced[node] = out.unplaced.get(node, 0) + count
        out.holders.setdefault(node, []).append(
            (str(meta.get("namespace") or ""), str(meta.get("name") or ""), count)
        )
    return out


def _placed_gpus(pod: Mapping[str, Any], decisions: Mapping[JobKey, Decision]) -> int:
    """How many of ``pod``'s GPUs its job's decision already counts: its assignment's, when it
    is that decision's placed worker on exactly those GPUs; none for any other pod.

    Its ``mpijob.io/gpu-ids`` (which its tenant may rewrite) can only take that away: a worker
    whose annotation names other GPUs than its assignment (one left from an earlier placement
    of the job, or one rewritten) is counted by its requests, as a pod no decision placed.
    """
    meta = pod.get("metadata") or {}
    key = (
        str(meta.get("namespace") or ""),
        str((meta.get("labels") or {}).get(keys.LABEL_JOB_NAME) or ""),
    )
    decision = decisions.get(key)
    if decision is None:
        return 0
    index = placed_worker(pod, key, decision)
    if index is None:
        return 0
    gpus = decision.assignments[index].gpus
    ids = gpu_ids((meta.get("annotations") or {}).get(keys.GPU_IDS))
    return len(gpus) if tuple(sorted(ids)) == gpus else 0


def _gpus_of(pod: Mapping[str, Any]) -> int:
    """GPUs a pod (or a summary of one) holds, as the scheduler counts them."""
    return effective_gpus(pod.get("spec") or {})


def node_states(
    nodes: Iterable[Mapping[str, Any]], held: Holdings | None = None
) -> list[NodeState]:
    """Opted-in, Ready, schedulable nodes with a readable topology, and their taken GPUs.

    A node whose annotation cannot be read is skipped (the agent, or a person, must fix it);
    placement never guesses a topology.
    """
    held = held or Holdings()
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
        taken = {g for g in held.known.get(name, ()) if 0 <= g < topology.size}
        allocated = held.uuids.get(name, set())
        by_uuid = {gpu.uuid: gpu.index for gpu in topology.gpus if gpu.uuid}
        taken |= {by_uuid[u] for u in allocated | held.tainted.get(name, set()) if u in by_uuid}
        unplaced = held.unplaced.get(name, 0) + len(allocated - set(by_uuid))
        states.append(NodeState(name, topology, frozenset(taken), unplaced))
    return sorted(states, key=lambda s: s.name)


#: Device taint effects that keep the scheduler from allocating a device to a new claim
#: (``NoExecute`` also evicts the pods of claims that have it); ``None`` only informs.
EXCLUDING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def keeps_claims_off(taints: Any) -> bool:
    """Whether a ResourceSlice device's ``taints`` keep new claims off it. A claim the operator
    pins to such a GPU would never be allocated (the claims it makes tolerate no taint), so
    placement counts it as taken. Served from 1.36 (beta) and GA in 1.37;
    on 1.35 the field is absent unless its alpha gate is on, and nothing is tainted."""
    if not isinstance(taints, list):
        return False
    return any(
        isinstance(t, Mapping) and t.get("effect") in EXCLUDING_TAINT_EFFECTS for t in taints
    )


def slice_conflicts(
    nodes: Iterable[Mapping[str, Any]], slices: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """Nodes whose NVIDIA ResourceSlice names other GPUs than their topology annotation, and
    why: placement skips them (a claim pinned by a UUID the driver does not publish would never
    be allocated, and one it does publish may not be the GPU the topology describes)."""
    out = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name"))
        published = set((slices.get(name) or {}).values())
        text = (meta.get("annotations") or {}).get(keys.GPU_TOPOLOGY)
        if not published or not text:
            continue
        try:
            described = {g.uuid for g in codec.loads(text).gpus if g.uuid}
        except ValueError:
            continue
        if published != described:
            only_slice = sorted(published - described)
            only_topology = sorted(described - published)
            out[name] = (
                f"node {name}: its {keys.NVIDIA_GPU_DRIVER} ResourceSlice and its "
                f"{keys.GPU_TOPOLOGY} annotation disagree (only in the slice: "
                f"{', '.join(only_slice) or 'none'}; only in the topology: "
                f"{', '.join(only_topology) or 'none'}); placement skips the node until they agree"
            )
    return out
