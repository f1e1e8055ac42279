"""The reconcile against a client that records every request it is asked to send.

Counterparts of upstream's "do nothing" syncs in ``mpi_job_controller_test.go``: there, the fake
clients must see no action; here, the API must receive no request (or, for an invalid job, only
our documented status condition). Then the level-based syncs: from the caches alone, a sync
creates what is missing and nothing else, and a child deleted by hand comes back.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpijob import keys
from mpijob.api.models import format_time
from mpijob.desired import sync
from mpijob.desired.events import Event
from mpijob.gang import gate, topology
from mpijob.gang.service import Admission
from mpijob.handlers import reconcile
from mpijob.handlers.cache import Index, PodsBy
from mpijob.handlers.runtime import Runtime
from mpijob.platform.deferred import DeferredPatches
from mpijob.platform.kube import ApiError
from mpijob.platform.workers import OwnershipError, Workers
from mpijob.settings import OperatorSettings
from support import jobs
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock, LoopClock, virtual_time

pytestmark = pytest.mark.unit

#: The wall clock's reading when a test starts.
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Where the pod index files the pods of job bar/foo.
PODS_OF_FOO = (PodsBy.JOB, "bar", "foo")


class RecordingRecorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def post(self, obj: dict[str, Any], event: Event) -> None:
        self.events.append(event)

    def ensure(self, obj: dict[str, Any], implied: Any) -> None:
        pass

    def forget(self, job: tuple[str, str]) -> None:
        pass


def runtime(*bodies: dict[str, Any]) -> tuple[Runtime, FakeKube, RecordingRecorder]:
    """The jobs in the API and the cache; the API records each request sent to it."""
    kube, recorder = FakeKube(*bodies), RecordingRecorder()
    rt = Runtime(
        settings=OperatorSettings(),
        kube=kube,
        recorder=recorder,  # type: ignore[arg-type]
        deferred=DeferredPatches(kube),
        workers=Workers(threadiness=1),
    )
    rt.cache.indices = {
        "mpijobs_by_key": {(b["metadata"]["namespace"], b["metadata"]["name"]): [b] for b in bodies}
    }
    return rt, kube, recorder


def job(name: str = "foo", namespace: str = "bar", **spec: Any) -> dict[str, Any]:
    created = {"resourceVersion": "1", "creationTimestamp": "2024-05-01T10:00:00Z"}
    return jobs.body(name, namespace, uid="uid-foo", metadata=created, **spec)


async def test_do_nothing_with_invalid_key() -> None:
    """Counterpart of upstream TestDoNothingWithInvalidKey: key foo/bar/baz."""
    rt, kube, recorder = runtime()
    await reconcile.reconcile(rt, ("foo/bar", "baz"))
    assert kube.requests == []
    assert recorder.events == []


async def test_do_nothing_with_nonexistent_mpijob() -> None:
    """Counterpart of upstream TestDoNothingWithNonexistentMPIJob."""
    rt, kube, recorder = runtime(job("other"))
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == []
    assert recorder.events == []


async def test_do_nothing_with_mpijob_managed_externally() -> None:
    """Counterpart of upstream TestDoNothingWithMPIJobManagedExternally: not even validated."""
    rt, kube, recorder = runtime(job(runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"}))
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == []
    assert recorder.events == []


async def test_do_nothing_with_invalid_mpijob() -> None:
    """Counterpart of upstream TestDoNothingWithInvalidMPIJob: an empty MPIJob bar/foo.

    No child is created. Upstream writes nothing and posts a Warning; we also record an
    ``Invalid`` condition (a documented difference), so the only request is the status write.
    """
    rt, kube, recorder = runtime(job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert [verb for verb, _ in kube.requests] == ["replace_status"]
    written = kube.requests[0][1][0]["status"]["conditions"]
    assert [(c["type"], c["status"], c["reason"]) for c in written] == [
        ("Invalid", "True", "ValidationError")
    ]
    assert "spec.mpiReplicaSpecs" in written[0]["message"]
    assert [(e.type, e.reason) for e in recorder.events] == [("Warning", "ValidationError")]


async def test_an_invalid_job_is_reported_once_not_on_every_sync() -> None:
    rt, kube, recorder = runtime(job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    reported = kube.requests[0][1][0]
    rt.cache.indices["mpijobs_by_key"][("bar", "foo")] = [reported]
    rt.cache.written.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert len(kube.requests) == 1
    assert len(recorder.events) == 1


async def test_do_nothing_with_terminating_mpijob() -> None:
    body = job()
    body["metadata"]["deletionTimestamp"] = "2024-05-01T10:05:00Z"
    rt, kube, recorder = runtime(body)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == []
    assert recorder.events == []


# --- level-based syncs -------------------------------------------------------------------------


def valid_job() -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "image": "mpi"}]}}
    return job(
        mpiReplicaSpecs={
            "Launcher": {"replicas": 1, "template": template},
            "Worker": {"replicas": 2, "template": template},
        }
    )


def index_created(rt: Runtime, kube: FakeKube, *, but: tuple[str, ...] = ()) -> None:
    """Put what the reconcile created into the indices, as the watches would, except ``but``
    (Secrets are not watched)."""
    by_index = {
        "Service": ("services_by_job", ("bar", "foo")),
        "ConfigMap": ("configmaps_by_job", ("bar", "foo")),
        "Job": ("launchers_by_job", ("bar", "foo")),
        "Pod": (Index.PODS, PODS_OF_FOO),
    }
    for verb, args in kube.requests:
        obj = args[0] if verb == "create" else None
        if obj is None or obj["kind"] == "Secret":
            continue
        if f"{obj['kind']}/{obj['metadata']['name']}" in but:
            continue
        index, key = by_index[obj["kind"]]
        store = rt.cache.indices.setdefault(index, {})
        store.setdefault(key, []).append({**obj, "status": {}})
        rt.cache.seen(("bar", "foo"), obj["kind"], obj["metadata"]["name"])


async def test_the_first_sync_creates_every_child_in_upstream_order() -> None:
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.created() == [
        "Service/foo",
        "ConfigMap/foo-config",
        "Secret/foo-ssh",
        "Pod/foo-worker-0",
        "Pod/foo-worker-1",
        "Job/foo-launcher",
    ]


async def test_a_large_job_s_workers_go_out_in_doubling_batches_in_upstream_order() -> None:
    """Pod creations next to each other are sent together, 1, 2, 4, ... at most 64 at once
    (the Job controller's slow start), every other action alone."""
    body = valid_job()
    body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 200
    rt, kube, _ = runtime(body)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.created() == [
        "Service/foo",
        "ConfigMap/foo-config",
        "Secret/foo-ssh",
        *(f"Pod/foo-worker-{i}" for i in range(200)),
        "Job/foo-launcher",
    ]
    pod = sync.Create({"kind": "Pod"})
    other = sync.Create({"kind": "Service"})
    batches = reconcile._batches([other, *[pod] * 200, other, pod, pod])
    assert [len(b) for b in batches] == [1, 1, 2, 4, 8, 16, 32, 64, 64, 9, 1, 1, 1]


async def test_a_sync_before_the_watch_catches_up_creates_nothing_twice() -> None:
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    first = len(kube.created())
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert first == 6
    # The pods are Pending: the job's Secret is read (see the next test), nothing is written.
    assert {verb for verb, _ in kube.requests} <= {"get"}, "expectations stand in for the events"


@pytest.mark.parametrize(
    "deleted",
    [
        ("Service/foo",),
        ("ConfigMap/foo-config",),
        ("Pod/foo-worker-1",),
        ("Secret/foo-ssh", "Pod/foo-worker-1"),
    ],
)
async def test_a_child_deleted_by_hand_is_created_again(deleted: tuple[str, ...]) -> None:
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    index_created(rt, kube, but=deleted)
    for child in deleted:
        rt.cache.seen(("bar", "foo"), *child.split("/"))  # the DELETED event
        kind, name = child.split("/")
        kube.remove(kind, "bar", name)  # by hand
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.created() == list(deleted)


async def test_the_ssh_secret_is_read_by_name_only_before_what_mounts_it_is_created() -> None:
    """Secrets are not watched: a sync that creates nothing reads none, but while pods are
    Pending once a while; one that creates a worker reads the job's Secret first, and one that
    exists is not made again."""
    rt, kube, _ = runtime(valid_job())
    rt.cache.clock = clock = FakeClock()
    await reconcile.reconcile(rt, ("bar", "foo"))
    index_created(rt, kube)
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == []  # pods Pending, and the Secret was written just now
    clock.advance(reconcile.PENDING_SECRET_READ_SECONDS - 0.5)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == []  # not yet
    clock.advance(0.5)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == [("get", ("v1", "Secret", "bar", "foo-ssh"))]  # pods still Pending
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.requests == [("get", ("v1", "Secret", "bar", "foo-ssh"))]  # not again so soon

    for pod in rt.cache.indices[Index.PODS][PODS_OF_FOO]:
        pod["status"] = {"phase": "Running"}
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert [verb for verb, _ in kube.requests] == ["replace_status"]  # Running; no read

    kube.requests.clear()
    gone = rt.cache.indices[Index.PODS][PODS_OF_FOO].pop()  # a worker deleted
    kube.remove("Pod", "bar", gone["metadata"]["name"])
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert [(v, a[1:]) for v, a in kube.requests if v == "get"] == [
        ("get", ("Secret", "bar", "foo-ssh"))
    ]
    assert kube.created() == ["Pod/foo-worker-1"]


async def test_a_job_is_checked_once_per_version_and_no_sync_changes_what_was_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parsed, defaulted job is shared by the syncs of one version (see Cache.check): one
    that changed it would leak its changes into the next."""
    checks: list[tuple[str, Any, dict[str, Any]]] = []
    real = reconcile.checked

    def counted(body: dict[str, Any], *args: Any) -> Any:
        job, errors = real(body, *args)
        assert job is not None
        checks.append((body["metadata"]["resourceVersion"], job, job.model_dump()))
        return job, errors

    monkeypatch.setattr(reconcile, "checked", counted)
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))  # creates everything, writes Created
    index_created(rt, kube)
    for _ in range(2):
        await reconcile.reconcile(rt, ("bar", "foo"))
    for pod in rt.cache.indices[Index.PODS][PODS_OF_FOO]:
        pod["status"] = {"phase": "Running"}
    for _ in range(2):
        await reconcile.reconcile(rt, ("bar", "foo"))  # Running: a status write, then none
    versions = [version for version, _, _ in checks]
    assert len(versions) < 5  # five syncs, fewer checks
    assert all(a != b for a, b in itertools.pairwise(versions))  # one per version
    assert all(job.model_dump() == before for _, job, before in checks)


async def test_after_a_restart_the_first_sync_finds_the_ssh_secret_and_makes_none() -> None:
    """The create is the read: refused (the name is taken), the job's own Secret is read and
    kept as it is, and the pods that mount it are created."""
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    index_created(rt, kube)
    [before] = kube.stored("Secret", "bar")
    rt.cache.secrets.clear()  # a new process remembers no Secret
    gone = rt.cache.indices[Index.PODS][PODS_OF_FOO].pop()
    kube.remove("Pod", "bar", gone["metadata"]["name"])
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.created() == ["Secret/foo-ssh", "Pod/foo-worker-1"]
    assert kube.stored("Secret", "bar") == [before]  # refused: the Secret was not made again
    assert rt.cache.knows_secret(("bar", "foo"))


async def test_a_new_jobs_first_sync_creates_its_secret_without_reading_it_first() -> None:
    """Upstream reads Secrets from an informer: its first sync of a new job sends no GET, and
    neither does ours (the create is the read, see the test above)."""
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert "Secret/foo-ssh" in kube.created()
    assert [args for verb, args in kube.requests if verb == "get"] == []


async def test_a_childs_name_taken_by_an_object_the_job_does_not_control_is_left_alone() -> None:
    """Upstream's ``ErrResourceExists``: a Warning, and the sync fails (to be retried); the
    object is neither adopted nor changed, and nothing after it is created."""
    rt, kube, recorder = runtime(valid_job())
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "foo", "namespace": "bar"},
    }
    kube.add(theirs)
    with pytest.raises(OwnershipError):
        await reconcile.reconcile(rt, ("bar", "foo"))
    assert kube.created() == ["Service/foo"]
    assert [(e.type, e.reason) for e in recorder.events] == [
        ("Warning", keys.REASON_RESOURCE_EXISTS)
    ]
    assert "ownerReferences" not in kube.stored("Service", "bar")[0]["metadata"]
    assert rt.cache.expected == {}


async def test_a_childs_name_freed_between_the_create_and_the_read_fails_the_sync_quietly() -> None:
    """A 409 whose holder is gone by the read: the sync is retried from a fresh look, with no
    Warning (nothing failed but timing)."""
    rt, kube, recorder = runtime(valid_job())
    kube.fail("create", ApiError(409, "AlreadyExists", 'services "foo" already exists'))
    with pytest.raises(ApiError) as raised:
        await reconcile.reconcile(rt, ("bar", "foo"))
    assert raised.value.status == 409
    assert recorder.events == []
    assert [verb for verb, _ in kube.requests] == ["create", "get"]


async def test_resume_replaces_the_launcher_with_the_version_its_status_patch_returned() -> None:
    """Resume clears the launcher's startTime, then unsuspends it: the second write must carry
    the resourceVersion the first produced, or it is refused with a conflict."""
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    index_created(rt, kube)
    launcher = rt.cache.indices["launchers_by_job"][("bar", "foo")][0]
    launcher["metadata"] = {**launcher["metadata"], "resourceVersion": "1", "uid": "l"}
    launcher["spec"]["suspend"] = True
    launcher["status"] = {"startTime": "2024-05-01T10:01:00Z"}
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    writes = [(verb, args) for verb, args in kube.requests if verb in ("patch", "replace")]
    assert [verb for verb, _ in writes] == ["patch", "replace"]
    assert writes[0][1][-1] == {"status": {"startTime": None}}
    assert writes[1][1][0]["spec"]["suspend"] is False
    assert writes[1][1][0]["metadata"]["resourceVersion"] == "2"


async def test_a_job_too_large_for_its_hostfile_says_so_instead_of_retrying_a_413() -> None:
    body = valid_job()
    body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 100_000
    rt, kube, recorder = runtime(body)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert [verb for verb, _ in kube.requests] == ["replace_status"]
    [condition] = kube.requests[0][1][0]["status"]["conditions"]
    assert condition["type"] == "Invalid"
    assert "spec.mpiReplicaSpecs[Worker].replicas" in condition["message"]
    assert "1048576 bytes" in condition["message"]
    assert [(e.type, e.reason) for e in recorder.events] == [("Warning", "ValidationError")]


async def test_only_a_sync_that_finishes_the_job_asks_for_the_next_one() -> None:
    """The watch event of our own status write asks for no sync; the sync that marks the job
    finished queues the one that cleans up and releases (both read the status)."""
    rt, kube, _ = runtime(valid_job())
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert any(verb == "replace_status" for verb, _ in kube.requests)  # Created
    assert len(rt.workers.queue) == 0
    index_created(rt, kube)
    launcher = rt.cache.indices["launchers_by_job"][("bar", "foo")][0]
    launcher["status"] = {
        "conditions": [{"type": "Complete", "status": "True"}],
        "succeeded": 1,
        "completionTime": "2024-05-01T10:05:00Z",
    }
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    written = [args[0]["status"] for verb, args in kube.requests if verb == "replace_status"]
    assert ("Succeeded", "True") in {(c["type"], c["status"]) for c in written[-1]["conditions"]}
    assert len(rt.workers.queue) == 1


# --- topology jobs: a same-named successor, a lost node ----------------------------------------


def topology_runtime(body: dict[str, Any]) -> tuple[Runtime, FakeKube, RecordingRecorder]:
    rt, kube, recorder = runtime(body)
    rt.admission = Admission(
        write_decision=kube.create,
        enqueue=rt.workers.enqueue,
        snapshot=rt.cache.placement_snapshot,
        live=partial(rt.cache.job, check=partial(reconcile.checked, settings=rt.settings)),
        decision_of=rt.cache.decision,
        priority_values=dict,
        create_object=kube.create,
        get_object=kube.get,
        inter_node_gbps=25.0,
    )
    return rt, kube, recorder


def gpu_job() -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "c", "image": "mpi", "resources": GPU_LIMITS}]}}
    body = job(
        mpiReplicaSpecs={
            "Launcher": {"replicas": 1, "template": {"spec": {"containers": [{"name": "l"}]}}},
            "Worker": {"replicas": 2, "template": template},
        }
    )
    body["metadata"]["annotations"] = {keys.GPU_TOPOLOGY: "true"}
    return body


GPU_LIMITS = {"limits": {keys.GPU_RESOURCE: "8"}}


def decision_body(uid: str, *nodes: str) -> dict[str, Any]:
    return {
        "apiVersion": keys.DECISION_API_VERSION,
        "kind": keys.DECISION_KIND,
        "metadata": {"name": "foo", "namespace": "bar", "uid": f"decision-{uid}"},
        "spec": {
            "job": {"name": "foo", "uid": uid},
            "workers": [{"node": n, "gpus": list(range(8))} for n in nodes],
        },
    }


def worker_pod(index: int, node: str, owner: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"foo-worker-{index}",
            "namespace": "bar",
            "uid": f"pod-{index}",
            "labels": {
                keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
                keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
                keys.LABEL_JOB_NAME: "foo",
            },
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND,
                    "name": "foo",
                    "uid": owner,
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running", **status},
    }


def known(
    rt: Runtime, kube: FakeKube, index: str, *objs: dict[str, Any], key: Any = ("bar", "foo")
) -> None:
    """Objects of job bar/foo in the API and, as the watch delivered them, in ``index``."""
    kube.add(*objs)
    rt.cache.indices[index] = {key: list(objs)}


def deletes(kube: FakeKube) -> list[str]:
    return [f"{a[1]}/{a[3]}" for verb, a in kube.requests if verb == "delete"]


async def test_a_recreated_job_releases_its_predecessor_s_decision_once_its_pods_are_gone() -> None:
    """Deleted and created again at once: the earlier job's decision is never released by a
    sync of the deleted job (there is none), so the successor's sync releases it."""
    rt, kube, _ = topology_runtime(gpu_job())
    known(rt, kube, "decisions_by_job", decision_body("uid-old", "n0"))
    known(rt, kube, Index.PODS, worker_pod(0, "n0", "uid-old"), key=PODS_OF_FOO)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert "PlacementDecision/foo" not in deletes(kube)  # its pod still holds the GPUs
    rt.cache.indices[Index.PODS] = {PODS_OF_FOO: []}
    kube.remove("Pod", "bar", "foo-worker-0")
    kube.requests.clear()
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert deletes(kube) == ["PlacementDecision/foo"]
    assert not kube.created()  # it waits for its own admission


async def test_a_deleted_node_under_a_placed_job_releases_it_and_says_why() -> None:
    rt, kube, recorder = topology_runtime(gpu_job())
    known(rt, kube, "decisions_by_job", decision_body("uid-foo", "n0", "n1"))
    pods = worker_pod(0, "n0", "uid-foo"), worker_pod(1, "n1", "uid-foo")
    known(rt, kube, Index.PODS, *pods, key=PODS_OF_FOO)
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY}
    rt.cache.indices["nodes_by_name"] = {
        "n0": [{"metadata": {"name": "n0", "labels": labels}, "spec": {}, **ready}]
    }
    await reconcile.reconcile(rt, ("bar", "foo"))  # the API has no node n1
    assert deletes(kube) == ["Pod/foo-worker-0", "Pod/foo-worker-1", "PlacementDecision/foo"]
    graces = [c.kwargs["grace_seconds"] for c in kube.calls if c.verb == "delete"]
    assert graces[:2] == [None, 0]  # the worker on the deleted node goes at once
    [written] = [a[0]["status"] for verb, a in kube.requests if verb == "replace_status"]
    [admitted] = [c for c in written["conditions"] if c["type"] == keys.COND_GANG_ADMITTED]
    assert (admitted["status"], admitted["reason"]) == ("False", keys.REASON_NODE_LOST)
    assert "node n1 was deleted" in admitted["message"]
    assert [(e.type, e.reason) for e in recorder.events] == [("Warning", keys.REASON_NODE_LOST)]


