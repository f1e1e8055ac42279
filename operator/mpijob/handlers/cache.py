"""What the reconciler reads: the indices, the creations not yet seen, our last status write.

The indices are the one cache: every watched kind feeds one index, and every index is one of
Kopf's, whether Kopf's watch fills it or an informer does (the declared extension:
:mod:`mpijob.handlers.watches`, :func:`mpijob.platform.kopf_tuning.indexers_for`). This object
reads them into what
one sync needs (:meth:`Cache.observe`), and keeps the two memories a level-based reconciler
must have, each bounded by what it remembers:

- **expectations**: children created by us whose watch event has not arrived yet, so the next
  sync neither creates them twice nor misses them (client-go's expectations). An expectation
  ends when the child's event arrives, when the index shows it, or after
  :data:`EXPECTATION_SECONDS`, whichever comes first;
- **our last status write**, until the MPIJob's watch event carries it, so that a sync right
  after a write never computes from the stale status.

It also keeps what was made of each job's latest version (:meth:`Cache.check`: the parsed,
defaulted model and its refusals), for the reconciler and our admission's passes alike; a new
version replaces it, a deleted job drops it. And it says what the placement checks weigh
before they tear anything down (:mod:`mpijob.gang.gate`): whether the indices they read are
complete (:meth:`Cache.complete`: no informer lost its watch without listing again since), and
which opted-in nodes this process has seen not Ready, since when (:meth:`Cache.pool_health`).

Built by the composition root; read and fed by the reconciler and the watch handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from mpijob.api import JSON, FieldError, JobKey, MPIJob
from mpijob.desired import names
from mpijob.desired.observed import Observed
from mpijob.gang import quota, topology
from mpijob.platform.clock import SYSTEM, Clock

EXPECTATION_SECONDS = 60.0

#: What the reconciler makes of a job's body: the defaulted job (None when it does not parse)
#: and every reason the operator refuses it.
Checked = tuple[MPIJob | None, list[FieldError]]


class Index(StrEnum):
    """Every index, Kopf's and the informers', by the name it is filled under
    (:mod:`mpijob.handlers.watches`) and read by (this cache): the one list of them."""

    MPIJOBS_BY_KEY = "mpijobs_by_key"
    PODS = "pods"
    DECISIONS_BY_JOB = "decisions_by_job"
    NODES_BY_NAME = "nodes_by_name"
    SERVICES_BY_JOB = "services_by_job"
    CONFIGMAPS_BY_JOB = "configmaps_by_job"
    LAUNCHERS_BY_JOB = "launchers_by_job"
    PODGROUPS_BY_JOB = "podgroups_by_job"
    PRIORITIES_BY_NAME = "priorities_by_name"
    CLAIMS = "claims"
    SLICES_BY_NODE = "slices_by_node"
    GPU_CLASSES_BY_NAME = "gpu_classes_by_name"
    QUOTAS_BY_NAMESPACE = "quotas_by_namespace"


class PodsBy(StrEnum):
    """How the one pod index (:data:`Index.PODS`) files a pod: the first item of each key.

    One index function files every pod under each key it is read by: Kopf calls each index
    function as a handler of its own (arguments, filters, outcome) on every pod event, and pod
    events are most of what the operator hears."""

    JOB = "job"
    """``(JOB, namespace, job name)``: our job's pods (labelled ours), as the reconciler reads
    them."""
    GPUS_ON = "gpus-on"
    """``(GPUS_ON, node)``: pods (anyone's) that ask for whole GPUs, with their GPU requests:
    what placement must not hand out. Not yet bound: node ``""``."""
    REQUESTS_ON = "requests-on"
    """``(REQUESTS_ON, node)``: what each bound, unfinished pod (anyone's) requests of its
    node, as the scheduler sums it: what admission fits a worker beside."""


class ClaimsBy(StrEnum):
    """How the one DRA ResourceClaim index (:data:`Index.CLAIMS`, the dra binding mode) files a
    claim: the first item of each key, as :class:`PodsBy` files pods."""

    JOB = "job"
    """``(JOB, namespace, job name)``: our workers' claims (controlled by the job), with their
    spec, which a re-placement compares, and what was allocated."""
    ALLOCATED_ON = "allocated-on"
    """``(ALLOCATED_ON, node)``: every claim (anyone's) holding NVIDIA GPUs of the node's
    pool, with those devices: what the scheduler gave out."""


#: The indices a placement check reads before it gives a placement back (the job, its
#: decision, its workers, their nodes, their claims): none may lack events then
#: (:meth:`Cache.complete`). The decisions are Kopf's, which says nothing of it.
PLACEMENT_VIEW = (
    Index.MPIJOBS_BY_KEY,
    Index.DECISIONS_BY_JOB,
    Index.PODS,
    Index.NODES_BY_NAME,
    Index.CLAIMS,
)


#: Index -> the kind it holds, for the children looked up by job key.
CHILD_INDICES = {
    Index.SERVICES_BY_JOB: "Service",
    Index.CONFIGMAPS_BY_JOB: "ConfigMap",
    Index.LAUNCHERS_BY_JOB: "Job",
    Index.PODGROUPS_BY_JOB: "PodGroup",
}


@dataclass
class Cache:
    indices: Mapping[str, Any] = field(default_factory=dict)
    """Every index by name: Kopf's live mapping of them, the informers' included (empty until
    the watches fill them)."""
    expected: dict[JobKey, dict[tuple[str, str], tuple[float, JSON]]] = field(default_factory=dict)
    """Per job: (kind, name) -> (when created, the object the API returned)."""
    written: dict[JobKey, tuple[str, JSON]] = field(default_factory=dict)
    """Per job: (the resourceVersion our last status write replaced, the body it returned)."""
    server_minor: int | None = None
    """The API server's Kubernetes minor version (read at startup): whether its quotas charge
    claims to ``requests.nvidia.com/gpu`` depends on it."""
    hypernodes: list[JSON] = field(default_factory=list)
    """Volcano's HyperNodes (name, tier and members), as last listed (see
    :func:`mpijob.handlers.watches.follow_hypernodes`)."""
    secrets: dict[JobKey, tuple[float, JSON | None]] = field(default_factory=dict)
    """Per job: when its SSH Secret was last read or written (monotonic seconds), and what it
    was (key names only; None when a read found none). Secrets are not watched: a cluster-wide
    list and watch would stream every Secret of the cluster to the operator. The reconciler
    reads the job's own by name before it creates anything that mounts it
    (:func:`needs_secret`), so a deleted one is made again before it is needed."""
    checked: dict[JobKey, tuple[str, Checked]] = field(default_factory=dict)
    """Per job: (resourceVersion, what the operator made of that version: the defaulted job
    and its refusals); see :meth:`check`."""
    not_ready: dict[str, datetime] = field(default_factory=dict)
    """Opted-in node -> when this process first saw it not Ready, while it is not (see
    :meth:`saw_node`)."""
    disrupted: bool = False
    """Whether the pool was disrupted (most of it not Ready) at the latest node event."""
    recovered: datetime | None = None
    """When the pool last stopped being disrupted, as this process saw."""
    clock: Clock = SYSTEM
    """What the reconciler's decisions, the expectations, the Secrets' ages and
    :attr:`not_ready` read the time from."""

    # --- the MPIJob --------------------------------------------------------------------------

    def job_body(self, key: JobKey) -> JSON | None:
        """The newest body of the MPIJob: the cache's, unless our own write is newer."""
        body = next(iter(self._all(Index.MPIJOBS_BY_KEY, key)), None)
        if body is None:
            return None
        written = self.written.get(key)
        if written is not None:
            stale_version, fresh = written
            if (body.get("metadata") or {}).get("resourceVersion") == stale_version:
                return fresh
            del self.written[key]
        return body

    def has_job(self, key: JobKey) -> bool:
        """Whether the MPIJob is filed: it was listed or seen created, and not seen deleted."""
        return bool(self._all(Index.MPIJOBS_BY_KEY, key))

    def wrote_status(self, key: JobKey, replaced_version: str, fresh: JSON) -> None:
        # A write that returns after the job's deletion was seen (and forgotten) must not
        # bring it back: nothing would drop it again.
        if self.has_job(key):
            self.written[key] = (replaced_version, fresh)

    def is_own_status_write(self, key: JobKey, version: str | None) -> bool:
        """Whether ``version`` of the MPIJob is the one our last status write produced."""
        written = self.written.get(key)
        return (
            bool(version)
            and written is not None
            and ((written[1].get("metadata") or {}).get("resourceVersion") == version)
        )

    # --- the job's children ------------------------------------------------------------------

    def observe(self, key: JobKey, job: MPIJob) -> Observed:
        """Every child ``job`` controls, as the indices and our unseen creations show them."""
        uid = job.metadata.uid
        ours = {
            kind: next(
                (c for c in self._all(index, key) if names.is_controlled_by(c, uid)),
                None,
            )
            for index, kind in CHILD_INDICES.items()
        }
        secret = self.secrets.get(key, (0.0, None))[1]
        ours["Secret"] = secret if secret and names.is_controlled_by(secret, uid) else None
        pods = self.pods(key)
        claims = {
            _name(c): c
            for c in self._all(Index.CLAIMS, (ClaimsBy.JOB, *key))
            if names.is_controlled_by(c, uid)
        }
        present = {("Pod", str(p["metadata"]["name"])) for p in pods}
        present |= {("ResourceClaim", name) for name in claims}
        present |= {(kind, _name(obj)) for kind, obj in ours.items() if obj is not None}
        for (kind, name), obj in self._pending(key, present).items():
            if kind == "Pod":
                pods.append(obj)
            elif kind == "ResourceClaim":
                claims[name] = obj
            elif ours.get(kind) is None and names.is_controlled_by(obj, uid):
                ours[kind] = obj
        return Observed(
            launcher_job=ours["Job"],
            pods=pods,
            pod_group=ours["PodGroup"],
            service=ours["Service"],
            config_map=ours["ConfigMap"],
            secret=ours["Secret"],
            claims=claims,
        )

    def knows_secret(self, key: JobKey) -> bool:
        """Whether the job's SSH Secret was read or written since this process started."""
        return key in self.secrets

    def secret_age(self, key: JobKey) -> float:
        """Seconds since the job's SSH Secret was last read or written (infinite: never)."""
        seen = self.secrets.get(key)
        return float("inf") if seen is None else self.clock.monotonic() - seen[0]

    def saw_secret(self, key: JobKey, secret: JSON | None) -> None:
        """The job's Secret (SSH or launch keys) as the API server just returned it (None: it
        has none); only what the sync checks is kept, never the keys themselves."""
        if secret is None:
            self.secrets[key] = (self.clock.monotonic(), None)
            return
        meta = secret.get("metadata") or {}
        kept = ("name", "namespace", "uid", "resourceVersion", "ownerReferences")
        summary = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {k: meta[k] for k in kept if k in meta},
            "type": secret.get("type"),
            "data": dict.fromkeys(secret.get("data") or {}, ""),
        }
        self.secrets[key] = (self.clock.monotonic(), summary)

    def pods(self, key: JobKey) -> list[JSON]:
        """Every pod labelled with the job's name (whatever job instance controls it)."""
        return self._all(Index.PODS, (PodsBy.JOB, *key))

    def launcher_job(self, key: JobKey) -> JSON | None:
        return next(iter(self._all(Index.LAUNCHERS_BY_JOB, key)), None)

    # --- expectations ------------------------------------------------------------------------

    def expect(self, key: JobKey, obj: JSON) -> None:
        """Remember a child we created (or found) until its watch event arrives."""
        name = (obj["kind"], _name(obj))
        self.expected.setdefault(key, {})[name] = (self.clock.monotonic(), obj)

    def seen(self, key: JobKey, kind: str, name: str) -> None:
        """A watch event for the child arrived: the index is the truth about it from now on."""
        pending = self.expected.get(key)
        if pending is not None:
            pending.pop((kind, name), None)
            if not pending:
                del self.expected[key]

    def forget(self, key: JobKey) -> None:
        """Drop every memory of a deleted job."""
        self.expected.pop(key, None)
        self.written.pop(key, None)
        self.checked.pop(key, None)
        self.secrets.pop(key, None)

    def _pending(self, key: JobKey, present: set[tuple[str, str]]) -> dict[tuple[str, str], JSON]:
        pending = self.expected.get(key)
        if not pending:
            return {}
        now = self.clock.monotonic()
        for child, (at, _) in list(pending.items()):
            if child in present or now - at > EXPECTATION_SECONDS:
                del pending[child]
        if not pending:
            del self.expected[key]
        return {child: obj for child, (_, obj) in pending.items()}

    # --- completeness and the nodes' health ------------------------------------------------

    def complete(self, indices: Iterable[str] = PLACEMENT_VIEW) -> bool:
        """Whether none of ``indices`` may lack events: an informer's index says so
        (:attr:`mpijob.platform.kopf_tuning.InformedIndex.complete`); Kopf's say nothing and
        count as complete, as does an index not kept in this mode (claims, without the dra
        binding)."""
        return all(getattr(self.indices.get(name), "complete", True) for name in indices)

    def saw_node(self, name: str, ready: bool | None) -> None:
        """An opted-in node's readiness as its event shows it (None: it left the pool): the
        first time this process sees it not Ready is kept until it is Ready again; the pool's
        recovery from a disruption is noted when it happens."""
        if ready is False:
            self.not_ready.setdefault(name, self.clock.now())
        else:
            self.not_ready.pop(name, None)
        pool = len(self.indices.get(Index.NODES_BY_NAME, {}))
        disrupted = topology.disrupted(len(self.not_ready), pool)
        if self.disrupted and not disrupted:
            self.recovered = self.clock.now()
        self.disrupted = disrupted

    def pool_health(self) -> topology.PoolHealth:
        """The opted-in nodes seen not Ready, since when, whether they are most of the pool
        (:func:`mpijob.gang.topology.disrupted`), and when it last stopped being so."""
        not_ready = dict(self.not_ready)  # as it is now, whatever events come next
        return topology.PoolHealth(not_ready, self.disrupted, self.recovered)

    # --- cluster-wide views ------------------------------------------------------------------

    def nodes(self, wanted: Iterable[str] | None = None) -> dict[str, JSON]:
        """Opted-in nodes by name: all of them, or only ``wanted``."""
        index = self.indices.get(Index.NODES_BY_NAME, {})
        names_ = index.keys() if wanted is None else [n for n in wanted if n in index]
        return {name: dict(v) for name in names_ for v in index[name]}

    def priority_values(self) -> dict[str, int]:
        """PriorityClass name -> value, from the watch."""
        index = self.indices.get(Index.PRIORITIES_BY_NAME, {})
        return {name: int(v) for name in index for v in index[name]}

    def job(self, key: JobKey, check: Callable[[JSON], Checked]) -> MPIJob | None:
        """The job as watched now, defaulted (:meth:`check`); None when it is gone or does not
        parse."""
        body = self.job_body(key)
        if body is None:
            self.checked.pop(key, None)
            return None
        return self.check(key, body, check)[0]

    def check(self, key: JobKey, body: JSON, check: Callable[[JSON], Checked]) -> Checked:
        """``check(body)``, once per resourceVersion of the job, for the reconciler and the
        admission pass alike (both give :func:`mpijob.handlers.reconcile.checked` with the
        operator's settings): a job is synced after every wave of its pods' events, and the
        admission pass asks for every waiting job every few seconds; parsing, defaulting and
        validating the unchanged job again was a sixth of a sync's samples in a profile of
        ``make bench``. The result is shared, never changed: the plan and the status copy what
        they change."""
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        memo = self.checked.get(key)
        if memo is not None and version and memo[0] == version:
            return memo[1]
        result = check(body)
        if version:
            self.checked[key] = (version, result)
        return result

    def decision(self, key: JobKey) -> JSON | None:
        """The PlacementDecision named after the job, whichever job it was written for."""
        return next(iter(self._all(Index.DECISIONS_BY_JOB, key)), None)

    def jobs_placed_on(self, node: str) -> list[JobKey]:
        """The jobs whose PlacementDecision names ``node``."""
        out = []
        for key, store in self.indices.get(Index.DECISIONS_BY_JOB, {}).items():
            for body in store:
                workers = (body.get("spec") or {}).get("workers") or []
                if any(isinstance(w, Mapping) and w.get("node") == node for w in workers):
                    out.append(key)
        return out

    def placement_snapshot(self) -> topology.Snapshot:
        """What placement reads: opted-in nodes, pods that request GPUs, every decision (by job
        key), every claim's allocated NVIDIA GPUs and the driver's devices, by node; and what
        the quota check reads: GPU quotas by namespace, our claims by job, the class mapping."""
        nodes = self.nodes()
        pods: list[JSON] = []
        requested: dict[str, dict[str, Decimal]] = {}
        for (by, *where), store in self.indices.get(Index.PODS, {}).items():
            if by == PodsBy.GPUS_ON:
                pods += (dict(p) for p in store)
            elif by == PodsBy.REQUESTS_ON and where[0] in nodes:
                # Placement weighs only the opted-in nodes.
                total = requested.setdefault(where[0], {})
                for pod in store:
                    for name, amount in pod:
                        total[name] = total.get(name, Decimal(0)) + amount
        decisions = {}
        for key, store in self.indices.get(Index.DECISIONS_BY_JOB, {}).items():
            for body in store:
                if (decision := topology.parse_decision(body)) is not None:
                    decisions[key] = decision
        allocated: dict[str, list[str]] = {}
        claims: dict[JobKey, list[JSON]] = {}
        for (by, *where), store in self.indices.get(Index.CLAIMS, {}).items():
            if by == ClaimsBy.ALLOCATED_ON:
                allocated[where[0]] = [str(d) for claim in store for d in claim["devices"]]
            elif by == ClaimsBy.JOB:
                claims[(where[0], where[1])] = [dict(c) for c in store]
        slices: dict[str, dict[str, str]] = {}
        tainted: dict[str, set[str]] = {}
        for node, store in self.indices.get(Index.SLICES_BY_NODE, {}).items():
            for published in store:
                slices.setdefault(node, {}).update(published["devices"])
                tainted.setdefault(node, set()).update(published["tainted"])
        quotas = {
            namespace: [dict(q) for q in store]
            for namespace, store in self.indices.get(Index.QUOTAS_BY_NAMESPACE, {}).items()
        }
        classes = self.indices.get(Index.GPU_CLASSES_BY_NAME, {})
        mapped = next((str(v) for store in classes.values() for v in store), None)
        return topology.Snapshot(
            list(nodes.values()),
            pods,
            decisions,
            allocated,
            slices,
            quotas,
            claims,
            claims_as_gpus=quota.charges_claims_as_gpus(self.server_minor, mapped),
            hypernodes=self.hypernodes,
            requested=requested,
            tainted={node: uuids for node, uuids in tainted.items() if uuids},
        )

    def _all(self, index: str, key: tuple[str, ...]) -> list[JSON]:
        return [dict(v) for v in self.indices.get(index, {}).get(key) or ()]


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
