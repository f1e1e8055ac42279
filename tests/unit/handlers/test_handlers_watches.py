"""What an MPIJob's watch event asks of the work queue; what the pod and GPU quota indices keep."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from mpijob import keys
from mpijob.gang import quota
from mpijob.gang.topology import PoolHealth
from mpijob.handlers.cache import Cache, ClaimsBy, Index, PodsBy
from mpijob.handlers.runtime import OperatorMemo
from mpijob.handlers.watches import (
    SUSPENDED_FIRST_SYNC_SECONDS,
    child_event,
    claim_event,
    informer_handler,
    job_summary,
    kept_metadata,
    kopf_indexed,
    limits_gpus,
    mpijob_deleted,
    mpijobs_by_key,
    node_event,
    pod_event,
    quotas_by_namespace,
    slice_event,
)
from mpijob.objects import JSON
from mpijob.platform.informer import Informer
from mpijob.platform.kopf_tuning import InformedIndexer
from mpijob.platform.workers import KOPF_INDICES, Workers
from mpijob.platform.workqueue import BASE_DELAY_SECONDS
from support.virtual_time import FakeClock, virtual_time

pytestmark = pytest.mark.unit

KEY = ("ns", "pi")


def _event(version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "pi", "resourceVersion": version}}


def _indexed(version: str) -> Cache:
    """A cache whose MPIJob index has the job at ``version``."""
    return Cache(indices={Index.MPIJOBS_BY_KEY: {KEY: [_event(version)]}})


async def _job_event(rt: Any, type: str | None, raw: dict[str, Any]) -> None:
    """Kopf's calls for an MPIJob's event: the index function, whose result Kopf files, for
    every event but a deletion; for a deletion, the handler filtered to it, once Kopf has
    unfiled the job."""
    memo = SimpleNamespace(runtime=rt)
    index = rt.cache.indices[Index.MPIJOBS_BY_KEY]
    if type == "DELETED":
        index.pop(KEY, None)
        await mpijob_deleted(namespace="ns", name="pi", memo=memo)
        return
    filed = await mpijobs_by_key(body=kopf.Body(raw), namespace="ns", name="pi", memo=memo)
    assert filed == {KEY: job_summary(raw)}
    index[KEY] = [filed[KEY]]


async def _event_seen(type: str | None, version: str) -> Workers:
    rt = SimpleNamespace(cache=_indexed("1"), workers=Workers(threadiness=1))
    rt.cache.wrote_status(KEY, "1", {"metadata": {"resourceVersion": "2"}})
    await _job_event(rt, type, _event(version))
    return rt.workers


async def test_a_deleted_job_is_forgotten_and_asks_for_no_sync() -> None:
    forgotten = []
    rt = SimpleNamespace(
        cache=_indexed("1"), workers=Workers(threadiness=1), forget=forgotten.append
    )
    await _job_event(rt, "DELETED", _event("3"))
    assert forgotten == [KEY]
    assert KEY not in rt.workers.queue


async def test_the_echo_of_our_own_status_write_asks_for_no_sync() -> None:
    assert KEY not in (await _event_seen("MODIFIED", "2")).queue


def test_a_status_write_that_returns_after_the_jobs_deletion_is_not_remembered() -> None:
    """The deletion forgot the job; a write in flight then must not bring back what nothing
    would drop again (a long-lived operator would keep a body per such job)."""
    cache = _indexed("1")
    cache.wrote_status(KEY, "1", {"metadata": {"resourceVersion": "2"}})
    assert cache.job_body(KEY) == {"metadata": {"resourceVersion": "2"}}
    cache.indices = {Index.MPIJOBS_BY_KEY: {}}  # the DELETED event left the index
    cache.forget(KEY)
    cache.wrote_status(KEY, "2", {"metadata": {"resourceVersion": "3"}})
    assert cache.written == {}


async def test_any_other_version_of_the_job_asks_for_its_sync() -> None:
    # None: listed (at start, or again after a broken watch). Version 2 is our own write's echo.
    for type, version in [("MODIFIED", "3"), ("ADDED", "4"), (None, "3")]:
        workers = await _event_seen(type, version)
        assert await asyncio.wait_for(workers.queue.get(), 1) == KEY


@virtual_time
async def test_a_job_event_waits_the_base_delay_as_upstreams_add_rate_limited() -> None:
    """Not at once: a client that creates a job and then updates the object its create returned
    gets that update in before our first status write, as with upstream's controller."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    workers = await _event_seen("ADDED", "1")
    assert len(workers.queue) == 0  # nothing to take yet
    assert KEY in workers.queue  # its timer runs
    assert await asyncio.wait_for(workers.queue.get(), 1) == KEY
    assert loop.time() - start == pytest.approx(BASE_DELAY_SECONDS)