def pool_node(name: str, ready: bool = True, since: datetime = T0) -> dict[str, Any]:
    """An opted-in node as the node index keeps it; ``since``: its Ready condition's last
    transition."""
    condition = {"type": "Ready", "status": str(ready), "lastTransitionTime": format_time(since)}
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"conditions": [condition]},
    }


class Partial(dict[Any, Any]):
    """An informer's index that lost its watch and has not listed again."""

    complete = False


@virtual_time
async def test_a_worker_gone_from_a_node_not_ready_is_made_again_placed_anew_past_grace() -> None:
    """Within the grace the missing worker is only created again, on its node; the job is
    synced again when the grace ends, and placed anew then: its node is still not Ready and
    the worker made again waits there, unbound."""
    loop = asyncio.get_running_loop()
    rt, kube, recorder = topology_runtime(gpu_job())
    rt.cache.clock = LoopClock(T0)  # the wall clock, virtual
    known(rt, kube, "decisions_by_job", decision_body("uid-foo", "n0", "n1"))
    known(rt, kube, Index.PODS, worker_pod(0, "n0", "uid-foo"), key=PODS_OF_FOO)
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False)}
    rt.cache.indices["nodes_by_name"] = {name: [node] for name, node in nodes.items()}
    rt.cache.saw_node("n1", False)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert deletes(kube) == []
    assert "Pod/foo-worker-1" in kube.created()
    waiting = worker_pod(1, "", "uid-foo", phase="Pending")
    known(rt, kube, Index.PODS, worker_pod(0, "n0", "uid-foo"), waiting, key=PODS_OF_FOO)
    kube.requests.clear()

    assert await rt.workers.queue.get() == ("bar", "foo")
    assert loop.time() == pytest.approx(topology.NODE_LOST_GRACE_SECONDS + 0.5)
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert deletes(kube) == ["Pod/foo-worker-0", "Pod/foo-worker-1", "PlacementDecision/foo"]
    assert [(e.type, e.reason) for e in recorder.events][-1:] == [
        ("Warning", keys.REASON_NODE_LOST)
    ]


