"""One admission pass's decision, pure: from a snapshot of the caches to a decision per job.

The pass (:meth:`mpijob.gang.service.Admission.run_pass`) reads the caches, calls
:func:`decide` off the event loop, and applies what comes back. Here, from its arguments only:

- each waiting job's eligible nodes, those its worker template's ``nodeSelector`` and required
  node affinity admit (:class:`Eligible`, computed once per distinct selection);
- the GPUs already taken, by decisions (the cache's, and those written but not seen yet) and by
  pods no decision placed (:func:`mpijob.gang.topology.holdings`);
- its namespace's GPU quotas against what the namespace's decisions hold, this pass's
  admissions included (:func:`held_in`, :func:`over_quota`);
- its placement on the nodes left (:class:`Placer`: over the fabric when there is one, noting
  the ComputeDomain a job spanning nodes of one NVLink clique needs);
- the fair order and head-of-line rules of :func:`mpijob.gang.queue.decide`, with whether the
  job would fit on empty nodes at all (else it blocks no one).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from mpijob import api
from mpijob.api import JSON, JobKey
from mpijob.api.errors import aggregate
from mpijob.api.fabric import fabric_level
from mpijob.desired import compute_domain
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import fit, queue, quota, topology
from mpijob.placement.fabric import CLIQUE_LABEL, Fabric, Location
from mpijob.placement.job import NodeState, NoFit, Placement, claim, place_job
from mpijob.pods.predicates import Requests, admits, tolerates

NO_ELIGIBLE_NODE = (
    "no opted-in node matches the worker template's nodeSelector and required node affinity, "
    "or tolerates the node's taints"
)


def node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name"))


def worker_spec_of(job: api.MPIJob) -> dict[str, Any] | None:
    worker = job.spec.worker
    return dict(worker.template.get("spec") or {}) if worker is not None else None


class Eligible:
    """The nodes each job's worker template admits, computed once per distinct selection (its
    ``nodeSelector``, node affinity and tolerations) and narrowed first through an index of node
    labels."""

    def __init__(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        self.nodes = {node_name(n): n for n in nodes}
        self.by_label: dict[tuple[str, str], set[str]] = {}
        for name, n in self.nodes.items():
            for item in ((n.get("metadata") or {}).get("labels") or {}).items():
                self.by_label.setdefault(item, set()).add(name)
        self.seen: dict[str, frozenset[str]] = {}

    def of(self, job: api.MPIJob) -> frozenset[str]:
        worker = job.spec.worker
        spec = ((worker.template if worker is not None else {}).get("spec")) or {}
        selection = {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations")}
        key = json.dumps(selection, sort_keys=True, default=str)
        found = self.seen.get(key)
        if found is None:
            names: set[str] | None = None
            for key_, value in (spec.get("nodeSelector") or {}).items():
                matching = self.by_label.get((str(key_), str(value)), set())
                names = set(matching) if names is None else names & matching
            candidates = self.nodes.keys() if names is None else names
            found = frozenset(
                n
                for n in candidates
                if admits(spec, self.nodes[n]) and tolerates(spec, self.nodes[n])
            )
            self.seen[key] = found
        return found


@dataclass(frozen=True)
class Placer:
    """How a job is placed: over a fabric, or with one inter-node bandwidth."""

    inter_node_gbps: float
    fabric: Fabric | None = None
    """Levels of domains between nodes; None: one inter-node bandwidth (``inter_node_gbps``)."""

    def place(
        self, job: api.MPIJob, nodes: Sequence[NodeState], where: Mapping[str, Location]
    ) -> tuple[Placement | NoFit, bool]:
        """The job placed on ``nodes``, and whether the placement spans nodes of one NVLink
        clique (then the job needs a ComputeDomain)."""
        request = topology.request_of(job)
        if self.fabric is None:
            return place_job(request, nodes, inter_node_gbps=self.inter_node_gbps), False
        # Here, not at import: the fabric search needs numpy, which an operator without a fabric
        # never loads.
        from mpijob.placement.span import place_on_fabric

        level, errors = fabric_level(job.metadata.annotations or {}, self.fabric.level_names)
        if errors:
            return NoFit(aggregate(errors)), False
        required = level.level if level is not None and level.required else None
        preferred = level.level if level is not None and not level.required else None
        result = place_on_fabric(
            request, nodes, self.fabric, where, required=required, preferred=preferred
        )
        if isinstance(result, NoFit):
            return result, False
        placement = replace(result.placement, summary=result.summary)
        spans_clique = len(placement.nodes) > 1 and self.clique_level() == result.level
        return placement, spans_clique

    def clique_level(self) -> str | None:
        """The fabric level of NVLink cliques (labelled by GFD), if it has one."""
        levels = self.fabric.levels if self.fabric else ()
        return next((lv.name for lv in levels if lv.label == CLIQUE_LABEL), None)


@dataclass(frozen=True)
class Outcome:
    """A pass's decisions, and the ComputeDomain each admitted job spanning a clique needs."""

    decisions: list[queue.Decision[Placement]]
    domains: dict[str, str] = field(default_factory=dict)
    """Job uid -> the name of its ComputeDomain, created before its decision is written."""


