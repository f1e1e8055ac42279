"""Our admission's passes against the caches' snapshot: the line is rebuilt from live jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import outcome, queue, topology
from mpijob.gang.service import GRANT_SECONDS, Admission, NotRecorded, store_decision
from mpijob.handlers import reconcile
from mpijob.handlers.cache import Cache
from mpijob.placement import codec, topologies
from mpijob.placement.job import Placement, WorkerAssignment
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import ApiError
from mpijob.settings import OperatorSettings
from support import jobs
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock

pytestmark = pytest.mark.unit

NODE = {
    "metadata": {
        "name": "dgx-0",
        "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
        "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.dgx1_v100())},
    },
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def topology_job(
    name: str, created: str, gpus: int, uid: str | None = None, **spec: Any
) -> api.MPIJob:
    template = jobs.gpu_template(gpus)
    metadata = {"creationTimestamp": created, "annotations": {keys.GPU_TOPOLOGY: "true"}}
    return jobs.parsed(
        jobs.body(
            name,
            "ns",
            uid=uid,
            launcher=template,
            worker=template,
            workers=1,
            metadata=metadata,
            **spec,
        )
    )


def labelled(name: str, **labels: str) -> dict[str, Any]:
    meta = NODE["metadata"]
    return {**NODE, "metadata": {**meta, "name": name, "labels": {**meta["labels"], **labels}}}


def decision_body(job: api.MPIJob, node: str, gpus: list[int]) -> dict[str, Any]:
    """A PlacementDecision as the watch delivers it."""
    placement = Placement((WorkerAssignment(node, tuple(gpus)),), 100.0, "by hand")
    return topology.decision_object(job, placement)


class Harness:
    def __init__(
        self, *jobs: api.MPIJob, nodes: list[dict[str, Any]] | None = None, clock: Clock = SYSTEM
    ) -> None:
        self.jobs = list(jobs)
        self.decisions: dict[tuple[str, str], dict[str, Any]] = {}
        """What the decision index holds."""
        self.written: list[tuple[str, str]] = []
        self.enqueued: list[tuple[str, str]] = []
        self.admission = Admission(
            write_decision=self.write,
            enqueue=self.enqueued.append,
            snapshot=lambda: topology.Snapshot(nodes or [NODE], [], self.parsed()),
            live=self.live,
            decision_of=self.decisions.get,
            priority_values=dict,
            create_object=self.write,
            get_object=self.read,
            inter_node_gbps=25.0,
            clock=clock,
        )

    async def read(self, *_: str) -> None:
        """No object but decisions is ever read back in these tests."""

    def parsed(self) -> dict[tuple[str, str], topology.Decision]:
        out = {k: topology.parse_decision(b) for k, b in self.decisions.items()}
        return {k: d for k, d in out.items() if d is not None}

    def live(self, key: tuple[str, str]) -> api.MPIJob | None:
        return next((j for j in self.jobs if (j.namespace, j.name) == key), None)

    async def write(self, obj: dict[str, Any]) -> None:
        self.written.append((obj["metadata"]["namespace"], obj["metadata"]["name"]))


async def test_a_deleted_head_of_line_leaves_and_the_job_behind_it_is_admitted() -> None:
    holder = topology_job("holder", "2026-01-01T00:00:00Z", 4)
    head = topology_job("head", "2026-01-01T00:01:00Z", 8)
    behind = topology_job("behind", "2026-01-01T00:02:00Z", 2)
    h = Harness(holder, head, behind)
    h.decisions[("ns", "holder")] = decision_body(holder, "dgx-0", [0, 1, 2, 3])
    h.admission.want(("ns", "head"), head)
    h.admission.want(("ns", "behind"), behind)
    await h.admission.run_pass()
    last = h.admission.decision(("ns", "behind"))
    assert isinstance(last, queue.Wait)
    assert "queued behind ns/head" in last.message
    assert h.written == []
    assert set(h.admission.waiting) == {("ns", "head"), ("ns", "behind")}
    h.enqueued.clear()
    await h.admission.run_pass()
    assert h.enqueued == [], "nothing changed: a second pass re-queues no one"

    h.jobs.remove(head)  # deleted while it waited
    await h.admission.run_pass()
    assert ("ns", "head") not in h.admission.waiting
    assert h.written == [("ns", "behind")]


@pytest.mark.parametrize("change", ["suspended", "recreated"])
async def test_a_suspended_or_recreated_waiting_job_leaves_the_line(change: str) -> None:
    head = topology_job("head", "2026-01-01T00:01:00Z", 16)  # never fits one 8-GPU node
    h = Harness(head)
    h.admission.want(("ns", "head"), head)
    if change == "suspended":
        h.jobs = [topology_job("head", "2026-01-01T00:01:00Z", 16, runPolicy={"suspend": True})]
    else:
        again = topology_job("head", "2026-01-01T00:03:00Z", 16)
        again.metadata.uid = "uid-head-2"
        h.jobs = [again]
    await h.admission.run_pass()
    assert h.admission.waiting == {}
    assert ("ns", "head") in h.enqueued


async def test_a_pass_before_the_watch_delivers_an_admission_does_not_hand_its_gpus_out() -> None:
    """Two passes, the cache still without the first job's decision: the second job waits."""
    first = topology_job("first", "2026-01-01T00:01:00Z", 8)
    second = topology_job("second", "2026-01-01T00:02:00Z", 8)
    h = Harness(first, second)
    h.admission.want(("ns", "first"), first)
    await h.admission.run_pass()
    assert h.written == [("ns", "first")]
    assert h.admission.pending(("ns", "first"))

    h.admission.want(("ns", "second"), second)  # arrived while the first pass wrote
    await h.admission.run_pass()
    assert h.written == [("ns", "first")], "the second job got GPUs the first already holds"
    assert isinstance(h.admission.decision(("ns", "second")), queue.Wait)

    # The watch catches up: the cache is the truth again.
    h.decisions[("ns", "first")] = decision_body(first, "dgx-0", list(range(8)))
    await h.admission.run_pass()
    assert h.admission.granted == {}
    assert h.written == [("ns", "first")]


