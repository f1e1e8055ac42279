"""Reading and validating a pod's GPU share: every rule refused with its field path and fix."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob import keys
from mpijob.shares.request import Placed, Share, asks_for_share, read_request

MEM = keys.GPU_MEM_RESOURCE
CORE = keys.GPU_CORE_PERCENTAGE_RESOURCE


def spec(*limits: dict[str, Any], init: dict[str, Any] | None = None) -> dict[str, Any]:
    containers = [
        {"name": f"c{i}", "resources": {"limits": limit}} for i, limit in enumerate(limits)
    ]
    out: dict[str, Any] = {"containers": containers}
    if init is not None:
        out["initContainers"] = [{"name": "init", "resources": {"limits": init}}]
    return out


def test_the_cuda_sample_share_reads_as_two_gib_and_thirty_percent() -> None:
    request = read_request(spec({MEM: "2", CORE: "30"}))
    assert request.errors == ()
    assert request.share == Share(memory_gib=2, percentage=30, clients=1)


def test_integers_from_yaml_read_the_same_as_quantity_strings() -> None:
    assert read_request(spec({MEM: 2, CORE: 30})).share == Share(2, 30)


def test_memory_only_share_has_no_percentage() -> None:
    share = read_request(spec({MEM: "4"})).share
    assert share == Share(4, None)
    assert share is not None
    assert not share.with_compute


def test_containers_add_up_and_count_as_clients() -> None:
    share = read_request(spec({MEM: "2", CORE: "20"}, {"cpu": "1"}, {MEM: "3", CORE: "25"})).share
    assert share == Share(5, 45, clients=2)


def test_a_pod_without_share_asks_for_none() -> None:
    request = read_request(spec({"nvidia.com/gpu": "1"}))
    assert request.share is None
    assert request.errors == ()
    assert not asks_for_share(spec({"cpu": "1"}))
    assert asks_for_share(spec({CORE: "30"}))


@pytest.mark.parametrize("value", ["33", "105", "0", "3", "-5", "30.0", "30%", True])
def test_a_bad_percentage_is_refused_naming_the_field_and_the_rule(value: Any) -> None:
    request = read_request(spec({MEM: "2", CORE: value}))
    assert request.share is None
    [error] = request.errors
    assert error.path == f"spec.containers[0].resources.limits[{CORE}]"
    assert "must be a multiple of 5 from 5 to 100" in error.message


@pytest.mark.parametrize("value", ["0", "-1", "2Gi", "1.5", "", "2k"])
def test_memory_must_be_a_positive_whole_number_of_gib(value: str) -> None:
    [error] = read_request(spec({MEM: value, CORE: "30"})).errors
    assert error.path == f"spec.containers[0].resources.limits[{MEM}]"
    assert "positive whole number of GiB" in error.message


def test_compute_without_memory_is_refused_with_the_fix() -> None:
    [error] = read_request(spec({CORE: "30"}), path="spec.template.spec").errors
    assert error.path == f"spec.template.spec.containers[0].resources.limits[{MEM}]"
    assert f"needs {MEM} in the same container" in error.message


def test_a_share_only_in_requests_must_move_to_limits() -> None:
    pod = {"containers": [{"name": "c", "resources": {"requests": {MEM: "2"}}}]}
    [error] = read_request(pod).errors
    assert error.path == f"spec.containers[0].resources.limits[{MEM}]"
    assert "set it in limits" in error.message


def test_whole_gpus_beside_a_share_are_refused() -> None:
    [error] = read_request(spec({MEM: "2", "nvidia.com/gpu": "1"})).errors
    assert "whole GPUs or a share" in error.message


def test_mixing_memory_only_and_compute_containers_in_one_pod_is_refused() -> None:
    [error] = read_request(spec({MEM: "2", CORE: "30"}, {MEM: "2"})).errors
    assert error.path == "spec.containers"
    assert "cannot mix in one pod" in error.message
    assert '"c1"' in error.message


def test_a_pod_share_over_one_gpu_is_refused() -> None:
    [error] = read_request(spec({MEM: "2", CORE: "60"}, {MEM: "2", CORE: "50"})).errors
    assert "add up to more than 100" in error.message


def test_init_containers_cannot_hold_a_share() -> None:
    [error] = read_request(spec({MEM: "2"}, init={MEM: "1"})).errors
    assert error.path == "spec.initContainers[0].resources.limits"


def test_every_error_is_reported_at_once() -> None:
    errors = read_request(spec({MEM: "0", CORE: "33"}, {CORE: "5"})).errors
    assert len(errors) == 3


def test_the_annotation_round_trips_and_junk_reads_as_none() -> None:
    placed = Placed("node-1", 3, "GPU-x", Share(2, 30, clients=2))
    assert Placed.loads(placed.dumps()) == placed
    memory_only = Placed("n", 0, "GPU-y", Share(4))
    assert Placed.loads(memory_only.dumps()) == memory_only
    for junk in (None, "", "{", "[]", '{"v":2,"node":"n","gpu":0,"mem":1}', '{"v":1}'):
        assert Placed.loads(junk) is None
