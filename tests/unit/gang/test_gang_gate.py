"""Where a job stands with gang admission, as its reconcile plans it: reads in, actions out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired import sync
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import gate, queue, topology
from mpijob.placement import codec, topologies
from mpijob.placement.job import Placement, WorkerAssignment

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, tzinfo=UTC)
KEY = ("ns", "train")
NODE = {
    "metadata": {
        "name": "dgx-0",
        "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
        "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.dgx1_v100())},
    },
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def job(*, suspended: bool = False, status: dict[str, Any] | None = None) -> api.MPIJob:
    template = {
        "spec": {
            "containers": [
                {"name": "c", "image": "mpi", "resources": {"limits": {keys.GPU_RESOURCE: 2}}}
            ]
        }
    }
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "uid": "uid-train",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {keys.GPU_TOPOLOGY: "true"},
        },
        "spec": {
            "runPolicy": {"suspend": suspended},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template},
                "Worker": {"replicas": 1, "template": template},
            },
        },
        "status": status or {},
    }
    return api.with_defaults(api.parse(body))


def decision_body(j: api.MPIJob) -> dict[str, Any]:
    placement = Placement((WorkerAssignment("dgx-0", (0, 1)),), 100.0, "by hand")
    body = topology.decision_object(j, placement)
    body["metadata"]["uid"] = "decision-uid"
    return body


def pod(name: str, role: str, node: str = "dgx-0") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": {keys.LABEL_JOB_ROLE: role},
            "ownerReferences": [{"uid": "uid-train", "controller": True}],
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def run(j: api.MPIJob, standing: gate.Standing | None, body: Any = None) -> gate.Gate:
    return gate.gate(
        KEY,
        j,
        topology_default=False,
        release_seconds=60.0,
        decision_body=body,
        pods=[],
        nodes={"dgx-0": NODE},
        standing=standing,
        now=NOW,
    )


def test_without_our_admission_a_job_is_admitted_and_keeps_its_line() -> None:
    g = run(job(), None)
    assert g.admitted
    assert g.placement is None
    assert g.line is gate.Line.KEEP


def test_a_job_without_a_decision_waits_in_the_line_and_says_so() -> None:
    g = run(job(), gate.Standing())
    assert not g.admitted
    assert g.line is gate.Line.WANT
    assert g.outcome is not None
    assert g.release is None


def test_a_decided_job_leaves_the_line_with_its_workers_placed() -> None:
    j = job()
    g = run(j, gate.Standing(), decision_body(j))
    assert g.admitted
    assert g.line is gate.Line.DROP
    assert g.decision is not None
    assert g.placement is not None
    assert [p.node for p in g.placement] == ["dgx-0"]


def test_an_admission_on_its_way_keeps_the_job_where_it_is() -> None:
    g = run(job(), gate.Standing(pending=True))
    assert not g.admitted
    assert g.line is gate.Line.KEEP
    assert g.outcome is None


def test_a_suspended_job_leaves_the_line_and_its_decision_goes_with_its_pods() -> None:
    j = job(suspended=True)
    g = run(j, gate.Standing(), decision_body(j))
    assert not g.admitted
    assert g.line is gate.Line.DROP
    assert g.release == sync.Delete(
        keys.DECISION_API_VERSION, keys.DECISION_KIND, "train", "decision-uid"
    )


def released_record(j: api.MPIJob, seconds_ago: float) -> dict[str, Any]:
    """The job's decision as a release for unschedulable workers left it ``seconds_ago``."""
    body = decision_body(j)
    body["metadata"]["resourceVersion"] = "7"
    at = NOW - timedelta(seconds=seconds_ago)
    return topology.released_object(body, keys.REASON_WORKERS_UNSCHEDULABLE, "stuck", at)


def test_a_released_job_is_held_off_and_synced_when_the_hold_off_ends() -> None:
    j = job()
    g = run(j, gate.Standing(), released_record(j, 20))
    assert g.line is gate.Line.DROP
    assert not g.admitted
    assert g.recheck == pytest.approx(40.5)
    assert g.release is None, "the record stays while the job lives"
    after = run(j, gate.Standing(), released_record(j, 61))
    assert after.line is gate.Line.WANT


