"""Our own all-or-nothing admission of topology-placed jobs: the passes and their I/O.

Jobs that opt into topology-aware placement wait here until the whole job fits. A pass (at most
one at a time, under a lock, so two jobs never take the same GPU) first rebuilds the line from
the live jobs (a deleted, suspended or finished job leaves it), orders every waiting job
fairly, checks each against its namespace's GPU quotas (:mod:`mpijob.gang.quota`: a job
they have no room for waits, naming the quota, and blocks no one), places each with the
placement engine against the GPUs that decisions and pods hold
(see :func:`mpijob.gang.topology.holdings`; decisions this process wrote that the watch
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob import api, keys, metrics
from mpijob.api import JSON, JobKey
from mpijob.desired import compute_domain
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import decide, queue, quota, topology
from mpijob.objects import about
from mpijob.placement import fabric_labels
from mpijob.placement.fabric import Fabric, Location
from mpijob.placement.job import Placement
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import ApiError, NameTaken, create_or_adopt
from mpijob.platform.kube_api import KubeApi
from mpijob.platform.workers import on_wake

log = logging.getLogger(__name__)

PASS_INTERVAL_SECONDS = 2.0
#: Decisions applied between two yields to the event loop.
YIELD_EVERY = 200


class NotRecorded(Exception):
    """A job's placement cannot be recorded now (its decision, or the ComputeDomain it needs):
    the message says why, for the job's owner. The job waits; the others are admitted."""


async def store_decision(kube: KubeApi, obj: dict[str, Any]) -> None:
    """Create a job's PlacementDecision; one left by the same job (it was scaled since, so it
    no longer describes it) is replaced. One left by an earlier job of the same name stays until
    that job's pods are gone: :class:`NotRecorded` saying so."""
    meta = obj["metadata"]
    uid = obj["spec"]["job"]["uid"]
    try:
        made = await create_or_adopt(
            kube.create,
            obj,
            read=kube.get,
            ours=lambda live: ((live.get("spec") or {}).get("job") or {}).get("uid") == uid,
        )
    except NameTaken:
        raise NotRecorded(
            f"PlacementDecision {meta['name']} of an earlier MPIJob of this name holds its GPUs "
            "until that job's pods are gone"
        ) from None
    except ApiError as e:
        if e.conflict:  # its holder went between the create and the read
            raise NotRecorded("the previous decision is being deleted; retrying") from None
        raise
    if made.adopted:  # the job's own, from before it was scaled: what it says now replaces it
        version = (made.obj.get("metadata") or {}).get("resourceVersion")
        await kube.replace({**obj, "metadata": {**meta, "resourceVersion": version}})