@virtual_time
async def test_a_deleted_node_is_not_acted_on_before_the_caches_list_again() -> None:
    """After a lost watch the caches may lack what was sent meanwhile: the job is looked at
    again a second later, and placed anew once they have listed again."""
    loop = asyncio.get_running_loop()
    rt, kube, _ = topology_runtime(gpu_job())
    known(rt, kube, "decisions_by_job", decision_body("uid-foo", "n0", "n1"))
    pods = worker_pod(0, "n0", "uid-foo"), worker_pod(1, "n1", "uid-foo")
    kube.add(*pods)
    rt.cache.indices[Index.PODS] = Partial({PODS_OF_FOO: list(pods)})
    rt.cache.indices["nodes_by_name"] = {"n0": [pool_node("n0")]}  # n1 is gone from the API
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert deletes(kube) == []
    assert await rt.workers.queue.get() == ("bar", "foo")
    assert loop.time() == pytest.approx(gate.CATCH_UP_SECONDS)
    rt.cache.indices[Index.PODS] = {PODS_OF_FOO: list(pods)}  # listed again
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert deletes(kube) == ["Pod/foo-worker-0", "Pod/foo-worker-1", "PlacementDecision/foo"]


async def test_a_job_deleted_during_its_sync_ends_the_sync_quietly_not_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cache still holds the job when the API has deleted it: the status write's 404 ends
    the sync (no exception to retry on, no warning, no Event); the deletion's event follows."""
    rt, kube, recorder = runtime(valid_job())
    kube.remove("MPIJob", "bar", "foo")
    await reconcile.reconcile(rt, ("bar", "foo"))
    assert any(verb == "replace_status" for verb, _ in kube.requests)
    assert recorder.events == []
    assert "WARNING" not in caplog.text


