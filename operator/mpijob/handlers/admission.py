"""Our own all-or-nothing admission of topology-placed jobs: the passes and their I/O.

Jobs that opt into topology-aware placement wait here until the whole job fits. A pass (at most
one at a time, under a lock, so two jobs never take the same GPU) first rebuilds the line from
the live jobs (a deleted, suspended or finished job leaves it), orders every waiting job
fairly, checks each against its namespace's GPU quotas (:mod:`mpijob.admission.quota`: a job
they have no room for waits, naming the quota, and blocks no one), places each with the
placement engine against the GPUs that decisions and pods hold
(see :func:`mpijob.admission.topology.holdings`; decisions this process wrote that the watch
has not delivered yet included), and then, per job: records an admission as a
PlacementDecision (written before any pod exists, so a restarted operator still knows it), or
remembers why it waits (naming pods that hold GPUs outside our placement), or that it timed
out. Each decided job is re-queued, and its reconcile turns the outcome
into pods and status.

With a fabric (``--fabric``), jobs are placed over it (:mod:`mpijob.placement.span`), each node
located by its labels, each job at the level its ``mpijob.io/fabric-*-level`` annotation names;
a job placed on several nodes of one NVLink clique gets its ComputeDomain, created before its
decision. Passes run when a job starts waiting, and every few seconds while any job
waits, which is when running jobs release GPUs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from mpijob import api, keys, metrics
from mpijob.admission import queue, quota, topology
from mpijob.api import JSON, JobKey
from mpijob.api.errors import aggregate
from mpijob.api.fabric import fabric_level
from mpijob.desired import compute_domain
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.handlers.kube import ApiError, Kube
from mpijob.handlers.workers import on_wake
from mpijob.placement import fabric_labels
from mpijob.placement.fabric import CLIQUE_LABEL, Fabric, Location
from mpijob.placement.job import NodeState, NoFit, Placement, claim, place_job

log = logging.getLogger(__name__)

PASS_INTERVAL_SECONDS = 2.0
#: Decisions applied between two yields to the event loop.
YIELD_EVERY = 200
NO_ELIGIBLE_NODE = (
    "no opted-in node matches the worker template's nodeSelector and required node affinity"
)


async def store_decision(kube: Kube, obj: dict[str, Any]) -> None:
    """Create a job's PlacementDecision; one left by the same job (it was scaled since, so it
    no longer describes it) is replaced. One left by an earlier job of the same name stays until
    that job's pods are gone: a 409 saying so."""
    try:
        await kube.create(obj)
        return
    except ApiError as e:
        if not e.conflict:
            raise
    meta = obj["metadata"]
    live = await kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    if live is None:
        raise ApiError(409, "Conflict", "the previous decision is being deleted; retrying")
    if (live.get("spec") or {}).get("job", {}).get("uid") != obj["spec"]["job"]["uid"]:
        raise ApiError(
            409,
            "AlreadyExists",
            f"PlacementDecision {meta['name']} of an earlier MPIJob of this name holds its GPUs "
            "until that job's pods are gone",
        )
    version = (live.get("metadata") or {}).get("resourceVersion")
    await kube.replace({**obj, "metadata": {**meta, "resourceVersion": version}})


def _node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name"))


def _worker_spec_of(job: api.MPIJob) -> dict[str, Any] | None:
    worker = job.spec.worker
    return dict(worker.template.get("spec") or {}) if worker is not None else None