async def test_the_quota_index_keeps_only_gpu_limits_and_scopes_of_gpu_quotas() -> None:
    body = kopf.Body(
        {
            "metadata": {"namespace": "team", "name": "gpus"},
            "spec": {
                "hard": {keys.QUOTA_GPU_REQUESTS: "8", "requests.cpu": "64"},
                "scopes": ["NotTerminating"],
            },
            "status": {"used": {keys.QUOTA_GPU_REQUESTS: "4", "requests.cpu": "3"}},
        }
    )
    got = await quotas_by_namespace(body=body, namespace="team", name="gpus")
    assert got == {
        "team": {
            "metadata": {"name": "gpus", "namespace": "team"},
            "spec": {
                "hard": {keys.QUOTA_GPU_REQUESTS: "8"},
                "scopes": ["NotTerminating"],
                "scopeSelector": {},
            },
            "status": {"used": {keys.QUOTA_GPU_REQUESTS: "4"}},
        }
    }
    [limit] = quota.limits_of(got["team"])
    assert (limit.hard, limit.used) == (8, 4)
    cpu_only = kopf.Body({"metadata": {"namespace": "team"}, "spec": {"hard": {"pods": "9"}}})
    assert await quotas_by_namespace(body=cpu_only, namespace="team", name="pods") == {}
    assert not limits_gpus(cpu_only.spec)


def _pod(name: str, node: str, phase: str, gpus: str | None, **labels: str) -> dict[str, Any]:
    resources = {"limits": {keys.GPU_RESOURCE: gpus}} if gpus else {}
    container = {"name": "c", "image": "i", "resources": {**resources, "requests": {"cpu": "1"}}}
    meta = {"namespace": "ns", "name": name, "uid": f"uid-{name}", "labels": labels}
    spec = {"nodeName": node, "containers": [container]}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