# --- a job's life, whatever its status says ------------------------------------------------------

LIFE_COUNTERS = (
    "mpi_operator_jobs_created_total",
    "mpi_operator_jobs_successful_total",
    "mpi_operator_jobs_failed_total",
)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counters() -> dict[str, float]:
    return {name: sample(name) for name in LIFE_COUNTERS}


async def synced(rt: Runtime, kube: FakeKube) -> None:
    """One sync of bar/foo, and the watch event of what it wrote to the job in the cache."""
    await reconcile.reconcile(rt, ("bar", "foo"))
    rt.cache.indices["mpijobs_by_key"][("bar", "foo")] = kube.stored("MPIJob", "bar")


async def finished_job(body: dict[str, Any]) -> tuple[Runtime, FakeKube, RecordingRecorder]:
    """Job bar/foo created, run and succeeded, as one process saw it (every sync it asked
    for run)."""
    rt, kube, recorder = runtime(body)
    await synced(rt, kube)
    index_created(rt, kube)
    launcher = rt.cache.indices["launchers_by_job"][("bar", "foo")][0]
    launcher["metadata"]["uid"] = "uid-launcher"
    launcher["status"] = {
        "conditions": [{"type": "Complete", "status": "True"}],
        "succeeded": 1,
        "completionTime": "2024-05-01T10:05:00Z",
    }
    await synced(rt, kube)
    await synced(rt, kube)  # the one the end queued
    return rt, kube, recorder