async def test_an_admission_the_watch_never_delivers_lapses_after_its_time_and_not_before() -> None:
    """A decision written but never seen in the cache (removed by hand, a watch that never
    delivered) holds its GPUs for ``GRANT_SECONDS``, then no more."""
    clock = FakeClock()
    first = topology_job("first", "2026-01-01T00:01:00Z", 8)
    second = topology_job("second", "2026-01-01T00:02:00Z", 8)
    h = Harness(first, second, clock=clock)
    h.admission.want(("ns", "first"), first)
    await h.admission.run_pass()
    h.admission.want(("ns", "second"), second)
    clock.advance(GRANT_SECONDS)
    await h.admission.run_pass()
    assert h.admission.pending(("ns", "first"))
    assert h.written == [("ns", "first")], "the GPUs of an admission still in time were reused"
    clock.advance(0.001)
    assert not h.admission.pending(("ns", "first"))
    await h.admission.run_pass()
    assert h.written == [("ns", "first"), ("ns", "second")]


async def test_a_job_that_cannot_fit_times_out_at_its_deadline_on_the_admissions_clock() -> None:
    """``scheduleTimeoutSeconds`` is counted from the job's creation to the wall clock the
    admission reads."""
    created = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    policy = {"schedulingPolicy": {"scheduleTimeoutSeconds": 60}}
    big = topology_job("big", "2026-01-01T00:01:00Z", 16, runPolicy=policy)  # never fits
    clock = FakeClock(wall=created + timedelta(seconds=59))
    h = Harness(big, clock=clock)
    h.admission.want(("ns", "big"), big)
    await h.admission.run_pass()
    assert isinstance(h.admission.decision(("ns", "big")), queue.Wait)
    clock.advance(1)
    await h.admission.run_pass()
    assert isinstance(h.admission.decision(("ns", "big")), queue.TimedOut)
    assert h.admission.waiting == {}