async def test_the_pod_informer_files_each_pod_under_every_key_it_is_read_by() -> None:
    """Ours by job; anyone's GPU pods by node (unbound: node ""); anyone's bound, unfinished
    pods' requests by node. The placement snapshot reads the last two back."""
    rt = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1), reported_actual={})
    kube: Any = None  # nothing is listed or watched: the events are applied by hand
    pods = Informer(kube, "v1", "Pod", index=InformedIndexer(), handle=partial(pod_event, rt))
    ours = {keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME, keys.LABEL_JOB_NAME: "pi"}
    bodies = {
        "pi-worker-0": _pod("pi-worker-0", "n1", "Running", "2", **ours),
        "pending": _pod("pending", "", "Pending", "1"),
        "cpu-only": _pod("cpu-only", "n1", "Running", None),
        "done": _pod("done", "n1", "Succeeded", "4"),
    }
    filed = {name: pod_event(rt, None, body) for name, body in bodies.items()}  # type: ignore[arg-type]
    assert {name: sorted(keys_) for name, keys_ in filed.items()} == {
        "pi-worker-0": sorted(
            [(PodsBy.JOB, "ns", "pi"), (PodsBy.GPUS_ON, "n1"), (PodsBy.REQUESTS_ON, "n1")]
        ),
        "pending": [(PodsBy.GPUS_ON, "")],
        "cpu-only": [(PodsBy.REQUESTS_ON, "n1")],
        "done": [(PodsBy.GPUS_ON, "n1")],  # its GPUs are counted until it is gone; room is not
    }
    worker = filed["pi-worker-0"]
    assert "containers" not in worker[(PodsBy.JOB, "ns", "pi")]["spec"]  # what the sync reads
    gpu_summary = worker[(PodsBy.GPUS_ON, "n1")]
    assert gpu_summary["spec"]["containers"] == [
        {"resources": {"limits": {keys.GPU_RESOURCE: "2"}}}
    ]
    assert ("ns", "pi") in rt.workers.queue  # our pod's event asks for its job's sync

    for body in bodies.values():
        pods.apply(None, body)
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY}
    node = {"metadata": {"name": "n1", "labels": labels}, "spec": {}, "status": {}}
    cache = Cache(indices={Index.PODS: pods.index.index, Index.NODES_BY_NAME: {"n1": [node]}})
    snapshot = cache.placement_snapshot()
    assert sorted(p["metadata"]["name"] for p in snapshot.pods) == [
        "done",
        "pending",
        "pi-worker-0",
    ]
    assert snapshot.requested["n1"]["cpu"] == 2
    assert snapshot.requested["n1"]["pods"] == 2
    assert cache.pods(("ns", "pi")) == [worker[(PodsBy.JOB, "ns", "pi")]]

    pods.apply("DELETED", bodies["pi-worker-0"])
    assert cache.pods(("ns", "pi")) == []
    assert [p["metadata"]["name"] for p in cache.placement_snapshot().pods] == ["done", "pending"]


def _node(ready: str) -> JSON:
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY}
    return {
        "metadata": {"name": "n1", "uid": "uid-n1", "labels": labels},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "allocatable": {"cpu": "8"},
            "images": ["what no reader needs"],
        },
    }


async def test_a_node_deleted_or_not_ready_asks_for_the_sync_of_the_jobs_placed_there() -> None:
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1), admission=None)
    placed = {"spec": {"job": {"name": "pi"}, "workers": [{"node": "n0"}, {"node": "n1"}]}}
    other = {"spec": {"job": {"name": "other"}, "workers": [{"node": "n0"}]}}
    rt.cache.indices = {"decisions_by_job": {KEY: [placed], ("ns", "other"): [other]}}
    filed = node_event(rt, "MODIFIED", _node("True"))
    assert len(rt.workers.queue) == 0  # a heartbeat of a healthy node
    assert filed == {
        "n1": {
            "metadata": {
                "name": "n1",
                "labels": _node("True")["metadata"]["labels"],
                "annotations": None,
            },
            "spec": _node("True")["spec"],
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": {"cpu": "8"},
            },
        }
    }
    node_event(rt, "MODIFIED", _node("False"))
    assert len(rt.workers.queue) == 1
    assert rt.cache.jobs_placed_on("n1") == [KEY]
    assert sorted(rt.cache.jobs_placed_on("n0")) == [("ns", "other"), KEY]


async def test_a_node_gone_or_no_longer_opted_in_is_unfiled_and_its_jobs_synced() -> None:
    """The node informer watches by the opt-in label: a node that loses it comes as DELETED."""
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1), admission=None)
    placed = {"spec": {"job": {"name": "pi"}, "workers": [{"node": "n1"}]}}
    rt.cache.indices = {"decisions_by_job": {KEY: [placed]}}
    assert node_event(rt, "DELETED", _node("True")) == {}
    assert len(rt.workers.queue) == 1


def _pool_node(name: str, ready: str) -> JSON:
    return {**_node(ready), "metadata": {**_node(ready)["metadata"], "name": name, "uid": name}}


