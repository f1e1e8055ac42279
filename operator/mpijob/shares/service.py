"""GPU shares: Kopf's mutating and validating webhooks that gate share pods at creation, and the
leader's placement of gated pods over one ledger.

Off unless the operator runs with ``--fractional-gpus``. Then :func:`register` adds to the
registry: a watch of ``core_mem`` nodes (what the ledger can place on), a watch of pods holding
a share (``mpijob.io/gpu-share``: confirms fresh holds, releases finished or deleted pods, and
on the first listing rebuilds the ledger after a restart) or waiting for one
(``mpijob.io/gpu-share-waiting``), and the two webhooks for pod ``CREATE``. The webhook server
is Kopf's, with a serving certificate of its own (:func:`serving_certificate`), and the webhook
configurations are applied by the operator (:func:`apply_configurations`) so that their failure
policy, timeout, match conditions and namespace selector are ours
(:func:`mpijob.shares.pod_edits.webhook_configurations`).

One :class:`ShareService` per process, its ledger behind one :class:`asyncio.Lock`:
concurrent placements never overcommit a GPU. At start, before the webhooks serve, the ledger is
rebuilt from a listing of ``core_mem`` nodes and of every pod (:meth:`ShareService.
rebuild`); the watches keep it current from then on.

The webhooks only validate and gate: every valid share pod is admitted behind the scheduling
gate ``mpijob.io/gpu-share`` (Pending, ``SchedulingGated``), holding nothing, so a request that
never becomes a pod (one the API server refuses after the webhook ran, an AdmissionReview sent
by hand) leaves no trace. One background task of the leader (:meth:`ShareService.
run_placement`) places gated pods once the watch sees them, and again whenever a share is freed
or a node changes: one patch writes the placement and removes the gate; a pod that does not fit
gets the reason in ``mpijob.io/gpu-share-waiting``. A placement holds its share pending until
the watch sees the record (it lapses after :data:`PENDING_SECONDS` otherwise). A gated pod
holds nothing, so a restart or a change of leader loses nothing: the watch's listing brings the
gated pods back.

Eligible nodes are those the pod's node selector and required node affinity admit and whose
``NoSchedule``/``NoExecute`` taints it tolerates, and the share goes only to a node with room
for the pod's other requests (:class:`~mpijob.shares.node_room.NodeRoom`: its allocatable
against every bound pod's requests and every share pinned there, which is why the pod watch
also counts bound pods without a share). The first worker of an MPIJob to be placed reserves
shares for all the job's workers at once (all or nothing, :meth:`Ledger.place_all`); the
reservations of workers whose pods never come lapse like any pending hold.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import kopf

from mpijob import keys, metrics
from mpijob.api.errors import aggregate
from mpijob.desired import events, names
from mpijob.desired.events import Event
from mpijob.objects import about
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import ApiError
from mpijob.platform.kube_api import KubeApi
from mpijob.platform.workers import on_wake
from mpijob.pods.predicates import pod_requests, terminal
from mpijob.shares.ledger import (
    Ledger,
    believed,
    eligible_nodes,
    node_facts,
    read_node,
)
from mpijob.shares.node_room import NodeRoom
from mpijob.shares.pod_edits import (
    ADMITTED,
    json_patch,
    placement_edits,
    pod_edits,
    waiting_patch,
)
from mpijob.shares.request import Placed, Share, read_request

log = logging.getLogger(__name__)

#: Seconds a fresh hold waits for its pod to be seen before it lapses.
PENDING_SECONDS: Final = 60.0

_GPU_GAUGES: Final = (
    metrics.GPU_SHARE_MEMORY,
    metrics.GPU_SHARE_PERCENTAGE,
    metrics.GPU_SHARE_CLIENTS,
)

#: ``(namespace, name, uid)`` of an MPIJob to its number of workers (None: no such job, or
#: the job of that name has another uid).
WorkersOf = Callable[[str, str, str], Awaitable[int | None]]
#: Posts an Event about a pod.
PostEvent = Callable[[dict[str, Any], Event], None]
#: ``(namespace, name, JSON patch)``: send the patch placing a waiting pod.
PatchPod = Callable[[str, str, list[dict[str, Any]]], Awaitable[None]]


async def one_by_one(namespace: str, name: str, uid: str) -> int | None:
    """No reader of MPIJobs: each worker is placed on its own."""
    return None


def no_events(pod: dict[str, Any], event: Event) -> None:
    """No recorder: no Events."""


@dataclass(frozen=True)
class Worker:
    """A worker pod of an MPIJob: which job (by uid), its index, and the ledger claim of each of
    the job's workers."""

    namespace: str
    job: str
    uid: str
    index: int

    def claim(self, index: int) -> str:
        return f"mpijob/{self.namespace}/{self.job}/{self.uid}/worker-{index}"