def test_the_hold_off_is_the_records_whatever_the_status_says() -> None:
    """The status is the tenant's to write: a cleared condition does not end the hold-off, and
    a forged one starts none."""
    j = job(status={"conditions": []})
    assert run(j, gate.Standing(), released_record(j, 20)).line is gate.Line.DROP
    since = (NOW - timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    forged = {
        "type": keys.COND_GANG_ADMITTED,
        "status": "False",
        "reason": keys.REASON_WORKERS_UNSCHEDULABLE,
        "message": "stuck",
        "lastTransitionTime": since,
        "lastUpdateTime": since,
    }
    assert run(job(status={"conditions": [forged]}), gate.Standing()).line is gate.Line.WANT


def test_a_record_of_an_earlier_job_of_the_name_holds_no_one_off() -> None:
    j = job()
    record = released_record(j, 20)
    record["spec"]["job"]["uid"] = "uid-earlier"
    g = run(j, gate.Standing(), record)
    assert g.line is gate.Line.WANT
    assert g.release is not None, "it goes: its job is gone and no pod of it is left"


def test_a_status_saying_finished_never_lets_a_waiting_job_have_pods() -> None:
    """Succeeded written by the tenant, without a completion time: the job leaves the line, and
    is not admitted (its workers would otherwise be created unplaced, past the line)."""
    since = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    forged = {
        "type": keys.COND_SUCCEEDED,
        "status": "True",
        "reason": "MPIJobSucceeded",
        "lastTransitionTime": since,
    }
    g = run(job(status={"conditions": [forged]}), gate.Standing())
    assert not g.admitted
    assert g.placement is None
    assert g.line is gate.Line.DROP


def test_a_status_saying_finished_does_not_delete_the_record_of_a_hold_off() -> None:
    """Else a tenant could end the hold-off: Succeeded written, the record deleted, Succeeded
    taken back, and the job placed again at once."""
    since = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    forged = {"type": keys.COND_SUCCEEDED, "status": "True", "lastTransitionTime": since}
    j = job(status={"conditions": [forged]})
    assert run(j, gate.Standing(), released_record(j, 20)).release is None
    assert gate.release(KEY, None, released_record(j, 20), []) is not None, "gone with the job"


def test_workers_refused_keep_the_decision_as_the_record_of_the_hold_off() -> None:
    j = job()
    body = decision_body(j)
    body["metadata"]["resourceVersion"] = "7"
    pods = [pod("train-worker-0", keys.ROLE_WORKER)]
    plan = gate.place_anew(j, pods, {}, body, "refused", keys.REASON_WORKERS_REFUSED, NOW)
    assert isinstance(plan.release, sync.Replace)
    record = plan.release.obj
    assert record["metadata"]["resourceVersion"] == "7"
    assert record["spec"]["workers"] == []
    parsed = topology.parse_decision(record)
    assert parsed is not None
    assert parsed.released is not None
    assert parsed.released.reason == keys.REASON_WORKERS_REFUSED
    assert parsed.released.at == NOW
    assert topology.load_decision(j, record) is None, "it holds no GPUs: the job has none"
    held = topology.holdings({KEY: parsed}, [])
    assert held.known == {}


def test_a_timed_out_job_shows_it_and_is_not_queued_again() -> None:
    j = job()
    timed_out = queue.TimedOut(queue.waiting_job(j, priority_values={}), "too long")
    g = run(j, gate.Standing(last=timed_out))
    assert g.line is gate.Line.KEEP
    assert g.outcome is not None


def test_giving_a_placement_back_deletes_workers_and_claims_then_the_decision() -> None:
    j = job()
    pods = [pod("train-launcher", keys.ROLE_LAUNCHER), pod("train-worker-0", keys.ROLE_WORKER)]
    claims = {"train-worker-0-gpus": {"metadata": {"uid": "claim-uid"}}}
    plan = gate.place_anew(
        j, pods, claims, decision_body(j), "node lost", keys.REASON_NODE_LOST, NOW, {"dgx-0"}
    )
    assert plan.actions == [
        sync.Delete("v1", "Pod", "train-worker-0", "uid-train-worker-0", grace_seconds=0),
        sync.Delete(keys.DRA_API_VERSION, "ResourceClaim", "train-worker-0-gpus", "claim-uid"),
    ], "the launcher stays; a worker on a deleted node goes at once"
    assert plan.status is not None
    condition = plan.status.condition(keys.COND_GANG_ADMITTED)
    assert condition is not None
    assert condition.reason == keys.REASON_NODE_LOST
    assert plan.release == sync.Delete(
        keys.DECISION_API_VERSION, keys.DECISION_KIND, "train", "decision-uid"
    )
    assert plan.event is not None
    assert plan.event.message == "node lost"


def test_without_a_decision_only_the_workers_go() -> None:
    plan = gate.place_anew(
        job(), [pod("train-worker-0", keys.ROLE_WORKER)], {}, None, "x", "R", NOW
    )
    assert plan.actions == [sync.Delete("v1", "Pod", "train-worker-0", "uid-train-worker-0")]
    assert plan.release is None
    assert plan.event is None


def test_a_deleted_node_under_a_placed_job_gives_the_placement_back() -> None:
    j = job()
    g = run(j, gate.Standing(), decision_body(j))
    pods = [pod("train-worker-0", keys.ROLE_WORKER)]
    held = gate.check_placement(
        KEY, j, g, pods, {}, {"dgx-0": NODE}, GpuBinding.ANNOTATIONS, 60, NOW
    )
    assert not held.why
    lost = gate.check_placement(
        KEY, j, g, pods, {}, {"dgx-0": None}, GpuBinding.ANNOTATIONS, 60, NOW
    )
    assert lost.reason == keys.REASON_NODE_LOST
    assert lost.gone == {"dgx-0"}


def not_ready(seconds: float) -> dict[str, Any]:
    """:data:`NODE`, not Ready for ``seconds`` at :data:`NOW`."""
    since = (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "False", "lastTransitionTime": since}
    return {**NODE, "status": {"conditions": [condition]}}


def test_on_a_view_that_may_lack_events_nothing_is_given_back_and_is_looked_at_soon() -> None:
    """An informer lost its watch and has not listed again: a node that looks deleted, or a
    worker that looks gone, may only not have been heard of yet."""
    j = job()
    g = run(j, gate.Standing(), decision_body(j))
    pods = [pod("train-worker-0", keys.ROLE_WORKER)]
    nodes = {"dgx-0": None}
    held = gate.check_placement(
        KEY, j, g, pods, {}, nodes, GpuBinding.ANNOTATIONS, 60, NOW, complete=False
    )
    assert (held.reason, held.why, held.gone) == ("", "", frozenset())
    assert held.withheld.startswith("node dgx-0 was deleted")
    assert held.rechecks == [gate.CATCH_UP_SECONDS]
    # Listed again: the node is gone for good, and the placement given back at once.
    lost = gate.check_placement(KEY, j, g, pods, {}, nodes, GpuBinding.ANNOTATIONS, 60, NOW)
    assert (lost.reason, lost.withheld) == (keys.REASON_NODE_LOST, "")


def test_a_worker_gone_from_a_node_not_ready_within_its_grace_is_looked_at_when_it_ends() -> None:
    j = job()
    g = run(j, gate.Standing(), decision_body(j))
    grace = topology.NODE_LOST_GRACE_SECONDS
    within = gate.check_placement(
        KEY, j, g, [], {}, {"dgx-0": not_ready(grace - 20)}, GpuBinding.ANNOTATIONS, 600, NOW
    )
    assert (within.why, within.rechecks) == ("", [20.5])
    past = gate.check_placement(
        KEY, j, g, [], {}, {"dgx-0": not_ready(grace)}, GpuBinding.ANNOTATIONS, 600, NOW
    )
    assert past.reason == keys.REASON_NODE_LOST
    disrupted = topology.PoolHealth(disrupted=True)
    held = gate.check_placement(
        KEY, j, g, [], {}, {"dgx-0": not_ready(grace)}, GpuBinding.ANNOTATIONS, 600, NOW, disrupted
    )
    assert (held.why, held.rechecks) == ("", [topology.DISRUPTED_RECHECK_SECONDS + 0.5])


def test_only_a_worker_the_api_server_refuses_for_good_counts_as_refused() -> None:
    worker = sync.Create({"kind": "Pod", **pod("train-worker-0", keys.ROLE_WORKER)})
    launcher = sync.Create({"kind": "Pod", **pod("train-launcher", keys.ROLE_LAUNCHER)})
    assert gate.refused_worker(worker, 403) == "train-worker-0"
    assert gate.refused_worker(worker, 422) == "train-worker-0"
    assert gate.refused_worker(worker, 409) == ""
    assert gate.refused_worker(launcher, 403) == ""