class _Eligible:
    """The nodes each job's worker template admits, computed once per distinct selection (its
    ``nodeSelector`` and node affinity) and narrowed first through an index of node labels."""

    def __init__(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        self.nodes = {_node_name(n): n for n in nodes}
        self.by_label: dict[tuple[str, str], set[str]] = {}
        for name, n in self.nodes.items():
            for item in ((n.get("metadata") or {}).get("labels") or {}).items():
                self.by_label.setdefault(item, set()).add(name)
        self.seen: dict[str, frozenset[str]] = {}

    def of(self, job: api.MPIJob) -> frozenset[str]:
        worker = job.spec.worker
        spec = ((worker.template if worker is not None else {}).get("spec")) or {}
        selection = {k: spec.get(k) for k in ("nodeSelector", "affinity")}
        key = json.dumps(selection, sort_keys=True, default=str)
        found = self.seen.get(key)
        if found is None:
            names: set[str] | None = None
            for key_, value in (spec.get("nodeSelector") or {}).items():
                matching = self.by_label.get((str(key_), str(value)), set())
                names = set(matching) if names is None else names & matching
            candidates = self.nodes.keys() if names is None else names
            found = frozenset(n for n in candidates if topology.admits(spec, self.nodes[n]))
            self.seen[key] = found
        return found


@dataclass(frozen=True)
class Grant:
    uid: str
    placement: Placement
    at: float
    """``time.monotonic()`` when the decision was written."""

    def expired(self) -> bool:
        return time.monotonic() - self.at > GRANT_SECONDS


#: How long a written decision counts without being seen in the cache; past it (an annotation
#: removed by hand, a watch that never delivered) the job is placed anew.
GRANT_SECONDS = 60.0


@dataclass
class Admission:
    """Waiting jobs and the latest decision about each; one per operator process."""

    write_decision: Callable[[dict[str, Any]], Any]
    """Coroutine function storing a PlacementDecision (create, or replace a stale one of the
    same job); raises :class:`ApiError`."""
    enqueue: Callable[[JobKey], None]
    snapshot: Callable[[], topology.Snapshot]
    """What the caches hold for placement."""
    live: Callable[[JobKey], api.MPIJob | None]
    """The job as the cache holds it now; None once it is deleted (or no longer parses)."""
    decision_of: Callable[[JobKey], dict[str, Any] | None]
    """The PlacementDecision named after the job, as the cache holds it."""
    priority_values: Callable[[], Mapping[str, int]]
    """PriorityClass name -> value, from the watch."""
    inter_node_gbps: float
    binding: GpuBinding = GpuBinding.ANNOTATIONS
    """How placed workers get their GPUs: what the namespaces' GPU quotas see of them."""
    fabric: Fabric | None = None
    """Levels of domains between nodes; None: one inter-node bandwidth (``inter_node_gbps``)."""
    create_object: Callable[[dict[str, Any]], Any] | None = None
    """Coroutine function creating an object (a job's ComputeDomain); raises :class:`ApiError`."""
    get_object: Callable[[str, str, str, str], Any] | None = None
    """Coroutine function reading an object (apiVersion, kind, namespace, name), None if absent."""
    waiting: dict[JobKey, api.MPIJob] = field(default_factory=dict)
    last: dict[JobKey, queue.Decision[Placement]] = field(default_factory=dict)
    granted: dict[JobKey, Grant] = field(default_factory=dict)
    """Admissions written on the MPIJob whose watch event has not arrived yet: a pass that ran
    on the cache alone would hand the same GPUs out again."""
    warned: dict[str, str] = field(default_factory=dict)
    """Nodes skipped for a slice/topology conflict, and the warning logged (once each)."""
    domains: dict[str, str] = field(default_factory=dict)
    """Job uid -> its ComputeDomain's name, for the jobs placed in the pass under way."""
    _located: tuple[Any, dict[str, Location]] | None = None
    """The last nodes and HyperNodes located, and where: matching HyperNode members against
    thousands of nodes is worth doing once per change, not once per pass."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def want(self, key: JobKey, job: api.MPIJob) -> None:
        """The job waits for admission; a pass will consider it soon."""
        fresh = key not in self.waiting
        self.waiting[key] = job
        self._gauges()
        if fresh:
            self._wake.set()

    def drop(self, key: JobKey) -> None:
        self.waiting.pop(key, None)
        self.last.pop(key, None)
        self.granted.pop(key, None)
        self._gauges()

    def decision(self, key: JobKey) -> queue.Decision[Placement] | None:
        return self.last.get(key)

    def pending(self, key: JobKey) -> bool:
        """The job's admission is written but its watch event has not arrived yet."""
        grant = self.granted.get(key)
        if grant is not None and grant.expired():
            self.drop(key)
            return False
        return grant is not None

    def wake(self) -> None:
        if self.waiting:
            self._wake.set()

    async def run_forever(self) -> None:
        await on_wake(
            self._wake,
            PASS_INTERVAL_SECONDS,
            lambda: bool(self.waiting),
            self.run_pass,
            "Admission pass",
        )

    async def run_pass(self) -> None:
        async with self._lock:
            started = time.perf_counter()
            if await self._pass():
                metrics.ADMISSION_PASS_SECONDS.observe(time.perf_counter() - started)

    async def _pass(self) -> bool:
        """One pass, under the lock; whether any job waited (a pass over none is not timed)."""
        snap = self.snapshot()
        conflicts = topology.slice_conflicts(snap.nodes, snap.slices)
        self._warn_conflicts(conflicts)
        nodes_raw = [n for n in snap.nodes if _node_name(n) not in conflicts]
        self._refresh()
        if not self.waiting:
            return False
        decisions = {**snap.decisions, **self._unseen_grants()}
        jobs = [j for j in self.waiting.values() if j.metadata.creation_timestamp is not None]
        held_in = self._held_in(snap, decisions)
        values = dict(self.priority_values())
        self.domains = {}
        # The pass computes on a thread, from this snapshot only: the event loop keeps
        # serving other jobs' reconciles, the watches and /healthz meanwhile.
        outcome = await asyncio.to_thread(
            self._decide, snap, nodes_raw, decisions, jobs, values, held_in
        )
        for index, decision in enumerate(outcome, start=1):
            await self._apply(decision)
            if index % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # thousands of waiting jobs: let the loop breathe
        self._gauges()
        return True

    def _decide(
        self,
        snap: topology.Snapshot,
        nodes_raw: Sequence[JSON],
        decisions: Mapping[JobKey, topology.Decision],
        jobs: Sequence[api.MPIJob],
        values: Mapping[str, int],
        held_in: Mapping[str, list[tuple[str, quota.Held]]],
    ) -> list[queue.Decision[Placement]]:
        """One pass's decisions for ``jobs``. Reads only its arguments (and writes only
        ``self.domains``): it runs off the event loop."""
        held = topology.holdings(decisions, snap.pods, snap.allocated, snap.slices)
        nodes = topology.node_states(nodes_raw, held)
        empty = topology.node_states(nodes_raw)
        where = self._locations(nodes_raw, snap.hypernodes) if self.fabric else {}
        by_uid = {}
        waiting = []
        # Each job is placed only on the nodes its worker template admits; jobs whose
        # templates select alike share the work (thousands of jobs, a few templates).
        eligible = _Eligible(nodes_raw)
        allowed: dict[str, frozenset[str]] = {}
        for job in jobs:
            allowed[job.metadata.uid] = eligible.of(job)
            w = queue.waiting_job(job, priority_values=values, nodes=allowed[job.metadata.uid])
            waiting.append(w)
            by_uid[w.uid] = job
        fits_when_empty = self._fits_when_empty(by_uid, allowed, empty, where)

        admitted: dict[JobKey, tuple[Placement, api.MPIJob]] = {}
        """Admitted earlier in this pass: their GPUs count against their quotas."""
        state = {n.name: n for n in nodes}
        """Each node with the GPUs taken so far, this pass's admissions included."""

        def try_place(w: queue.WaitingJob, granted: Sequence[Placement]) -> Any:
            job = by_uid[w.uid]
            if over := self._over_quota(job, snap, admitted, held_in):
                return queue.OverQuota(over)
            if not allowed[w.uid]:
                return NoFit(NO_ELIGIBLE_NODE)
            # Not on the nodes held for the jobs ahead that do not fit yet.
            free = [state[n] for n in sorted(allowed[w.uid] - w.avoid) if n in state]
            started = time.perf_counter()
            result = self._place(job, free, where, record=True)
            metrics.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
            if isinstance(result, NoFit) and (note := held.note(allowed[w.uid], w.namespace)):
                return NoFit(f"{result.reason}; {note}")
            if isinstance(result, Placement):
                admitted[(job.namespace, job.name)] = (result, job)
                used = [state[n] for n in dict.fromkeys(a.node for a in result.assignments)]
                state.update((n.name, n) for n in claim(used, result))
            return result

        return queue.decide(waiting, try_place, now=datetime.now(UTC), fits=fits_when_empty)

    def _fits_when_empty(
        self,
        by_uid: Mapping[str, api.MPIJob],
        allowed: Mapping[str, frozenset[str]],
        empty: Sequence[NodeState],
        where: Mapping[str, Location],
    ) -> Callable[[queue.WaitingJob], bool]:
        """Whether a job would fit with nothing running (else it blocks no one), placed once
        per kind of job: its request, and the nodes it may go to (their topologies, or with a
        fabric the nodes themselves and its fabric annotations)."""
        empty_by_name = {n.name: n for n in empty}
        fits_cache: dict[tuple[Any, ...], bool] = {}
        shapes: dict[frozenset[str], tuple[str, ...]] = {}

        def fits_when_empty(w: queue.WaitingJob) -> bool:
            job = by_uid[w.uid]
            nodes = allowed[w.uid]
            annotations: tuple[tuple[str, str], ...] = ()
            if self.fabric is None:
                # Without a fabric, only the nodes' topologies matter, not which nodes.
                if nodes not in shapes:
                    own = nodes & empty_by_name.keys()
                    shapes[nodes] = tuple(
                        sorted(empty_by_name[n].topology.fingerprint for n in own)
                    )
                shape: Any = shapes[nodes]
            else:
                shape = nodes
                annotations = tuple(sorted((job.metadata.annotations or {}).items()))
            key = (topology.request_of(job), shape, annotations)
            if key not in fits_cache:
                own_empty = [empty_by_name[n] for n in sorted(nodes & empty_by_name.keys())]
                fits_cache[key] = isinstance(self._place(job, own_empty, where), Placement)
            return fits_cache[key]

        return fits_when_empty

    def _locations(
        self, nodes: Sequence[Mapping[str, Any]], hypernodes: Sequence[Mapping[str, Any]]
    ) -> dict[str, Location]:
        assert self.fabric is not None
        if not fabric_labels.hypernode_tiers(self.fabric):
            return topology.locations(nodes, self.fabric)
        key = (
            json.dumps(hypernodes, sort_keys=True),
            tuple(
                (_node_name(n), tuple(((n.get("metadata") or {}).get("labels") or {}).items()))
                for n in nodes
            ),
        )
        if self._located is None or self._located[0] != key:
            self._located = key, topology.locations(nodes, self.fabric, hypernodes)
        return self._located[1]

    def _over_quota(
        self,
        job: api.MPIJob,
        snap: topology.Snapshot,
        admitted: Mapping[JobKey, tuple[Placement, api.MPIJob]],
        held_in: Mapping[str, list[tuple[str, quota.Held]]],
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
                held.append(quota.Held(gpus, worker_spec=_worker_spec_of(other)))
        return quota.check(job, limits, held, self.binding, claims_as_gpus=snap.claims_as_gpus)

    def _held_in(
        self, snap: topology.Snapshot, decisions: Mapping[JobKey, topology.Decision]
    ) -> dict[str, list[tuple[str, quota.Held]]]:
        """Namespace -> (job uid, what its decision holds), for the namespaces with waiting jobs
        and GPU quotas: once per pass, one look at every GPU pod and decision."""
        wanted = {j.namespace for j in self.waiting.values()} & set(snap.quotas)
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
            spec = self._worker_spec(key, decision.uid)
            claims = snap.claims.get(key) or ()
            held = quota.held_by(decision.uid, gpus, pods.get(decision.uid) or (), claims, spec)
            out.setdefault(key[0], []).append((decision.uid, held))
        return out

    def _worker_spec(self, key: JobKey, uid: str) -> dict[str, Any] | None:
        """The worker pod spec of the live job ``key`` of ``uid``; None unknown."""
        job = self.live(key)
        return _worker_spec_of(job) if job is not None and job.metadata.uid == uid else None

    def _place(
        self,
        job: api.MPIJob,
        nodes: Sequence[NodeState],
        where: Mapping[str, Location],
        *,
        record: bool = False,
    ) -> Placement | NoFit:
        """The job placed on ``nodes``: over the fabric when there is one. ``record`` notes the
        ComputeDomain a placement on several nodes of one NVLink clique needs."""
        request = topology.request_of(job)
        if self.fabric is None:
            return place_job(request, nodes, inter_node_gbps=self.inter_node_gbps)
        # Here, not at import: the fabric search needs numpy, which an operator without a fabric
        # never loads.
        from mpijob.placement.span import place_on_fabric

        level, errors = fabric_level(job.metadata.annotations or {}, self.fabric.level_names)
        if errors:
            return NoFit(aggregate(errors))
        required = level.level if level is not None and level.required else None
        preferred = level.level if level is not None and not level.required else None
        result = place_on_fabric(
            request, nodes, self.fabric, where, required=required, preferred=preferred
        )
        if isinstance(result, NoFit):
            return result
        placement = replace(result.placement, summary=result.summary)
        if record:
            self.domains.pop(job.metadata.uid, None)
            if len(placement.nodes) > 1 and self._clique_level() == result.level:
                self.domains[job.metadata.uid] = compute_domain.domain_name(job.name)
        return placement

    def _clique_level(self) -> str | None:
        """The fabric level of NVLink cliques (labelled by GFD), if it has one."""
        levels = self.fabric.levels if self.fabric else ()
        return next((lv.name for lv in levels if lv.label == CLIQUE_LABEL), None)

    async def _ensure_domain(self, job: api.MPIJob) -> str:
        """Create the job's ComputeDomain (or find its own); its name. Raises ApiError."""
        if self.create_object is None:
            raise ApiError(422, "Invalid", "this operator cannot create ComputeDomains")
        body = compute_domain.compute_domain(job.name, job.namespace, job.metadata.uid)
        name = body["metadata"]["name"]
        try:
            await self.create_object(body)
            return str(name)
        except ApiError as e:
            if e.status == 404:
                raise ApiError(
                    422,
                    "NotServed",
                    f"{keys.COMPUTE_DOMAIN_API_VERSION} {keys.COMPUTE_DOMAIN_KIND} is not "
                    "served: the job spans nodes of one NVLink clique and needs NVIDIA's DRA "
                    "driver (ComputeDomains) installed",
                ) from e
            if not e.conflict:
                raise
        live = None
        if self.get_object is not None:
            live = await self.get_object(
                keys.COMPUTE_DOMAIN_API_VERSION, keys.COMPUTE_DOMAIN_KIND, job.namespace, name
            )
        if live is None or not compute_domain.owned_by(live, job.metadata.uid):
            raise ApiError(
                409,
                "AlreadyExists",
                f"ComputeDomain {name} exists and belongs to something else than this job",
            )
        return str(name)

    def _current(self, key: JobKey, uid: str) -> api.MPIJob | None:
        """The job as it is now, if it is still the same job and still without a decision in
        the cache; None once it was deleted (or recreated), suspended, finished or admitted."""
        job = self.live(key)
        if (
            job is None
            or job.metadata.uid != uid
            or job.spec.suspended
            or job.status.finished
            or topology.load_decision(job, self.decision_of(key)) is not None
        ):
            return None
        return job

    def _unseen_grants(self) -> dict[JobKey, topology.Decision]:
        """Decisions this process wrote that the cache does not show yet (once it does, they
        are counted from the cache)."""
        out = {}
        for key, grant in list(self.granted.items()):
            if grant.expired() or self._current(key, grant.uid) is None:
                del self.granted[key]
            else:
                p = grant.placement
                out[key] = topology.Decision(grant.uid, p.assignments, p.ring_gbps, p.summary)
        return out

    def _refresh(self) -> None:
        """Rebuild the line from the live jobs, so no ghost heads the queue; the rest are
        considered as they are now."""
        for key, was in list(self.waiting.items()):
            job = self._current(key, was.metadata.uid)
            if job is None:
                self.drop(key)
                self.enqueue(key)  # its reconcile states where it stands now
            else:
                self.waiting[key] = job

    async def _apply(self, decision: queue.Decision[Placement]) -> None:
        key = (decision.job.namespace, decision.job.name)
        previous = self.last.get(key)
        if isinstance(decision, queue.Admit):
            # Written first: a failed write leaves the job waiting, never half admitted.
            live = self.live(key)
            try:
                if live is None:
                    raise ApiError(404, "NotFound", "the job is gone")
                domain = ""
                if live.metadata.uid in self.domains:
                    # Before the decision: the workers it lets the reconcile create claim the
                    # domain's channel.
                    domain = await self._ensure_domain(live)
                await self.write_decision(
                    topology.decision_object(live, decision.placement, compute_domain=domain)
                )
            except ApiError as e:
                if e.not_found:  # deleted meanwhile
                    self.drop(key)
                    return
                if e.status not in (400, 409, 422):
                    raise  # the API is in trouble: the next pass retries
                # This job's own decision is refused (or its predecessor's is still held):
                # tell its owner, and admit the others.
                message = f"the job fits, but its placement could not be recorded: {e.message}"
                decision = queue.Wait(decision.job, message, refused=True)
            else:
                self.granted[key] = Grant(decision.job.uid, decision.placement, time.monotonic())
        self.last[key] = decision
        if isinstance(decision, queue.Admit):
            metrics.PLACEMENT_RING_GBPS.observe(decision.placement.ring_gbps)
            self.waiting.pop(key, None)
            log.info("Admitted MPIJob %s/%s: %s", *key, decision.placement.summary)
            self.enqueue(key)
        elif isinstance(decision, queue.TimedOut):
            self.waiting.pop(key, None)
            metrics.GANG_TIMEOUTS.inc()
            self.enqueue(key)
        elif previous is None or getattr(previous, "message", None) != decision.message:
            self.enqueue(key)  # the waiting message changed: show it in the status

    def _warn_conflicts(self, conflicts: Mapping[str, str]) -> None:
        for node, message in conflicts.items():
            if self.warned.get(node) != message:
                log.warning("%s", message)
        self.warned = dict(conflicts)

    def _gauges(self) -> None:
        metrics.GANG_WAITING.set(len(self.waiting))
        metrics.JOBS_WAITING_GPUS.set(len(self.waiting))