async def test_a_decision_is_created_and_one_left_by_the_same_job_replaced_at_its_version() -> None:
    job = topology_job("a", "2026-01-01T00:01:00Z", 2)
    kube = FakeKube(versions=True)
    await store_decision(kube, decision_body(job, "dgx-0", [0, 1]))
    assert [verb for verb, _ in kube.requests] == ["create"]
    kube.requests.clear()
    scaled = decision_body(job, "dgx-0", [0, 1, 2, 3])  # the same job, scaled since
    await store_decision(kube, scaled)
    assert [verb for verb, _ in kube.requests] == ["create", "get", "replace"]
    [stored] = kube.stored("PlacementDecision", "ns")
    assert stored["spec"] == scaled["spec"]


async def test_a_decision_of_an_earlier_job_of_the_name_is_kept_and_the_job_told_why() -> None:
    earlier = topology_job("a", "2026-01-01T00:01:00Z", 2)
    again = topology_job("a", "2026-01-01T00:05:00Z", 2, uid="uid-a-again")
    kube = FakeKube(decision_body(earlier, "dgx-0", [0, 1]))
    with pytest.raises(NotRecorded, match="of an earlier MPIJob of this name holds its GPUs"):
        await store_decision(kube, decision_body(again, "dgx-0", [2, 3]))
    [stored] = kube.stored("PlacementDecision", "ns")
    assert stored["spec"]["job"]["uid"] == earlier.metadata.uid
    assert [verb for verb, _ in kube.requests] == ["create", "get"]


async def test_a_decision_whose_predecessor_is_being_deleted_is_retried() -> None:
    job = topology_job("a", "2026-01-01T00:01:00Z", 2)
    kube = FakeKube()
    kube.fail("create", ApiError(409, "AlreadyExists", "placementdecisions a already exists"))
    with pytest.raises(NotRecorded, match="being deleted"):
        await store_decision(kube, decision_body(job, "dgx-0", [0, 1]))


async def test_a_failed_decision_write_leaves_the_job_waiting_not_half_admitted() -> None:
    job = topology_job("a", "2026-01-01T00:01:00Z", 2)
    h = Harness(job)

    async def refuse(obj: dict[str, Any]) -> None:
        raise RuntimeError("the API server is down")

    h.admission.write_decision = refuse
    h.admission.want(("ns", "a"), job)
    with pytest.raises(RuntimeError):
        await h.admission.run_pass()
    assert ("ns", "a") in h.admission.waiting
    assert h.admission.decision(("ns", "a")) is None
    assert not h.admission.pending(("ns", "a"))


async def test_a_job_whose_decision_the_api_refuses_says_so_and_the_rest_are_admitted() -> None:
    crowded = topology_job("crowded", "2026-01-01T00:01:00Z", 2)
    other = topology_job("other", "2026-01-01T00:02:00Z", 2)
    h = Harness(crowded, other)
    too_long = "spec.workers: Too many: must have at most 100000 items"

    async def write(obj: dict[str, Any]) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key == ("ns", "crowded"):
            raise ApiError(422, "Invalid", f'PlacementDecision "crowded" is invalid: {too_long}')
        h.written.append(key)

    h.admission.write_decision = write
    h.admission.want(("ns", "crowded"), crowded)
    h.admission.want(("ns", "other"), other)
    await h.admission.run_pass()
    refused = h.admission.decision(("ns", "crowded"))
    assert isinstance(refused, queue.Wait)
    assert refused.refused
    assert too_long in refused.message
    assert not h.admission.pending(("ns", "crowded"))
    assert h.written == [("ns", "other")]

    said = outcome.outcome(refused, now=datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    assert [(c.type, c.status, c.reason) for c in said.conditions] == [
        (keys.COND_GANG_ADMITTED, "False", keys.REASON_DECISION_REFUSED)
    ]
    assert said.event is not None
    assert said.event.type == "Warning"
    assert too_long in said.event.message


async def test_placement_uses_only_the_nodes_the_worker_template_admits() -> None:
    picky = topology_job("picky", "2026-01-01T00:01:00Z", 2)
    assert picky.spec.worker is not None
    picky.spec.worker.template["spec"]["nodeSelector"] = {"pool": "b"}
    nowhere = topology_job("nowhere", "2026-01-01T00:02:00Z", 2)
    assert nowhere.spec.worker is not None
    nowhere.spec.worker.template["spec"]["nodeSelector"] = {"pool": "c"}
    anywhere = topology_job("anywhere", "2026-01-01T00:03:00Z", 2)
    h = Harness(
        picky, nowhere, anywhere, nodes=[labelled("a-0", pool="a"), labelled("b-0", pool="b")]
    )
    for job in (picky, nowhere, anywhere):
        h.admission.want((job.namespace, job.name), job)
    await h.admission.run_pass()

    admitted = h.admission.decision(("ns", "picky"))
    assert isinstance(admitted, queue.Admit)
    assert {a.node for a in admitted.placement.assignments} == {"b-0"}
    refused = h.admission.decision(("ns", "nowhere"))
    assert isinstance(refused, queue.Wait)
    assert "nodeSelector" in refused.message
    assert isinstance(h.admission.decision(("ns", "anywhere")), queue.Admit), "blocks no one"


#: What the operator makes of a job's body, as its composition root gives it to the cache.
CHECK = partial(reconcile.checked, settings=OperatorSettings())


def test_the_cache_parses_a_job_once_per_version() -> None:
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
        "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": {}}}},
    }
    cache = Cache(indices={"mpijobs_by_key": {("ns", "j"): [body]}})
    first = cache.job(("ns", "j"), CHECK)
    assert first is not None
    assert cache.job(("ns", "j"), CHECK) is first
    cache.indices["mpijobs_by_key"][("ns", "j")] = [
        {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}, "spec": {}}
    ]
    second = cache.job(("ns", "j"), CHECK)
    assert second is not first
    assert second is not None
    assert second.spec.mpi_replica_specs is None
    cache.indices["mpijobs_by_key"].clear()
    assert cache.job(("ns", "j"), CHECK) is None
    assert cache.checked == {}


