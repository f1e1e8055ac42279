"""A pod's effective requests, as the scheduler computes them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from mpijob import keys
from mpijob.desired.requests import effective_gpus, effective_requests

pytestmark = pytest.mark.unit


def c(gpus: int = 0, cpu: str = "", *, sidecar: bool = False, limit: bool = False) -> Any:
    amounts: dict[str, str] = {}
    if gpus:
        amounts[keys.GPU_RESOURCE] = str(gpus)
    if cpu:
        amounts["cpu"] = cpu
    out: dict[str, Any] = {"name": "c", "resources": {"limits" if limit else "requests": amounts}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def test_containers_sum_and_the_largest_init_container_wins_if_more() -> None:
    spec = {"initContainers": [c(4), c(1)], "containers": [c(1), c(2)]}
    assert effective_gpus(spec) == 4
    assert effective_gpus({"initContainers": [c(1)], "containers": [c(1), c(2)]}) == 3


def test_sidecars_run_beside_the_containers_and_the_init_containers_after_them() -> None:
    # The sidecar (2) runs beside the app containers (1): 3. The init container after it (2)
    # runs beside it too: 4, more than 3.
    spec = {"initContainers": [c(2, sidecar=True), c(2)], "containers": [c(1)]}
    assert effective_gpus(spec) == 4
    # An init container before the sidecar runs alone: 2 < 2 + 1.
    spec = {"initContainers": [c(2), c(2, sidecar=True)], "containers": [c(1)]}
    assert effective_gpus(spec) == 3


def test_overhead_is_added_and_limits_stand_for_missing_requests() -> None:
    spec = {"containers": [c(cpu="500m", limit=True)], "overhead": {"cpu": "250m"}}
    assert effective_requests(spec) == {"cpu": Decimal("0.75")}


def test_a_malformed_amount_counts_as_none() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "lots", keys.GPU_RESOURCE: "2"}}}]}
    assert effective_requests(spec) == {keys.GPU_RESOURCE: Decimal(2)}