async def test_a_node_is_noted_not_ready_from_first_sight_until_ready_and_the_pool_weighed() -> (
    None
):
    """What the placement checks weigh a node that is not Ready by: since when this process
    has seen it so (kept while it stays not Ready, whatever its condition says next), whether
    most of the pool is not Ready with it, and when the pool last stopped being so."""
    clock = FakeClock()
    t0 = clock.now()
    cache = Cache(clock=clock)
    index = InformedIndexer()
    cache.indices = {Index.NODES_BY_NAME: index.index}
    rt: Any = SimpleNamespace(cache=cache, workers=Workers(threadiness=1), admission=None)
    kube: Any = None  # events are given to it by hand
    nodes = Informer(kube, "v1", "Node", index=index, handle=partial(node_event, rt))
    for name in ("n1", "n2", "n3", "n4"):
        nodes.apply(None, _pool_node(name, "True"))
    nodes.apply("MODIFIED", _pool_node("n1", "False"))
    clock.advance(30)
    nodes.apply("MODIFIED", _pool_node("n1", "Unknown"))  # still not Ready: first sight kept
    assert cache.pool_health() == PoolHealth({"n1": t0}, disrupted=False)
    nodes.apply("MODIFIED", _pool_node("n2", "False"))
    assert not cache.pool_health().disrupted  # two of four
    nodes.apply("MODIFIED", _pool_node("n3", "Unknown"))
    assert cache.pool_health().disrupted  # three of four: 75 %
    clock.advance(60)
    nodes.apply("MODIFIED", _pool_node("n1", "True"))  # two of four: recovered, now
    clock.advance(5)
    nodes.apply("DELETED", _pool_node("n2", "False"))
    recovered = t0 + timedelta(seconds=90)
    assert cache.pool_health() == PoolHealth({"n3": t0 + timedelta(seconds=30)}, False, recovered)


def test_the_placement_view_is_complete_only_while_every_informer_index_it_reads_is() -> None:
    pods, nodes = InformedIndexer(), InformedIndexer()
    pods.complete = nodes.complete = True
    # Kopf's indices (a plain mapping here) say nothing of it; claims are not kept without DRA.
    cache = Cache(
        indices={
            Index.PODS: pods.index,
            Index.NODES_BY_NAME: nodes.index,
            Index.MPIJOBS_BY_KEY: {},
        }
    )
    assert cache.complete()
    nodes.complete = False  # its watch broke, and it has not listed again yet
    assert not cache.complete()
    assert cache.complete([Index.PODS])


def test_a_resource_slice_files_its_gpus_uuids_under_its_node_and_others_nothing() -> None:
    def slice_(driver: str, node: str | None) -> JSON:
        devices = [
            {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
            {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}}},
            {"name": "nic", "attributes": {}},
        ]
        return {"spec": {"driver": driver, "nodeName": node, "devices": devices}}

    ours = slice_(keys.NVIDIA_GPU_DRIVER, "n1")
    assert slice_event("ADDED", ours) == {
        "n1": {"devices": {"gpu-0": "GPU-a", "gpu-1": "GPU-b"}, "tainted": []}
    }
    assert slice_event(None, ours) == slice_event("ADDED", ours)
    assert slice_event("DELETED", ours) == {}
    assert slice_event("ADDED", slice_("other.example.com", "n1")) == {}
    assert slice_event("ADDED", slice_(keys.NVIDIA_GPU_DRIVER, None)) == {}


def test_a_resource_slice_names_the_gpus_its_device_taints_keep_claims_off() -> None:
    def device(name: str, uuid: str, *effects: str) -> JSON:
        taints = [{"key": "example.com/ecc", "value": "x", "effect": e} for e in effects]
        return {"name": name, "attributes": {"uuid": {"string": uuid}}, "taints": taints}

    devices = [
        device("gpu-0", "GPU-a"),
        device("gpu-1", "GPU-b", "NoSchedule"),
        device("gpu-2", "GPU-c", "NoExecute"),
        device("gpu-3", "GPU-d", "None"),  # informs only: still allocatable
    ]
    body = {"spec": {"driver": keys.NVIDIA_GPU_DRIVER, "nodeName": "n1", "devices": devices}}
    [(node, published)] = slice_event("ADDED", body).items()
    assert node == "n1"
    assert published["tainted"] == ["GPU-b", "GPU-c"]
    assert len(published["devices"]) == 4, "a tainted GPU is still the slice's (no conflict)"