def rewritten_by_tenant(rt: Runtime, kube: FakeKube) -> None:
    """The tenant clears its job's conditions and completionTime (``mpijobs/status``): the
    cache gets the new version from the watch."""
    [body] = kube.stored("MPIJob", "bar")
    body["status"] = {
        k: v for k, v in body["status"].items() if k not in ("conditions", "completionTime")
    }
    body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    kube.add(body)
    rt.cache.indices["mpijobs_by_key"][("bar", "foo")] = kube.stored("MPIJob", "bar")


@pytest.mark.parametrize("policy", ["None", "Running"])
async def test_ten_status_rewrites_of_a_finished_job_cost_one_write_each_and_count_nothing(
    policy: str,
) -> None:
    body = valid_job()
    body["spec"]["runPolicy"] = {"cleanPodPolicy": policy}
    before = counters()
    rt, kube, recorder = await finished_job(body)
    assert {k: v - before[k] for k, v in counters().items()} == {
        "mpi_operator_jobs_created_total": 1,
        "mpi_operator_jobs_successful_total": 1,
        "mpi_operator_jobs_failed_total": 0,
    }
    life = [e.reason for e in recorder.events if e.reason != keys.REASON_RUNNING]
    assert life[:2] == [keys.REASON_CREATED, keys.REASON_SUCCEEDED]
    done, posted = counters(), len(recorder.events)
    for _ in range(10):
        rewritten_by_tenant(rt, kube)
        kube.requests.clear()
        await synced(rt, kube)
        await synced(rt, kube)  # the one the end queues
        assert [verb for verb, _ in kube.requests] == ["replace_status"]
        [written] = [args[0]["status"] for _, args in kube.requests]
        ended = {(c["type"], c["status"]) for c in written["conditions"]}
        assert {("Created", "True"), ("Succeeded", "True")} <= ended
        assert written["completionTime"] == "2024-05-01T10:05:00Z"
    assert counters() == done
    assert recorder.events[posted:] == []


