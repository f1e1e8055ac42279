"""An admission pass's pure decision: from a snapshot to a decision per job, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import decide, queue, quota, topology
from mpijob.placement import codec, topologies
from mpijob.placement.job import Placement, WorkerAssignment

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 1, tzinfo=UTC)
PLACER = decide.Placer(inter_node_gbps=25.0)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY, **labels},
            "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.dgx1_v100())},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def job(name: str, gpus: int, *, minute: int = 0, namespace: str = "ns", **pod: Any) -> Any:
    template = {
        "spec": {
            "containers": [
                {"name": "c", "image": "mpi", "resources": {"limits": {keys.GPU_RESOURCE: gpus}}}
            ],
            **pod,
        }
    }
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": f"2026-01-01T00:{minute:02d}:00Z",
            "annotations": {keys.GPU_TOPOLOGY: "true"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template},
                "Worker": {"replicas": 1, "template": template},
            }
        },
    }
    return api.with_defaults(api.parse(body))


def run(
    jobs: list[Any],
    nodes: list[dict[str, Any]],
    decisions: dict[Any, topology.Decision] | None = None,
    quotas: dict[str, list[dict[str, Any]]] | None = None,
) -> decide.Outcome:
    decisions = decisions or {}
    snap = topology.Snapshot(nodes, [], decisions, quotas=quotas or {})
    held_in = decide.held_in(snap, decisions, {j.namespace for j in jobs}, lambda *_: None)
    return decide.decide(
        PLACER,
        snap,
        nodes,
        decisions,
        jobs,
        priority_values={},
        held_in=held_in,
        where={},
        binding=GpuBinding.ANNOTATIONS,
        now=NOW,
    )


def by_name(outcome: decide.Outcome) -> dict[str, queue.Decision[Placement]]:
    return {d.job.name: d for d in outcome.decisions}


def test_jobs_are_admitted_on_the_gpus_left_and_the_rest_wait() -> None:
    first, second = job("first", 6, minute=1), job("second", 4, minute=2)
    out = by_name(run([first, second], [node("dgx-0")]))
    assert isinstance(out["first"], queue.Admit)
    assert {a.node for a in out["first"].placement.assignments} == {"dgx-0"}
    assert isinstance(out["second"], queue.Wait), "8 GPUs: 6 taken, 4 do not fit in 2"


def test_gpus_held_by_a_decision_are_not_handed_out_again() -> None:
    held = topology.Decision("uid-old", (WorkerAssignment("dgx-0", (0, 1, 2, 3, 4, 5)),), 1.0)
    out = by_name(run([job("new", 4)], [node("dgx-0")], {("ns", "old"): held}))
    assert isinstance(out["new"], queue.Wait)
    out = by_name(run([job("new", 2)], [node("dgx-0")], {("ns", "old"): held}))
    assert isinstance(out["new"], queue.Admit)
    assert set(out["new"].placement.assignments[0].gpus) == {6, 7}


def test_a_job_goes_only_to_the_nodes_its_template_selects() -> None:
    nodes = [node("a", pool="x"), node("b", pool="y")]
    out = by_name(run([job("picky", 2, nodeSelector={"pool": "y"})], nodes))
    assert isinstance(out["picky"], queue.Admit)
    assert out["picky"].placement.assignments[0].node == "b"
    out = by_name(run([job("nowhere", 2, nodeSelector={"pool": "z"})], nodes))
    assert isinstance(out["nowhere"], queue.Wait)
    assert out["nowhere"].message.startswith(decide.NO_ELIGIBLE_NODE)


def test_a_quota_counts_this_passs_admissions_and_names_itself() -> None:
    limit = {
        "metadata": {"name": "gpus", "namespace": "ns"},
        "spec": {"hard": {keys.QUOTA_GPU_REQUESTS: "4"}},
        "status": {
            "hard": {keys.QUOTA_GPU_REQUESTS: "4"},
            "used": {keys.QUOTA_GPU_REQUESTS: "0"},
        },
    }
    assert quota.limits_of(limit), "the quota limits GPUs"
    jobs = [job("a", 2, minute=1), job("b", 2, minute=2), job("c", 2, minute=3)]
    out = by_name(run(jobs, [node("dgx-0")], quotas={"ns": [limit]}))
    assert isinstance(out["a"], queue.Admit)
    # Each job is a launcher and a worker of 2 GPUs: a takes the quota's 4.
    for name in ("b", "c"):
        wait = out[name]
        assert isinstance(wait, queue.Wait)
        assert wait.over_quota
        assert "gpus" in wait.message


def test_the_decision_is_the_same_for_the_same_snapshot() -> None:
    jobs = [job("a", 4, minute=1), job("b", 4, minute=2), job("c", 2, minute=3)]
    nodes = [node("dgx-0"), node("dgx-1")]
    one, two = run(jobs, nodes), run(jobs, nodes)
    assert [(d.job.name, type(d)) for d in one.decisions] == [
        (d.job.name, type(d)) for d in two.decisions
    ]
    assert one.domains == {} == two.domains, "no fabric, no ComputeDomain"
