"""A node's room for one more pod: requests read as the scheduler reads them, counted per node."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from mpijob.pods.predicates import pod_requests
from mpijob.shares.node_room import NodeRoom


def container(**requests: str) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests}}


def test_a_pod_takes_its_containers_sum_or_its_largest_init_container_and_one_pod() -> None:
    spec = {
        "initContainers": [
            container(cpu="3"),
            {**container(cpu="500m", memory="1Gi"), "restartPolicy": "Always"},  # a sidecar
        ],
        "containers": [container(cpu="1", memory="2Gi"), container(cpu="250m")],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {
        "cpu": Decimal("3.1"),  # the init container's 3 beats 1.75 running, plus the overhead
        "memory": Decimal(3 * 2**30),
        "pods": Decimal(1),
    }


def test_a_limit_stands_for_a_missing_request_and_junk_counts_nothing() -> None:
    spec = {
        "containers": [
            {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}},
            {"name": "c", "resources": {"requests": {"memory": "lots"}}},
        ]
    }
    assert pod_requests(spec) == {
        "cpu": Decimal(3),
        "memory": Decimal(2**30),
        "pods": Decimal(1),
    }


def test_room_counts_bound_pods_and_frees_them() -> None:
    room = NodeRoom()
    room.set_node("n", {"cpu": "4", "memory": "8Gi", "pods": "3"})
    big = pod_requests({"containers": [container(cpu="3")]})
    small = pod_requests({"containers": [container(cpu="1")]})
    assert room.fits("n", big)
    room.add("a", "n", big)
    assert room.fits("n", small)
    assert not room.fits("n", small, count=2)
    assert not room.fits("n", big)
    room.add("a", "n", small)  # the same key again replaces, not adds
    assert room.fits("n", small, count=3) is False  # three more would make four pods
    assert room.fits("n", small, count=2)
    assert room.remove("a")
    assert not room.remove("a")
    assert room.fits("n", big)


def test_an_unknown_node_or_a_resource_it_lacks_has_no_room() -> None:
    room = NodeRoom()
    assert not room.fits("nowhere", {"pods": Decimal(1)})
    room.set_node("n", {"cpu": "4", "pods": "10"})
    assert not room.fits("n", pod_requests({"containers": [container(**{"example.com/x": "1"})]}))
    assert room.fits("n", pod_requests({"containers": [container(**{"example.com/x": "0"})]}))