async def test_a_forged_decision_annotation_is_ignored_and_its_gpus_stay_with_their_holder() -> (
    None
):
    """A tenant writes an admission of their own on their MPIJob: placement believes only the
    operator's PlacementDecisions, so the forger waits and the holder keeps its GPUs."""
    holder = topology_job("holder", "2026-01-01T00:00:00Z", 8)
    forger = topology_job("forger", "2026-01-01T00:01:00Z", 8)
    forger.metadata.annotations["mpijob.io/placement-decision"] = (
        '{"v":1,"ring":100,"workers":[["dgx-0",[0,1,2,3,4,5,6,7]]]}'
    )
    h = Harness(holder, forger)
    h.decisions[("ns", "holder")] = decision_body(holder, "dgx-0", list(range(8)))
    h.admission.want(("ns", "forger"), forger)
    await h.admission.run_pass()
    waiting = h.admission.decision(("ns", "forger"))
    assert isinstance(waiting, queue.Wait)
    assert h.written == []


async def test_a_squatting_pod_blocks_no_one_and_a_real_holder_is_named() -> None:
    squatter = {
        "metadata": {"name": "squatter", "namespace": "t", "annotations": {keys.GPU_IDS: "0,1"}},
        "spec": {"nodeName": "dgx-0", "containers": [{"resources": {}}]},
        "status": {"phase": "Running"},
    }
    job = topology_job("j", "2026-01-01T00:01:00Z", 8)
    h = Harness(job)
    h.admission.snapshot = lambda: topology.Snapshot([NODE], [squatter], {})
    h.admission.want(("ns", "j"), job)
    await h.admission.run_pass()
    assert isinstance(h.admission.decision(("ns", "j")), queue.Admit)

    real = {
        **squatter,
        "spec": {
            **squatter["spec"],
            "containers": [{"resources": {"limits": {keys.GPU_RESOURCE: "2"}}}],
        },
    }
    other = topology_job("other", "2026-01-01T00:02:00Z", 8)
    h2 = Harness(other)
    h2.admission.snapshot = lambda: topology.Snapshot([NODE], [real], {})
    h2.admission.want(("ns", "other"), other)
    await h2.admission.run_pass()
    waiting = h2.admission.decision(("ns", "other"))
    assert isinstance(waiting, queue.Wait)
    # Another namespace's pod is counted, never named, in this job's status.
    assert "held by pods this operator did not place: dgx-0: 2 GPU(s) by pods of other " in (
        waiting.message
    )
    assert "squatter" not in waiting.message