def decide(
    placer: Placer,
    snap: topology.Snapshot,
    nodes_raw: Sequence[JSON],
    decisions: Mapping[JobKey, topology.Decision],
    jobs: Sequence[api.MPIJob],
    *,
    priority_values: Mapping[str, int],
    held_in: Mapping[str, list[tuple[str, quota.Held]]],
    where: Mapping[str, Location],
    binding: GpuBinding,
    now: datetime,
    placement_seconds: Callable[[float], None] = lambda _: None,
) -> Outcome:
    """One pass's decisions for ``jobs`` over ``nodes_raw`` (the opted-in nodes the pass may
    use), with the GPUs ``decisions`` and the snapshot's pods hold taken.
    ``placement_seconds`` is told how long each placement took (a histogram)."""
    held = topology.holdings(decisions, snap.pods, snap.allocated, snap.slices, snap.tainted)
    nodes = topology.node_states(nodes_raw, held)
    empty = topology.node_states(nodes_raw)
    by_uid = {}
    waiting = []
    domains: dict[str, str] = {}
    # Each job is placed only on the nodes its worker template admits; jobs whose
    # templates select alike share the work (thousands of jobs, a few templates).
    eligible = Eligible(nodes_raw)
    room = fit.Room(nodes_raw, snap.requested)
    allowed, requests, never = _fitting(jobs, eligible, room)
    for job in jobs:
        w = queue.waiting_job(job, priority_values=priority_values, nodes=allowed[job.metadata.uid])
        waiting.append(w)
        by_uid[w.uid] = job
    idle = fit.Room(nodes_raw, {})
    fits_when_empty = _fits_when_empty(placer, by_uid, allowed, empty, where, idle, requests)

    admitted: dict[JobKey, tuple[Placement, api.MPIJob]] = {}
    """Admitted earlier in this pass: their GPUs count against their quotas."""
    state = {n.name: n for n in nodes}
    """Each node with the GPUs taken so far, this pass's admissions included."""

    def try_place(w: queue.WaitingJob, granted: Sequence[Placement]) -> Any:
        job = by_uid[w.uid]
        if over := over_quota(job, snap, admitted, held_in, binding):
            return queue.OverQuota(over)
        if never[w.uid]:
            return queue.NeverFits(never[w.uid])
        if not allowed[w.uid]:
            return NoFit(NO_ELIGIBLE_NODE)
        # Not on the nodes held for the jobs ahead that do not fit yet, and of each node only
        # the GPUs of as many workers as its other resources still hold.
        request = requests[w.uid]
        free, short = _room_left(
            [state[n] for n in sorted(allowed[w.uid] - w.avoid) if n in state],
            room,
            request,
            topology.gpus_per_worker(job),
        )
        started = time.perf_counter()
        result, spans_clique = placer.place(job, free, where)
        placement_seconds(time.perf_counter() - started)
        if isinstance(result, NoFit):
            notes = [result.reason]
            if short:
                notes.append(_short_note(short))
            if note := held.note(allowed[w.uid], w.namespace):
                notes.append(note)
            return NoFit("; ".join(notes)) if len(notes) > 1 else result
        domains.pop(job.metadata.uid, None)
        if spans_clique:
            domains[job.metadata.uid] = compute_domain.domain_name(job.name)
        admitted[(job.namespace, job.name)] = (result, job)
        used = [state[n] for n in dict.fromkeys(a.node for a in result.assignments)]
        state.update((n.name, n) for n in claim(used, result))
        for node, count in Counter(a.node for a in result.assignments).items():
            room.take(node, request, count)
        return result

    out = queue.decide(waiting, try_place, now=now, fits=fits_when_empty)
    return Outcome(out, domains)


