"""One reading of GPU requests and of our GPU-ids annotation, for the operator and the console."""

from __future__ import annotations

import pytest

from mpijob import api

pytestmark = pytest.mark.unit


def template(*containers: dict[str, object]) -> dict[str, object]:
    return {"spec": {"containers": list(containers)}}


def test_gpu_count_sums_containers_limits_before_requests() -> None:
    limits = {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {}}}
    requests = {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
    assert api.gpu_count(template(limits, requests, {"name": "c"})) == 3


def test_gpu_count_of_a_malformed_quantity_is_none() -> None:
    bad = {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}
    assert api.gpu_count(template(bad)) == 0
    assert api.gpu_count(None) == 0


def test_gpu_ids_skips_what_is_not_an_index() -> None:
    assert api.gpu_ids("0, 3,x,,7") == (0, 3, 7)
    assert api.gpu_ids(None) == ()
