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
