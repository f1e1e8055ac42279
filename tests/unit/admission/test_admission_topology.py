"""Which GPUs placement must not hand out, read from pods as the watches deliver them."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob import api, keys
from mpijob.admission import topology

pytestmark = pytest.mark.unit


def pod(node: str, ids: str, *, phase: str = "Running", terminating: bool = False) -> Any:
    meta: dict[str, Any] = {"name": f"p-{node}-{ids}", "annotations": {keys.GPU_IDS: ids}}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_running_pods_hold_their_gpus() -> None:
    assert topology.used_by_pods([pod("n0", "0,1"), pod("n0", "3"), pod("n1", "2")]) == {
        "n0": {0, 1, 3},
        "n1": {2},
    }


def test_a_terminating_pod_keeps_its_gpus_until_it_is_gone() -> None:
    assert topology.used_by_pods([pod("n0", "4,5", terminating=True)]) == {"n0": {4, 5}}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_frees_its_gpus(phase: str) -> None:
    assert topology.used_by_pods([pod("n0", "0", phase=phase, terminating=True)]) == {}


def test_an_unbound_pod_holds_nothing_yet() -> None:
    unbound = pod("n0", "0")
    unbound["spec"] = {}
    assert topology.used_by_pods([unbound]) == {}


def topology_job(node_name: str = "", *, opted: str = "true") -> Any:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "i", "resources": {"limits": {keys.GPU_RESOURCE: 2}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": "j", "namespace": "ns", "annotations": {keys.GPU_TOPOLOGY: opted}},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [{"name": "l"}]}}},
                "Worker": {"replicas": 2, "template": {"spec": spec}},
            }
        },
    }
    return api.with_defaults(api.parse(body))


def test_a_topology_worker_template_naming_its_node_is_refused_naming_the_field() -> None:
    [error] = topology.template_errors(topology_job("dgx-3"), default=False)
    assert error.path == "spec.mpiReplicaSpecs[Worker].template.spec.nodeName"
    assert error.message.startswith("Forbidden: ")
    assert "remove nodeName" in error.message


def test_node_name_is_the_users_choice_when_the_job_is_not_topology_placed() -> None:
    assert topology.template_errors(topology_job("dgx-3", opted="false"), default=True) == []
    assert topology.template_errors(topology_job(), default=False) == []


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def job_with(worker_spec: dict[str, Any]) -> Any:
    job = topology_job()
    assert job.spec.worker is not None
    job.spec.worker.template["spec"].update(worker_spec)
    return job


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


def test_without_selector_or_affinity_every_node_is_eligible() -> None:
    assert topology.eligible(topology_job(), node("n0"))


def test_node_selector_labels_must_all_match() -> None:
    job = job_with({"nodeSelector": {"pool": "a", "zone": "z1"}})
    assert topology.eligible(job, node("n0", pool="a", zone="z1", extra="x"))
    assert not topology.eligible(job, node("n1", pool="a"))
    assert not topology.eligible(job, node("n2", pool="b", zone="z1"))


@pytest.mark.parametrize(
    ("expression", "labels", "expected"),
    [
        ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "b"}, True),
        ({"key": "pool", "operator": "In", "values": ["a"]}, {}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {"pool": "b"}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "gpu", "operator": "Exists"}, {"gpu": ""}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": ""}, False),
        ({"key": "gen", "operator": "Gt", "values": ["7"]}, {"gen": "8"}, True),
        ({"key": "gen", "operator": "Lt", "values": ["7"]}, {"gen": "x"}, False),
    ],
)
def test_required_node_affinity_expressions(
    expression: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    job = job_with(affinity({"matchExpressions": [expression]}))
    assert topology.eligible(job, node("n0", **labels)) is expected


def test_affinity_terms_are_ored_and_match_fields_read_the_node_name() -> None:
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    by_label = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
    job = job_with(affinity(by_name, by_label))
    assert topology.eligible(job, node("n1"))
    assert topology.eligible(job, node("n9", pool="a"))
    assert not topology.eligible(job, node("n2"))
    assert not topology.eligible(job_with(affinity({})), node("n1")), "an empty term matches none"