def _claim(name: str, uid: str, results: list[JSON], job: str | None = None) -> JSON:
    metadata: JSON = {"name": name, "namespace": "ns", "uid": uid}
    if job:
        owner = {"apiVersion": keys.API_VERSION, "kind": keys.KIND, "name": job, "uid": "j"}
        metadata["ownerReferences"] = [{**owner, "controller": True}]
    return {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": [{"name": "gpus"}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _result(node: str, device: str, driver: str = keys.NVIDIA_GPU_DRIVER) -> JSON:
    return {"driver": driver, "pool": node, "device": device, "request": "gpus"}


async def test_a_claim_is_filed_under_its_job_and_the_node_whose_gpus_it_holds() -> None:
    """Our worker's claim: its spec and NVIDIA allocation under the job, the job's sync asked
    for, admission woken; anyone's claim: its NVIDIA devices under their node, and no sync.
    The placement snapshot reads both back; a deletion unfiles them and asks again."""
    woken = []
    admission = SimpleNamespace(wake=lambda: woken.append(1))
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1), admission=admission)
    claims = Informer(
        None,  # type: ignore[arg-type]  # nothing is listed or watched here
        keys.DRA_API_VERSION,
        "ResourceClaim",
        index=InformedIndexer(),
        handle=informer_handler(rt, Index.CLAIMS),
    )
    ours = _claim(
        "pi-worker-0-gpus",
        "c1",
        [_result("n1", "gpu-0"), _result("n1", "gpu-1"), _result("n1", "nic", "net.example")],
        job="pi",
    )
    theirs = _claim("other", "c2", [_result("n1", "gpu-2"), _result("n2", "gpu-0")])
    filed = claim_event(rt, None, ours)
    assert filed == {
        (ClaimsBy.JOB, "ns", "pi"): {
            "apiVersion": keys.DRA_API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": "pi-worker-0-gpus", "namespace": "ns", "uid": "c1",
                         "ownerReferences": ours["metadata"]["ownerReferences"]},
            "spec": ours["spec"],
            "status": {"allocated": [["n1", "gpu-0"], ["n1", "gpu-1"]]},
        },
        (ClaimsBy.ALLOCATED_ON, "n1"): {
            "namespace": "ns", "name": "pi-worker-0-gpus", "devices": ["gpu-0", "gpu-1"]
        },
    }  # fmt: skip
    assert KEY in rt.workers.queue
    assert woken == [1]
    rt.workers = Workers(threadiness=1)
    assert sorted(claim_event(rt, "MODIFIED", theirs)) == [
        (ClaimsBy.ALLOCATED_ON, "n1"),
        (ClaimsBy.ALLOCATED_ON, "n2"),
    ]
    assert len(rt.workers.queue) == 0
    assert woken == [1, 1]

    claims.apply(None, ours)
    claims.apply("ADDED", theirs)
    cache = Cache(indices={Index.CLAIMS: claims.index.index})
    snapshot = cache.placement_snapshot()
    assert {n: sorted(d) for n, d in snapshot.allocated.items()} == {
        "n1": ["gpu-0", "gpu-1", "gpu-2"],
        "n2": ["gpu-0"],
    }
    assert list(snapshot.claims) == [KEY]
    assert [c["metadata"]["name"] for c in snapshot.claims[KEY]] == ["pi-worker-0-gpus"]

    claims.apply("DELETED", ours)
    assert KEY in rt.workers.queue
    assert cache.placement_snapshot().allocated == {"n1": ["gpu-2"], "n2": ["gpu-0"]}
    assert cache.placement_snapshot().claims == {}