async def test_a_new_process_counts_nothing_of_a_job_that_finished_before_it() -> None:
    rt, kube, _ = await finished_job(valid_job())
    recorder = RecordingRecorder()
    restarted = Runtime(
        settings=OperatorSettings(),
        kube=kube,
        recorder=recorder,  # type: ignore[arg-type]
        deferred=DeferredPatches(kube),
        workers=Workers(threadiness=1),
    )
    restarted.cache.indices = copy.deepcopy(rt.cache.indices)
    before = counters()
    await synced(restarted, kube)
    rewritten_by_tenant(restarted, kube)
    await synced(restarted, kube)
    assert counters() == before
    assert recorder.events == []


async def test_a_worker_oom_killed_while_its_job_runs_is_named_once_and_counted_once() -> None:
    body = valid_job()
    body["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    rt, kube, recorder = runtime(body)
    await reconcile.reconcile(rt, ("bar", "foo"))
    index_created(rt, kube)
    pods = rt.cache.indices[Index.PODS][PODS_OF_FOO]
    for p in pods:
        p["status"] = {"phase": "Running"}
    await reconcile.reconcile(rt, ("bar", "foo"))
    killed = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2024-05-01T10:02:00Z"}
    pods[0]["status"]["containerStatuses"] = [
        {"name": "c", "state": {"running": {}}, "lastState": {"terminated": killed}}
    ]
    before = sample("mpi_operator_job_failures_total", reason="OOMKilled")
    posted = len(recorder.events)
    for _ in range(3):
        await reconcile.reconcile(rt, ("bar", "foo"))
    warnings = [(e.type, e.message) for e in recorder.events[posted:] if e.reason == "WorkerFailed"]
    assert warnings == [
        (
            "Warning",
            "worker pod foo-worker-0 container c OOMKilled (exit code 137) while the job runs; "
            "the kubelet restarts the container (restartPolicy OnFailure)",
        )
    ]
    assert sample("mpi_operator_job_failures_total", reason="OOMKilled") == before + 1


class CheckingRecorder(RecordingRecorder):
    """Also keeps what each job's check of lost Events was given."""

    def __init__(self) -> None:
        super().__init__()
        self.checked: list[Event] = []

    def ensure(self, obj: dict[str, Any], implied: Any) -> None:
        self.checked += [i.event for i in implied()]


async def test_a_kill_before_the_first_status_write_leaves_the_created_event_to_the_check() -> None:
    """The process that made the job's children was killed before it wrote the status: the
    next one counts nothing and posts no Created Event as new, but hands it to the check of
    lost Events, which posts it if the API lacks it (the recorder's tests)."""
    first, kube, _ = runtime(valid_job())
    await reconcile.reconcile(first, ("bar", "foo"))
    index_created(first, kube)
    recorder = CheckingRecorder()
    restarted = Runtime(
        settings=OperatorSettings(),
        kube=kube,
        recorder=recorder,  # type: ignore[arg-type]
        deferred=DeferredPatches(kube),
        workers=Workers(threadiness=1),
    )
    restarted.cache.indices = copy.deepcopy(first.cache.indices)
    restarted.cache.indices["mpijobs_by_key"][("bar", "foo")] = [valid_job()]  # no status
    before = counters()
    kube.requests.clear()
    await reconcile.reconcile(restarted, ("bar", "foo"))
    [written] = [a[0]["status"] for verb, a in kube.requests if verb == "replace_status"]
    assert ("Created", "True") in {(c["type"], c["status"]) for c in written["conditions"]}
    assert counters() == before
    assert recorder.events == []
    assert [e.reason for e in recorder.checked] == [keys.REASON_CREATED]