def gpu_quota(namespace: str, hard: int, used: int = 0) -> dict[str, Any]:
    """A ResourceQuota on requests.nvidia.com/gpu as the quota index holds it."""
    return {
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {keys.QUOTA_GPU_REQUESTS: str(hard)}},
        "status": {"used": {keys.QUOTA_GPU_REQUESTS: str(used)}},
    }


def with_quotas(h: Harness, binding: GpuBinding, **quotas: dict[str, Any]) -> None:
    h.admission.binding = binding
    h.admission.snapshot = lambda: topology.Snapshot(
        [NODE], [], h.parsed(), quotas={ns: [q] for ns, q in quotas.items()}
    )


@pytest.mark.parametrize("binding", [GpuBinding.DRA, GpuBinding.ANNOTATIONS])
async def test_a_job_over_its_quota_waits_naming_it_and_blocks_no_other_namespace(
    binding: GpuBinding,
) -> None:
    capped = topology_job("capped", "2026-01-01T00:00:00Z", 4)
    other = topology_job("other", "2026-01-01T00:01:00Z", 4)
    other.metadata.namespace = "free"
    h = Harness(capped, other)
    with_quotas(h, binding, ns=gpu_quota("ns", 0))
    h.admission.want(("ns", "capped"), capped)
    h.admission.want(("free", "other"), other)
    await h.admission.run_pass()
    last = h.admission.decision(("ns", "capped"))
    assert isinstance(last, queue.Wait)
    assert last.over_quota
    assert "ResourceQuota gpus in namespace ns allows requests.nvidia.com/gpu: 0" in last.message
    assert h.written == [("free", "other")], "a namespace's quota holds up no one else"


async def test_a_quota_admits_one_job_and_the_second_waits_until_the_first_is_gone() -> None:
    """dra binding: Kubernetes' used stays 0 while claims hold the GPUs; the decisions count.
    Each job asks 8 GPUs for its worker and 8 for its launcher (which keeps nvidia.com/gpu)."""
    first = topology_job("first", "2026-01-01T00:01:00Z", 8)
    second = topology_job("second", "2026-01-01T00:02:00Z", 8)
    h = Harness(first, second)
    with_quotas(h, GpuBinding.DRA, ns=gpu_quota("ns", 16))
    h.admission.want(("ns", "first"), first)
    h.admission.want(("ns", "second"), second)
    await h.admission.run_pass()  # both in one pass: the first's grant counts at once
    assert h.written == [("ns", "first")]
    last = h.admission.decision(("ns", "second"))
    assert isinstance(last, queue.Wait)
    assert last.over_quota
    assert "8 held by this operator's placements" in last.message

    await h.admission.run_pass()  # the first's decision written, not seen yet
    assert h.written == [("ns", "first")]
    h.decisions[("ns", "first")] = decision_body(first, "dgx-0", list(range(8)))
    await h.admission.run_pass()  # seen in the cache
    assert h.written == [("ns", "first")]

    h.jobs.remove(first)
    del h.decisions[("ns", "first")]  # finished: its pods are gone and its decision released
    await h.admission.run_pass()
    assert h.written == [("ns", "first"), ("ns", "second")]


async def test_each_pass_over_waiting_jobs_is_timed_and_an_idle_one_is_not() -> None:
    """mpi_operator_admission_pass_seconds counts the passes that had jobs to consider."""
    from prometheus_client import REGISTRY

    def passes() -> float:
        return REGISTRY.get_sample_value("mpi_operator_admission_pass_seconds_count") or 0.0

    head = topology_job("head", "2026-01-01T00:01:00Z", 16)  # never fits one 8-GPU node
    h = Harness(head)
    before = passes()
    await h.admission.run_pass()
    assert passes() == before, "nothing waited: no pass to time"
    h.admission.want(("ns", "head"), head)
    await h.admission.run_pass()
    await h.admission.run_pass()
    assert passes() == before + 2
    h.jobs = []  # deleted: the line is empty once rebuilt
    await h.admission.run_pass()
    assert passes() == before + 2