@virtual_time
async def test_a_job_created_suspended_is_first_synced_a_second_later_or_at_its_update() -> None:
    """Its creator (Kueue, upstream's e2e suite) updates the object its create returned next; a
    status write before that update would make it fail with 409 Conflict."""
    loop = asyncio.get_running_loop()

    def unfiled() -> Any:
        return SimpleNamespace(
            cache=Cache(indices={Index.MPIJOBS_BY_KEY: {}}), workers=Workers(threadiness=1)
        )

    rt = unfiled()
    suspended = {**_event("1"), "spec": {"runPolicy": {"suspend": True}}}
    start = loop.time()
    await _job_event(rt, "ADDED", suspended)
    assert await asyncio.wait_for(rt.workers.queue.get(), 5) == KEY
    assert loop.time() - start == pytest.approx(SUSPENDED_FIRST_SYNC_SECONDS)

    rt = unfiled()
    start = loop.time()
    await _job_event(rt, "ADDED", suspended)
    await _job_event(rt, "MODIFIED", _event("2"))
    assert await asyncio.wait_for(rt.workers.queue.get(), 5) == KEY
    assert loop.time() - start == pytest.approx(BASE_DELAY_SECONDS)


async def test_a_childs_informer_files_what_the_sync_reads_under_its_controlling_job() -> None:
    """A Service controlled by MPIJob pi: its selector and DNS settings, under the job's key,
    and the job's sync asked for; its deletion asks for it too (the sync makes it again);
    anyone else's Service is neither filed nor a trigger."""
    rt = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1))
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "pi", "uid": "u"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "pi", "namespace": "ns", "uid": "s",
                     "ownerReferences": [{**owner, "controller": True}]},
        "spec": {"selector": {"app": "pi"}, "clusterIP": "None", "ports": [{"port": 22}]},
    }  # fmt: skip
    handle = informer_handler(rt, Index.SERVICES_BY_JOB)  # type: ignore[arg-type]
    filed = handle(None, service)
    assert list(filed) == [KEY]
    assert filed[KEY]["spec"] == {
        "selector": {"app": "pi"},
        "publishNotReadyAddresses": None,
        "clusterIP": "None",
    }
    assert filed[KEY]["kind"] == "Service"
    assert KEY in rt.workers.queue
    rt.workers.queue.forget(KEY)
    assert handle("DELETED", service) == {}
    foreign = {**service, "metadata": {**service["metadata"], "ownerReferences": []}}
    assert handle(None, foreign) == {}


async def test_kopfs_first_event_handler_call_opens_the_workers_for_its_indices() -> None:
    """With the informers' first lists; never before both."""
    rt: Any = SimpleNamespace(workers=Workers(1, caches=frozenset({KOPF_INDICES, Index.PODS})))
    rt.workers.open(Index.PODS)
    assert not rt.workers.indexed.is_set()
    await kopf_indexed(memo=OperatorMemo(runtime=rt))
    assert rt.workers.indexed.is_set()


async def test_a_child_deleted_while_no_watch_ran_still_asks_for_its_jobs_sync() -> None:
    """A list that no longer holds a filed child gives its handler the metadata kept of it:
    its controller, so the job's sync makes it again."""
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1))
    kube: Any = None
    services = Informer(
        kube,
        "v1",
        "Service",
        index=InformedIndexer(),
        handle=informer_handler(rt, Index.SERVICES_BY_JOB),
        kept=kept_metadata,
    )
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "pi", "uid": "u"}
    meta = {"name": "pi", "namespace": "ns", "uid": "s"}
    meta["ownerReferences"] = [{**owner, "controller": True}]  # type: ignore[assignment]
    services.relisted("ns", [{"apiVersion": "v1", "kind": "Service", "metadata": meta}])
    assert list(services.index.index) == [KEY]
    rt.workers.queue.forget(KEY)
    rt.workers = Workers(threadiness=1)  # a fresh queue: only what the relist asks for
    services.relisted("ns", [])
    assert list(services.index.index) == []
    assert KEY in rt.workers.queue
    assert rt.cache.expected == {}


# --- what the caches keep of what a tenant writes --------------------------------------------