@dataclass(frozen=True)
class Grant:
    uid: str
    placement: Placement
    at: float
    """When the decision was written, in the admission's clock's monotonic seconds."""

    def expired(self, now: float) -> bool:
        """Whether it has gone unseen for longer than :data:`GRANT_SECONDS` at ``now``."""
        return now - self.at > GRANT_SECONDS


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
    create_object: Callable[[dict[str, Any]], Awaitable[Any]]
    """Coroutine function creating an object (a job's ComputeDomain); raises :class:`ApiError`."""
    get_object: Callable[[str, str, str | None, str], Awaitable[Any]]
    """Coroutine function reading an object (apiVersion, kind, namespace, name), None if absent."""
    inter_node_gbps: float
    binding: GpuBinding = GpuBinding.ANNOTATIONS
    """How placed workers get their GPUs: what the namespaces' GPU quotas see of them."""
    fabric: Fabric | None = None
    """Levels of domains between nodes; None: one inter-node bandwidth (``inter_node_gbps``)."""
    clock: Clock = SYSTEM
    """What the grants' expiry and the jobs' schedule timeouts read the time from."""
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
        if grant is not None and grant.expired(self.clock.monotonic()):
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
        nodes_raw = [n for n in snap.nodes if decide.node_name(n) not in conflicts]
        self._refresh()
        if not self.waiting:
            return False
        decisions = {**snap.decisions, **self._unseen_grants()}
        jobs = [j for j in self.waiting.values() if j.metadata.creation_timestamp is not None]
        namespaces = {j.namespace for j in self.waiting.values()}
        held_in = decide.held_in(snap, decisions, namespaces, self._worker_spec)
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
        """One pass's decisions for ``jobs`` (:func:`mpijob.gang.decide.decide`). Reads only
        its arguments (and writes only ``self.domains`` and the located nodes' memo): it runs
        off the event loop."""
        where = self._locations(nodes_raw, snap.hypernodes) if self.fabric else {}
        out = decide.decide(
            decide.Placer(self.inter_node_gbps, self.fabric),
            snap,
            nodes_raw,
            decisions,
            jobs,
            priority_values=values,
            held_in=held_in,
            where=where,
            binding=self.binding,
            now=self.clock.now(),
            placement_seconds=metrics.PLACEMENT_SECONDS.observe,
        )
        self.domains = out.domains
        return out.decisions

    def _locations(
        self, nodes: Sequence[Mapping[str, Any]], hypernodes: Sequence[Mapping[str, Any]]
    ) -> dict[str, Location]:
        assert self.fabric is not None
        if not fabric_labels.hypernode_tiers(self.fabric):
            return topology.locations(nodes, self.fabric)
        key = (
            json.dumps(hypernodes, sort_keys=True),
            tuple(
                (
                    decide.node_name(n),
                    tuple(((n.get("metadata") or {}).get("labels") or {}).items()),
                )
                for n in nodes
            ),
        )
        if self._located is None or self._located[0] != key:
            self._located = key, topology.locations(nodes, self.fabric, hypernodes)
        return self._located[1]

    def _worker_spec(self, key: JobKey, uid: str) -> dict[str, Any] | None:
        """The worker pod spec of the live job ``key`` of ``uid``; None unknown."""
        job = self.live(key)
        return decide.worker_spec_of(job) if job is not None and job.metadata.uid == uid else None

    async def _ensure_domain(self, job: api.MPIJob) -> str:
        """Create the job's ComputeDomain (or find its own); its name. Raises
        :class:`NotRecorded` when it cannot be had, ApiError when the API fails."""
        body = compute_domain.compute_domain(job.name, job.namespace, job.metadata.uid)
        name = body["metadata"]["name"]
        taken = NotRecorded(
            f"ComputeDomain {name} exists and belongs to something else than this job"
        )
        try:
            await create_or_adopt(
                self.create_object,
                body,
                read=self.get_object,
                ours=lambda live: compute_domain.owned_by(live, job.metadata.uid),
            )
        except NameTaken:
            raise taken from None
        except ApiError as e:
            if e.status == 404:
                raise NotRecorded(
                    f"{keys.COMPUTE_DOMAIN_API_VERSION} {keys.COMPUTE_DOMAIN_KIND} is not "
                    "served: the job spans nodes of one NVLink clique and needs NVIDIA's DRA "
                    "driver (ComputeDomains) installed"
                ) from e
            if e.conflict:  # its holder went between the create and the read: the next pass
                raise taken from None
            raise
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
        now = self.clock.monotonic()
        for key, grant in list(self.granted.items()):
            if grant.expired(now) or self._current(key, grant.uid) is None:
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
            if live is None:  # deleted meanwhile
                self.drop(key)
                return
            try:
                domain = ""
                if live.metadata.uid in self.domains:
                    # Before the decision: the workers it lets the reconcile create claim the
                    # domain's channel.
                    domain = await self._ensure_domain(live)
                await self.write_decision(
                    topology.decision_object(live, decision.placement, compute_domain=domain)
                )
            except (NotRecorded, ApiError) as e:
                if isinstance(e, ApiError) and e.not_found:  # deleted meanwhile
                    self.drop(key)
                    return
                if isinstance(e, ApiError) and e.status not in (400, 409, 422):
                    raise  # the API is in trouble: the next pass retries
                # This job's own decision is refused (or its predecessor's is still held):
                # tell its owner, and admit the others.
                why = e.message if isinstance(e, ApiError) else str(e)
                message = f"the job fits, but its placement could not be recorded: {why}"
                decision = queue.Wait(decision.job, message, refused=True)
            else:
                self.granted[key] = Grant(
                    decision.job.uid, decision.placement, self.clock.monotonic()
                )
        self.last[key] = decision
        if isinstance(decision, queue.Admit):
            metrics.PLACEMENT_RING_GBPS.observe(decision.placement.ring_gbps)
            self.waiting.pop(key, None)
            log.info(
                "Admitted MPIJob %s/%s: %s",
                *key,
                decision.placement.summary,
                extra=about(keys.KIND, *key),
            )
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
