"""The scheduler's predicates: effective requests, node eligibility, terminal phases."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from mpijob import keys
from mpijob.pods.predicates import (
    admits,
    container_gpus,
    effective_gpus,
    effective_requests,
    pod_requests,
    template_gpus,
    terminal,
    tolerates,
)

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


def test_a_pod_takes_one_pods_slot_beside_its_requests() -> None:
    assert pod_requests({"containers": [c(1, "500m")]}) == {
        keys.GPU_RESOURCE: Decimal(1),
        "cpu": Decimal("0.5"),
        "pods": Decimal(1),
    }


def node(name: str = "n1", labels: dict[str, str] | None = None, taints: Any = None) -> Any:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def test_the_node_selector_and_every_expression_of_one_term_must_match() -> None:
    gpu = node(labels={"pool": "gpu", "rack": "7"})
    assert admits({"nodeSelector": {"pool": "gpu"}}, gpu)
    assert not admits({"nodeSelector": {"pool": "cpu"}}, gpu)
    term = {
        "matchExpressions": [
            {"key": "rack", "operator": "Gt", "values": ["5"]},
            {"key": "zone", "operator": "DoesNotExist"},
        ]
    }
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    assert admits({"affinity": {"nodeAffinity": required}}, gpu)
    term["matchExpressions"][0]["values"] = ["7"]
    assert not admits({"affinity": {"nodeAffinity": required}}, gpu)


def test_terms_are_ored_and_match_fields_read_the_node_name() -> None:
    terms = [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
    ]
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    }
    assert admits(spec, node("n2"))
    assert not admits(spec, node("n1"))
    assert admits(spec, node("n1", {"pool": "cpu"}))


def test_only_no_schedule_and_no_execute_taints_need_a_toleration() -> None:
    soft = node(taints=[{"key": "a", "effect": "PreferNoSchedule"}])
    hard = node(taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])
    assert tolerates({}, soft)
    assert not tolerates({}, hard)
    assert tolerates({"tolerations": [{"key": "gpu", "value": "yes"}]}, hard)
    assert not tolerates({"tolerations": [{"key": "gpu", "value": "no"}]}, hard)
    assert tolerates({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, hard)
    assert not tolerates(
        {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]}, hard
    )
    assert tolerates({"tolerations": [{"operator": "Exists"}]}, hard)


def test_succeeded_and_failed_pods_have_ended() -> None:
    assert terminal({"status": {"phase": "Succeeded"}})
    assert terminal({"status": {"phase": "Failed"}})
    assert not terminal({"status": {"phase": "Running"}})
    assert not terminal({})


def template(*containers: dict[str, object], init: tuple[dict[str, object], ...] = ()) -> Any:
    return {"spec": {"containers": list(containers), "initContainers": list(init)}}


def test_a_templates_gpus_sum_its_containers_limits_before_requests() -> None:
    limits = {"name": "a", "resources": {"limits": {keys.GPU_RESOURCE: 2}, "requests": {}}}
    requests = {"name": "b", "resources": {"requests": {keys.GPU_RESOURCE: "1"}}}
    assert template_gpus(template(limits, requests, {"name": "c"})) == 3
    assert [container_gpus(x) for x in (limits, requests)] == [2, 1]


def test_a_templates_gpus_of_a_malformed_quantity_are_none() -> None:
    bad = {"name": "a", "resources": {"limits": {keys.GPU_RESOURCE: "lots"}}}
    assert template_gpus(template(bad)) == 0
    assert template_gpus(None) == 0


def test_a_templates_gpus_are_the_scheduler_s_init_containers_and_sidecars_included() -> None:
    """What placement reserves for a worker is what the scheduler charges its pod."""
    assert template_gpus(template(c(1), init=(c(8),))) == 8
    assert template_gpus(template(c(1), init=(c(2, sidecar=True),))) == 3
    with_overhead = template(c(1))
    with_overhead["spec"]["overhead"] = {keys.GPU_RESOURCE: "1"}
    assert template_gpus(with_overhead) == 2