def _fitting(
    jobs: Sequence[api.MPIJob], eligible: Eligible, room: fit.Room
) -> tuple[dict[str, frozenset[str]], dict[str, Requests], dict[str, str]]:
    """By job uid: the nodes it may go to (its template admits them, and each could hold one
    worker even empty), what one worker takes of its node besides GPUs, and why no node could
    hold one (empty while some can). Jobs alike (their nodes and requests) are weighed once."""
    allowed: dict[str, frozenset[str]] = {}
    requests: dict[str, Requests] = {}
    never: dict[str, str] = {}
    holdable: dict[tuple[frozenset[str], tuple[Any, ...]], tuple[frozenset[str], str]] = {}
    for job in jobs:
        uid = job.metadata.uid
        requests[uid] = fit.worker_requests(job)
        admitted_by = eligible.of(job)
        shape = (admitted_by, tuple(sorted(requests[uid].items())))
        if shape not in holdable:
            lacking = {n: room.never(n, requests[uid]) for n in admitted_by}
            lacking = {n: names for n, names in lacking.items() if names}
            nodes_left = admitted_by - lacking.keys()
            why = (
                fit.never_message(requests[uid], lacking, room)
                if lacking and not nodes_left
                else ""
            )
            holdable[shape] = (frozenset(nodes_left), why)
        allowed[uid], never[uid] = holdable[shape]
    return allowed, requests, never


def _room_left(
    nodes: Sequence[NodeState], room: fit.Room, request: Requests, gpus_per_worker: int
) -> tuple[list[NodeState], dict[str, list[str]]]:
    """``nodes`` as placement may use them for one job: a node whose other resources hold
    fewer workers than its free GPUs would offers only those workers' GPUs (the rest count as
    held, which ones unknown). Also, by resource, the nodes it bounds so."""
    out = []
    short: dict[str, list[str]] = {}
    for node in nodes:
        count, bound = room.workers(node.name, request)
        offered = node.free_count
        if count is not None and count * gpus_per_worker < offered:
            extra = offered - count * gpus_per_worker
            out.append(NodeState(node.name, node.topology, node.used, node.unplaced + extra))
            short.setdefault(bound, []).append(node.name)
        else:
            out.append(node)
    return out, short


def _short_note(short: Mapping[str, list[str]]) -> str:
    """Which resources, on how many nodes, leave GPUs that no worker of the job could use."""
    parts = [f"{name} on {len(nodes)} node(s)" for name, nodes in sorted(short.items())]
    return (
        "GPUs not offered where a worker's other requests do not fit beside the pods "
        f"already there: {', '.join(parts)}"
    )