def _bloated_metadata(name: str, job_uid: str = "u") -> JSON:
    """A tenant's object: the operator's labels and owner, and everything else it may add."""
    owner = {"apiVersion": keys.API_VERSION, "kind": keys.KIND, "name": "pi", "uid": job_uid}
    return {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "resourceVersion": "9",
        "labels": {
            keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
            keys.LABEL_JOB_NAME: "pi",
            keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
            **{f"tenant/l{i}": "v" * 63 for i in range(200)},
        },
        "annotations": {
            keys.GPU_IDS: "0,1",
            keys.GPU_ACTUAL: "x" * 200_000,  # the operator's key, but not a value it writes
            "kubectl.kubernetes.io/last-applied-configuration": "y" * 200_000,
            **{f"{keys.PREFIX}tenant-{i}": "z" for i in range(200)},
        },
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": f"o{i}", "uid": f"o{i}"}
            for i in range(200)
        ]
        + [{**owner, "controller": True, "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:data": {}}}] * 100,
    }


def test_the_kept_metadata_of_a_tenant_s_object_is_bounded_whatever_it_carries() -> None:
    kept = kept_metadata(_bloated_metadata("pi-worker-0"))
    assert kept["labels"] == {
        keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
        keys.LABEL_JOB_NAME: "pi",
        keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
    }
    assert kept["annotations"] == {keys.GPU_IDS: "0,1"}  # over-long and unknown keys dropped
    assert kept["ownerReferences"] == [
        {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND,
            "name": "pi",
            "uid": "u",
            "controller": True,
        }
    ]
    assert "managedFields" not in kept
    assert len(repr(kept)) < 1024


async def test_a_pod_summary_keeps_the_operator_s_metadata_only() -> None:
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1), reported_actual={})
    body = {"metadata": _bloated_metadata("pi-worker-0"), "spec": {"nodeName": "n"}, "status": {}}
    filed = pod_event(rt, None, body)
    summary = filed[(PodsBy.JOB, "ns", "pi")]
    assert len(repr(summary)) < 1024
    assert summary["metadata"]["annotations"] == {keys.GPU_IDS: "0,1"}


def _config_map_body(name: str, data: JSON) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _bloated_metadata(name),
        "data": data,
    }


async def test_only_the_child_of_the_operator_s_name_is_filed_and_its_data_as_digests() -> None:
    rt: Any = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1))
    data = {"hostfile": "h" * 500_000, "discover_hosts.sh": "d", "tenant": "t" * 500_000}
    filed = child_event(rt, Index.CONFIGMAPS_BY_JOB, None, _config_map_body("pi-config", data))
    summary = filed[("ns", "pi")]
    assert len(repr(summary)) < 1024
    assert "data" not in summary
    # Controlled by the job, but not the name the operator gives its ConfigMap: not filed.
    other = _config_map_body("pi-config-2", {"hostfile": "h"})
    assert child_event(rt, Index.CONFIGMAPS_BY_JOB, None, other) == {}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _bloated_metadata("decoy")}
    assert child_event(rt, Index.LAUNCHERS_BY_JOB, None, job) == {}


def test_a_job_summary_keeps_spec_status_and_labels_not_managed_fields_or_applied_copies() -> None:
    meta = _bloated_metadata("pi")
    meta["annotations"][keys.GPU_TOPOLOGY] = "true"
    meta["annotations"][keys.FABRIC_REQUIRED_LEVEL] = "l" * 5000
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": meta,
        "spec": {"a": 1},
        "status": {"b": 2},
    }
    summary = job_summary(body)
    assert summary["spec"] == {"a": 1}
    assert summary["status"] == {"b": 2}
    assert summary["metadata"]["labels"] == meta["labels"]
    annotations = summary["metadata"]["annotations"]
    assert annotations[keys.GPU_TOPOLOGY] == "true"
    # Cut, not dropped: its validation still names the annotation.
    assert 1000 < len(annotations[keys.FABRIC_REQUIRED_LEVEL]) < 2000
    assert "kubectl.kubernetes.io/last-applied-configuration" not in annotations
    assert "managedFields" not in summary["metadata"]