def worker_of(body: dict[str, Any]) -> Worker | None:
    """The MPIJob worker ``body`` says it is: the worker of the job its controller reference
    names, by :func:`mpijob.desired.names.worker_index` (its name, labels and owner all agree).

    The reference's uid is the pod's word only: :meth:`ShareService._workers` asks the job of
    that name whether it has that uid before the pod reserves shares for its job's workers (a
    pod of another uid is placed on its own)."""
    namespace = str((body.get("metadata") or {}).get("namespace") or "")
    job = names.controlling_job(body)
    uid = str((names.controller_of(body) or {}).get("uid") or "")
    if job is None:
        return None
    index = names.worker_index(body, namespace, job, uid)
    return None if index is None else Worker(namespace, job, uid, index)


class ShareService:
    """The ledger and its lock, and the decisions the share webhook and the watches ask of it."""

    def __init__(
        self,
        *,
        workers_of: WorkersOf = one_by_one,
        events: PostEvent = no_events,
        runtime_class: str = "",
        clock: Clock = SYSTEM,
    ) -> None:
        self.ledger = Ledger()
        self.runtime_class = runtime_class
        """Given to a share pod that names no RuntimeClass (``--gpu-share-runtime-class``)."""
        self.room = NodeRoom()
        """Each node's cpu, memory and pods left: a share pins its pod only where it fits."""
        self.lock = asyncio.Lock()
        self.workers_of = workers_of
        """How many workers an MPIJob has (:func:`workers_reader`); :func:`one_by_one`: its
        workers are placed one by one."""
        self._clock = clock
        """What the pending holds lapse by (:data:`PENDING_SECONDS`)."""
        self.waiting: dict[str, dict[str, Any]] = {}
        """Pods admitted behind the gate, by ``namespace/name``: the last body seen of each."""
        self.events = events
        """Posts an Event about a pod (the operator's recorder)."""
        self.wake = asyncio.Event()
        """Set when a waiting pod may now fit: a pod came to wait, a share or a node was freed."""
        self._nodes: dict[str, dict[str, Any]] = {}
        self._exported: dict[str, set[int]] = {}
        self._touched: list[str] = []

    # --- watches -------------------------------------------------------------------------

    async def on_node(self, body: dict[str, Any], event_type: str | None) -> None:
        name = (body.get("metadata") or {}).get("name") or ""
        read = None if event_type == "DELETED" else read_node(body)
        async with self.lock:
            if read is None:
                self.ledger.remove_node(name)
                self.room.remove_node(name)
                self._nodes.pop(name, None)
            else:
                gpus, binpack = read
                self.ledger.set_node(name, gpus, binpack=binpack)
                self.room.set_node(name, (body.get("status") or {}).get("allocatable"))
                self._nodes[name] = node_facts(body)
            self.export([name])
        if self.waiting:
            self.wake.set()

    async def on_pod(self, body: dict[str, Any], event_type: str | None) -> None:
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        placed = believed(body)
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        gone = event_type == "DELETED" or terminal(body)
        if placed is None:
            if keys.GPU_SHARE_WAITING in annotations and not gone and _gated(body):
                self.waiting[key] = body
                metrics.GPU_SHARE_WAITING.set(len(self.waiting))
                self.wake.set()
                return
            if key in self.waiting and not gone and keys.GPU_SHARE_WAITING in annotations:
                log.warning(
                    "The GPU-share gate of pod %s was removed by hand: no share",
                    key,
                    extra=_about(body),
                )
                self._event(
                    body,
                    keys.REASON_GPU_SHARE_GATE_REMOVED,
                    "The mpijob.io/gpu-share scheduling gate was removed before a GPU share was"
                    " placed: the pod runs with no GPU and no MPS limits",
                    warning=True,
                )
            self._stop_waiting(key)
            self._count_bound(key, body, gone)
            return
        self._stop_waiting(key)
        claim = placed.claim or key
        async with self.lock:
            if gone:
                if self._release(claim) is not None and self.waiting:
                    self.wake.set()
            else:
                if self.ledger.held(claim) is None:
                    self.ledger.hold(claim, placed)  # a restart's listing, or a hold that lapsed
                else:
                    self.ledger.confirm(claim)
                if not self.room.holds(_room_key(claim)):
                    self.room.add(_room_key(claim), placed.node, pod_requests(body["spec"]))
            self.export([placed.node])

    def _event(
        self, body: dict[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": body.get("metadata") or {}}
        self.events(pod, (events.warning if warning else events.normal)(reason, message))

    def _stop_waiting(self, key: str) -> None:
        if self.waiting.pop(key, None) is not None:
            metrics.GPU_SHARE_WAITING.set(len(self.waiting))

    def _count_bound(self, key: str, body: dict[str, Any], gone: bool) -> None:
        """A pod without a share takes room on the node it is bound to until it ends.

        Its requests are read once: a bound pod's node and requests do not change.
        """
        node = (body.get("spec") or {}).get("nodeName")
        if gone or not node:
            if self.room.remove(key) and self.waiting:
                self.wake.set()
        elif not self.room.holds(key):
            self.room.add(key, node, pod_requests(body["spec"]))

    def _release(self, claim: str) -> Placed | None:
        self.room.remove(_room_key(claim))
        return self.ledger.release(claim)

    async def rebuild(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Start from listed nodes and pods (before the webhooks serve, after a restart)."""
        async with self.lock:
            for body in nodes:
                read = read_node(body)
                if read is not None:
                    name = body["metadata"]["name"]
                    self.ledger.set_node(name, read[0], binpack=read[1])
                    self.room.set_node(name, (body.get("status") or {}).get("allocatable"))
                    self._nodes[name] = node_facts(body)
            facts = []
            for body in pods:
                meta = body.get("metadata") or {}
                key = f"{meta.get('namespace')}/{meta.get('name')}"
                placed = believed(body)
                if terminal(body):
                    continue
                if placed is None:
                    self._count_bound(key, body, gone=False)
                    continue
                facts.append((placed.claim or key, placed))
                self.room.add(
                    _room_key(placed.claim or key), placed.node, pod_requests(body["spec"])
                )
            self.ledger.rebuild(facts)
            self.export(list(self.ledger.nodes))
        log.info(
            "Rebuilt the GPU-share ledger: %d nodes, %d shares", len(self.ledger.nodes), len(facts)
        )

    # --- webhooks ------------------------------------------------------------------------

    def validate(self, body: dict[str, Any]) -> Share | None:
        """Refuse a pod whose share breaks a rule or could never fit any known GPU; its share."""
        request = read_request(body.get("spec"))
        if request.errors:
            raise kopf.AdmissionError(f"GPU share refused: {aggregate(request.errors)}", code=422)
        share = request.share
        if share is not None and not self.ledger.could_ever_fit(share):
            raise kopf.AdmissionError(
                f"GPU share refused: no opted-in GPU ({keys.NODE_GPU_SCHEDULE_LABEL}="
                f"{keys.NODE_GPU_SCHEDULE_CORE_MEM}) has {share.memory_gib} GiB of memory;"
                f" lower {keys.GPU_MEM_RESOURCE}",
                code=422,
            )
        return share

    async def mutate(self, body: dict[str, Any], *, dryrun: bool) -> list[dict[str, Any]]:
        """The JSON patch giving a share pod its environment and holding it behind the
        scheduling gate; the leader's placement pass (:meth:`place_waiting`) places it once the
        pod exists. Nothing is held here: a request the API server then refuses (a quota, a
        later webhook) or an AdmissionReview that never was a pod leaves the ledger as it was.

        A worker of an MPIJob with more workers than the opted-in GPUs could ever take is
        refused (one integer read, no list built).
        """
        share = self.validate(body)
        if share is None:
            return []
        count = await self._workers(body)
        if count is not None:
            async with self.lock:
                most = self.ledger.capacity(share)
            if count > most:
                raise kopf.AdmissionError(_too_many(body, count, most), code=422)
        return json_patch(body, pod_edits(body, ADMITTED, runtime_class=self.runtime_class))

    async def place_waiting(self, patch: PatchPod) -> int:
        """Place every waiting pod that fits now, oldest first; how many were placed.

        A later pod that fits may go before an earlier one that does not, as the scheduler
        itself does. Each placement is one patch (record, UUID, node affinity, gate removed);
        a patch the API server refuses (the pod went, or changed under us) gives the hold back.
        A pod that still does not fit gets the reason in ``mpijob.io/gpu-share-waiting`` and a
        Waiting Event, once per reason. A pass decides for one pod of each shape (share,
        requests, node constraints; or MPIJob) at most once after it failed, and lets the
        event loop run between pods: a thousand waiting replicas of one Job cost one decision
        per pass, not a stalled loop.
        """
        done = 0
        failed: dict[str, str] = {}
        queue = sorted(
            self.waiting.items(),
            key=lambda item: str((item[1].get("metadata") or {}).get("creationTimestamp") or ""),
        )
        for key, body in queue:
            if self.waiting.get(key) is not body:
                continue  # placed, gone or changed meanwhile: its next turn reads it afresh
            shape = _shape(body)
            if shape in failed:
                await self._still_waits(patch, body, failed[shape])
                continue
            await asyncio.sleep(0)
            share = read_request(body.get("spec")).share
            if share is None:  # cannot happen: the webhook admitted it with a valid share
                continue
            count = await self._workers(body)
            async with self.lock:
                most = self.ledger.capacity(share) if count is not None else 0
                placed = (
                    _too_many(body, count, most)  # the GPUs shrank since its admission
                    if count is not None and count > most
                    else self._place(body, share, count, claim=f"pod-{body['metadata'].get('uid')}")
                )
            if not isinstance(placed, Placed):
                failed[shape] = placed
                await self._still_waits(patch, body, placed)
                continue
            meta = body["metadata"]
            try:
                await patch(
                    meta["namespace"], meta["name"], json_patch(body, placement_edits(placed))
                )
            except ApiError as error:
                # Only a pod that is gone gives its hold back at once: a refusal may answer a
                # stale body of a pod already placed, whose hold its next event confirms; any
                # other hold lapses unless a pod is seen holding it.
                if error.not_found and worker_of(body) is None:
                    async with self.lock:
                        self._release(placed.claim)
                        self.export([placed.node])
                log.warning(
                    "Could not place the waiting pod %s: %s",
                    key,
                    error.message,
                    extra=_about(body),
                )
                continue
            if self.waiting.get(key) is body:
                self._stop_waiting(key)
            done += 1
            log.info(
                "Placed the waiting pod %s on %s GPU %d",
                key,
                placed.node,
                placed.gpu,
                extra=_about(body),
            )
            self._event(
                body,
                keys.REASON_GPU_SHARE_PLACED,
                f"Placed on {placed.node} GPU {placed.gpu}"
                + (f" ({placed.uuid})" if placed.uuid else "")
                + "; the scheduler may bind it now",
            )
        return done

    async def _still_waits(self, patch: PatchPod, body: dict[str, Any], reason: str) -> None:
        """Tell a pod that could not be placed why (once per reason: its annotation and an
        Event)."""
        meta = body.get("metadata") or {}
        if (meta.get("annotations") or {}).get(keys.GPU_SHARE_WAITING) == reason:
            return
        ops = waiting_patch(body, reason)
        if not ops:
            return
        try:
            await patch(meta["namespace"], meta["name"], ops)
        except ApiError as error:  # gone or placed meanwhile: its next event tells
            log.info(
                "Could not write why pod %s waits: %s",
                meta.get("name"),
                error.message,
                extra=_about(body),
            )
            return
        log.info(
            "GPU share of pod %s/%s waits: %s",
            meta["namespace"],
            meta["name"],
            reason,
            extra=_about(body),
        )
        self._event(body, keys.REASON_GPU_SHARE_WAITING, reason)

    async def run_placement(self, patch: PatchPod) -> None:
        """Place waiting pods whenever something frees room or a pod comes to wait (and after
        a lapse of holds). The leader's work only: the manager runs it while this replica
        holds the Lease.

        One writer of placements: every replica's webhook gates and validates alone, and its
        ledger follows the records the leader writes (the pod watch), so two replicas never
        hand out one share twice. A patch that races a former leader's fails on the gate's
        ``test`` and gives nothing to the pod twice.
        """
        await on_wake(
            self.wake,
            PENDING_SECONDS,
            lambda: bool(self.waiting),
            lambda: self.place_waiting(patch),
            "Placing waiting GPU shares",
        )

    async def _workers(self, body: dict[str, Any]) -> int | None:
        worker = worker_of(body)
        if worker is None:
            return None
        return await self.workers_of(worker.namespace, worker.job, worker.uid)

    def _place(
        self, body: dict[str, Any], share: Share, count: int | None, *, claim: str
    ) -> Placed | str:
        """Under the lock: ``share`` placed and held for the existing pod ``body`` (pending
        until the watch sees its record), or why not."""
        spec = body.get("spec") or {}
        now = self._clock.monotonic()
        lapsed = self.ledger.expire(now)
        for gone in lapsed:
            self.room.remove(_room_key(gone))
        allowed = eligible_nodes(spec, self._nodes)
        requests = pod_requests(spec)
        worker = worker_of(body)
        if worker is not None and count is not None and worker.index < count:
            placed = self._place_workers(worker, count, share, allowed, requests, now)
        else:
            placed = self.ledger.place(
                claim,
                share,
                allowed,
                pending_until=now + PENDING_SECONDS,
                room=lambda node: self.room.fits(node, requests),
            )
            if isinstance(placed, Placed):
                self.room.add(_room_key(claim), placed.node, requests)
        if lapsed:
            self.export(list(self.ledger.nodes))
        elif isinstance(placed, Placed):
            self.export(self._touched or [placed.node])
        self._touched = []
        return placed

    def _place_workers(
        self,
        worker: Worker,
        count: int,
        share: Share,
        allowed: list[str] | None,
        requests: dict[str, Any],
        now: float,
    ) -> Placed | str:
        claim = worker.claim(worker.index)
        held = self.ledger.held(claim)
        if held is not None and held.share == share:
            return held
        if held is not None:  # the job's template changed: its reservation no longer fits it
            self._release(claim)
        result = self.ledger.place_all(
            [(worker.claim(i), share) for i in range(count)],
            allowed,
            pending_until=now + PENDING_SECONDS,
            room=lambda node, already: self.room.fits(node, requests, 1 + already),
        )
        if isinstance(result, str):
            return f"the {count} workers of MPIJob {worker.job} are placed all or nothing: {result}"
        for placed in result:
            if not self.room.holds(_room_key(placed.claim)):
                self.room.add(_room_key(placed.claim), placed.node, requests)
        self._touched = sorted({p.node for p in result})
        return result[worker.index]

    def export(self, nodes: list[str]) -> None:
        """Set the share gauges of ``nodes``' GPUs (a node gone: its series removed)."""
        metrics.GPU_SHARES.set(len(self.ledger))
        for name in nodes:
            state = self.ledger.nodes.get(name)
            known = self._exported.pop(name, set())
            current = set(state.gpus) if state is not None else set()
            for index in known - current:
                for gauge in _GPU_GAUGES:
                    gauge.remove(name, str(index))
            if state is None:
                continue
            for gpu in state.gpus.values():
                labels = (name, str(gpu.index))
                metrics.GPU_SHARE_MEMORY.labels(*labels).set(gpu.memory_used)
                metrics.GPU_SHARE_PERCENTAGE.labels(*labels).set(gpu.percentage_used)
                metrics.GPU_SHARE_CLIENTS.labels(*labels).set(gpu.clients)
            self._exported[name] = current


def _too_many(body: dict[str, Any], count: int, most: int) -> str:
    worker = worker_of(body)
    job = worker.job if worker is not None else "?"
    return (
        f"GPU share refused: MPIJob {job} spec.mpiReplicaSpecs.{keys.REPLICA_WORKER}.replicas is"
        f" {count}, but the opted-in GPUs take at most {most} shares of this size; lower"
        f" spec.mpiReplicaSpecs.{keys.REPLICA_WORKER}.replicas"
    )


def _shape(body: dict[str, Any]) -> str:
    """What decides where a pod's share may go: pods of one shape fit or fail together."""
    worker = worker_of(body)
    if worker is not None:
        return f"mpijob/{worker.namespace}/{worker.uid}"
    spec = body.get("spec") or {}
    return json.dumps(
        [[c.get("resources") for c in spec.get(f) or []] for f in ("initContainers", "containers")]
        + [spec.get(f) for f in ("nodeSelector", "affinity", "tolerations", "overhead")],
        sort_keys=True,
    )


def _room_key(claim: str) -> str:
    """A share's entry in the node room, apart from the pod entries keyed ``namespace/name``."""
    return f"share:{claim}"


def _gated(body: dict[str, Any]) -> bool:
    gates = (body.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == keys.GPU_SHARE_GATE for g in gates)


def pod_patcher(kube: KubeApi) -> PatchPod:
    """Send a JSON patch to a pod."""

    async def patch(namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        await kube.json_patch("v1", "Pod", namespace, name, ops)

    return patch


def workers_reader(kube: KubeApi) -> WorkersOf:
    """How many workers an MPIJob has, read from the API server (None: no such job, or one of
    another uid: a pod's owner reference is written by whoever creates the pod)."""

    async def workers_of(namespace: str, name: str, uid: str) -> int | None:
        job = await kube.get(keys.API_VERSION, keys.KIND, namespace, name)
        if job is None or (job.get("metadata") or {}).get("uid") != uid:
            return None
        worker = ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).get(keys.REPLICA_WORKER)
        replicas = (worker or {}).get("replicas", 1)
        return replicas if isinstance(replicas, int) and replicas >= 0 else None

    return workers_of


def _about(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return about("Pod", meta.get("namespace"), meta.get("name"))