def _fits_when_empty(
    placer: Placer,
    by_uid: Mapping[str, api.MPIJob],
    allowed: Mapping[str, frozenset[str]],
    empty: Sequence[NodeState],
    where: Mapping[str, Location],
    idle: fit.Room,
    requests: Mapping[str, Requests],
) -> Callable[[queue.WaitingJob], bool]:
    """Whether a job would fit with nothing running (else it blocks no one), placed once per
    kind of job: its request, and the nodes it may go to (their topologies and how many of its
    workers each could hold when idle, or with a fabric the nodes themselves and its fabric
    annotations)."""
    empty_by_name = {n.name: n for n in empty}
    fits_cache: dict[tuple[Any, ...], bool] = {}
    shapes: dict[tuple[frozenset[str], tuple[Any, ...]], tuple[Any, ...]] = {}

    def fits_when_empty(w: queue.WaitingJob) -> bool:
        job = by_uid[w.uid]
        nodes = allowed[w.uid]
        request = requests[w.uid]
        wanted = tuple(sorted(request.items()))
        annotations: tuple[tuple[str, str], ...] = ()
        if placer.fabric is None:
            # Without a fabric, only the nodes' topologies and room matter, not which nodes.
            if (nodes, wanted) not in shapes:
                own = nodes & empty_by_name.keys()
                shapes[nodes, wanted] = tuple(
                    sorted(
                        (empty_by_name[n].topology.fingerprint, _or_unbounded(idle, n, request))
                        for n in own
                    )
                )
            shape: Any = shapes[nodes, wanted]
        else:
            shape = nodes
            annotations = tuple(sorted((job.metadata.annotations or {}).items()))
        key = (topology.request_of(job), shape, wanted, annotations)
        if key not in fits_cache:
            own_empty = [empty_by_name[n] for n in sorted(nodes & empty_by_name.keys())]
            own_empty, _ = _room_left(own_empty, idle, request, topology.gpus_per_worker(job))
            fits_cache[key] = isinstance(placer.place(job, own_empty, where)[0], Placement)
        return fits_cache[key]

    return fits_when_empty


def _or_unbounded(room: fit.Room, node: str, request: Requests) -> int:
    """How many workers of ``request`` ``node`` holds, -1 for no bound."""
    count, _ = room.workers(node, request)
    return -1 if count is None else count


def over_quota(
    job: api.MPIJob,
    snap: topology.Snapshot,
    admitted: Mapping[JobKey, tuple[Placement, api.MPIJob]],
    held_in: Mapping[str, list[tuple[str, quota.Held]]],
    binding: GpuBinding,
) -> str:
    """Why ``job`` would take its namespace past a GPU quota; empty when it would not.

    What the namespace's admitted jobs hold comes from their decisions (the cache's, those
    written but not seen yet, and those of this pass), never from what their pods say.
    """
    ns = job.namespace
    limits = [limit for body in snap.quotas.get(ns) or () for limit in quota.limits_of(body)]
    if not limits:
        return ""
    # Its own stale decision (it was scaled since) is the one this admission replaces.
    held = [h for uid, h in held_in.get(ns) or () if uid != job.metadata.uid]
    for key, (placement, other) in admitted.items():
        if key[0] == ns:
            gpus = sum(len(a.gpus) for a in placement.assignments)
            held.append(quota.Held(gpus, worker_spec=worker_spec_of(other)))
    return quota.check(job, limits, held, binding, claims_as_gpus=snap.claims_as_gpus)


def held_in(
    snap: topology.Snapshot,
    decisions: Mapping[JobKey, topology.Decision],
    namespaces: set[str],
    worker_spec: Callable[[JobKey, str], dict[str, Any] | None],
) -> dict[str, list[tuple[str, quota.Held]]]:
    """Namespace -> (job uid, what its decision holds), for ``namespaces`` (those with waiting
    jobs) that have GPU quotas: one look at every GPU pod and decision. ``worker_spec`` gives
    the worker pod spec of the live job of a key and uid (None: unknown)."""
    wanted = namespaces & set(snap.quotas)
    if not wanted:
        return {}
    pods: dict[str, list[JSON]] = {}  # by controller uid
    for pod in snap.pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") in wanted:
            for ref in meta.get("ownerReferences") or ():
                if ref.get("controller"):
                    pods.setdefault(str(ref.get("uid")), []).append(pod)
    out: dict[str, list[tuple[str, quota.Held]]] = {}
    for key, decision in decisions.items():
        if key[0] not in wanted:
            continue
        gpus = sum(len(a.gpus) for a in decision.assignments)
        spec = worker_spec(key, decision.uid)
        claims = snap.claims.get(key) or ()
        held = quota.held_by(decision.uid, gpus, pods.get(decision.uid) or (), claims, spec)
        out.setdefault(key[0], []).append((decision.uid, held))
    return out
