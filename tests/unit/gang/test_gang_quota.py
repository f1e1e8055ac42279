"""Namespaces' GPU quotas in our admission: what Kubernetes counts, what only we can count."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang import quota
from mpijob.gang.quota import Charged, Held, Limit
from support import jobs

pytestmark = pytest.mark.unit

DRA, ANNOTATIONS = GpuBinding.DRA, GpuBinding.ANNOTATIONS


def job(workers: int = 2, gpus: int = 4, launcher_gpus: int = 0, **worker_spec: Any) -> api.MPIJob:
    return jobs.parsed(
        jobs.body(
            "j",
            "team",
            launcher=jobs.gpu_template(launcher_gpus),
            worker=jobs.gpu_template(gpus, **worker_spec),
            workers=workers,
        )
    )


def resource_quota(
    hard: dict[str, Any], used: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "gpus", "namespace": "team"},
        "spec": {"hard": hard, **spec},
    }
    if used is not None:
        body["status"] = {"hard": hard, "used": used}
    return body


def limits(hard: Any, used: Any = 0, resource: str = keys.QUOTA_GPU_REQUESTS) -> list[Limit]:
    return quota.limits_of(resource_quota({resource: hard}, {resource: used}))


# --- reading ResourceQuotas ------------------------------------------------------------------


def test_only_gpu_resources_are_read_with_their_quantities_and_scopes() -> None:
    body = resource_quota(
        {
            keys.QUOTA_GPU_REQUESTS: "8",
            keys.QUOTA_GPU_CLAIM_DEVICES: "4",
            "requests.cpu": "100",
            "limits.nvidia.com/gpu": "0",  # no evaluator charges it: Kubernetes ignores it
        },
        {keys.QUOTA_GPU_REQUESTS: "2"},
        scopes=["NotTerminating"],
    )
    got = quota.limits_of(body)
    assert [(lim.resource, lim.hard, lim.used) for lim in got] == [
        (keys.QUOTA_GPU_REQUESTS, Decimal(8), Decimal(2)),
        (keys.QUOTA_GPU_CLAIM_DEVICES, Decimal(4), None),
    ]
    assert all(lim.scopes == (("NotTerminating", "Exists", ()),) for lim in got)
    assert quota.limits_of(resource_quota({"requests.cpu": "1"})) == []


# --- what each quota charges, per binding ----------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "binding", "mapped", "expected"),
    [
        (keys.QUOTA_GPU_REQUESTS, ANNOTATIONS, False, Charged.PODS),
        (keys.QUOTA_GPU_REQUESTS, DRA, False, Charged.NOTHING),
        (keys.QUOTA_GPU_REQUESTS, DRA, True, Charged.CLAIMS),
        (keys.QUOTA_GPU_CLAIM_DEVICES, DRA, False, Charged.CLAIMS),
        (keys.QUOTA_GPU_CLAIM_DEVICES, ANNOTATIONS, False, None),
    ],
)
def test_what_kubernetes_charges_a_placed_worker_to(
    resource: str, binding: GpuBinding, mapped: bool, expected: Charged | None
) -> None:
    assert quota.charged(resource, binding, claims_as_gpus=mapped) is expected


def test_unseen_gpus_are_those_kubernetes_has_not_charged_yet() -> None:
    half_created = Held(gpus=8, in_pods=4, in_claims=4)
    assert quota.unseen(half_created, Charged.PODS) == 4
    assert quota.unseen(half_created, Charged.CLAIMS) == 4
    # Hidden from requests.nvidia.com/gpu in the dra binding: whatever the pods say.
    assert quota.unseen(half_created, Charged.NOTHING) == 8
    # A forged pod or claim controlled by the job never makes the count negative.
    assert quota.unseen(Held(gpus=2, in_pods=9, in_claims=9), Charged.PODS) == 0


def test_held_by_counts_only_what_the_decisions_job_controls() -> None:
    def owned(uid: str) -> dict[str, Any]:
        return {"ownerReferences": [{"uid": uid, "controller": True}]}

    def pod(uid: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
        containers = [{"resources": {"limits": {keys.GPU_RESOURCE: gpus}}}]
        return {
            "metadata": owned(uid),
            "spec": {"containers": containers},
            "status": {"phase": phase},
        }

    def claim(uid: str, count: int, device_class: str = keys.NVIDIA_GPU_DRIVER) -> dict[str, Any]:
        request = {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}
        return {"metadata": owned(uid), "spec": {"devices": {"requests": [request]}}}

    pods = [pod("a", 4), pod("a", 4, "Succeeded"), pod("b", 2)]
    claims = [claim("a", 4), claim("b", 4), claim("a", 1, "other.example.com")]
    assert quota.held_by("a", 8, pods, claims, None) == Held(8, in_pods=4, in_claims=4)


# --- the check -------------------------------------------------------------------------------


def test_a_zero_gpu_quota_refuses_the_job_and_names_the_quota_in_either_binding() -> None:
    for binding in (DRA, ANNOTATIONS):
        why = quota.check(job(), limits(0), [], binding)
        assert why == (
            "ResourceQuota gpus in namespace team allows requests.nvidia.com/gpu: 0; 0 in use "
            "(0 counted by the API server, 0 held by this operator's placements) and this job "
            "needs 8"
        )


def test_in_the_dra_binding_our_placements_count_although_kubernetes_counts_none() -> None:
    """Quota 8, one 8-GPU job admitted (its workers bound by claims: used stays 0)."""
    running = [Held(gpus=8, in_claims=8)]
    why = quota.check(job(), limits(8, used=0), running, DRA)
    assert "8 in use (0 counted by the API server, 8 held by this operator's placements)" in why
    assert quota.check(job(), limits(8, used=0), [], DRA) == ""
    assert quota.check(job(), limits(16, used=0), running, DRA) == ""


def test_in_the_annotations_binding_created_workers_are_counted_once() -> None:
    """Kubernetes charges the workers' pods: the decision adds only what has no pod yet."""
    assert quota.check(job(), limits(16, used=8), [Held(gpus=8, in_pods=8)], ANNOTATIONS) == ""
    half = [Held(gpus=8, in_pods=4)]
    assert quota.check(job(), limits(16, used=4), half, ANNOTATIONS) == ""
    why = quota.check(job(), limits(15, used=4), half, ANNOTATIONS)
    assert "8 in use (4 counted by the API server, 4 held by this operator's placements)" in why


def test_with_the_extended_resource_mapping_claims_are_counted_by_kubernetes() -> None:
    """DRAExtendedResource on and the class naming nvidia.com/gpu: used includes our claims."""
    claimed = [Held(gpus=8, in_claims=8)]
    assert quota.check(job(), limits(16, used=8), claimed, DRA, claims_as_gpus=True) == ""
    # Without the mapping the same numbers would count the running job twice.
    assert quota.check(job(), limits(16, used=8), claimed, DRA) != ""
    # A used below our own claims says the API server does not charge them after all (the gate
    # was turned off again, which keeps the class's field): they are counted by us instead.
    why = quota.check(job(), limits(15, used=0), claimed, DRA, claims_as_gpus=True)
    assert "8 in use (0 counted by the API server, 8 held by this operator's placements)" in why


def test_a_device_class_quota_applies_to_claims_only() -> None:
    device_quota = limits(4, resource=keys.QUOTA_GPU_CLAIM_DEVICES)
    assert "gpu.nvidia.com.deviceclass.resource.k8s.io/devices" in quota.check(
        job(), device_quota, [], DRA
    )
    assert quota.check(job(), device_quota, [], ANNOTATIONS) == ""


def test_the_launcher_gpus_count_under_the_pod_quota_in_every_binding() -> None:
    assert "needs 9" in quota.check(job(launcher_gpus=1), limits(8), [], DRA)
    device_quota = limits(8, resource=keys.QUOTA_GPU_CLAIM_DEVICES)
    assert quota.check(job(launcher_gpus=1), device_quota, [], DRA) == ""


def test_a_quota_not_yet_counted_by_the_api_server_waits() -> None:
    unset = quota.limits_of(resource_quota({keys.QUOTA_GPU_REQUESTS: "64"}))
    assert "has not counted its usage yet" in quota.check(job(), unset, [], DRA)


def test_a_cpu_only_job_is_never_held_by_a_gpu_quota() -> None:
    assert quota.check(job(gpus=0), limits(0), [], DRA) == ""


# --- scopes, matched as the API server's pod evaluator does ---------------------------------


def scoped(hard: int, **spec: Any) -> list[Limit]:
    return quota.limits_of(
        resource_quota({keys.QUOTA_GPU_REQUESTS: hard}, {keys.QUOTA_GPU_REQUESTS: 0}, **spec)
    )


def priority(operator: str, *values: str) -> dict[str, Any]:
    expression = {"scopeName": "PriorityClass", "operator": operator, "values": list(values)}
    return {"scopeSelector": {"matchExpressions": [expression]}}


def test_a_priority_class_scoped_quota_holds_only_its_class() -> None:
    low_only = scoped(0, **priority("In", "low"))
    assert quota.check(job(priorityClassName="high"), low_only, [], DRA) == ""
    assert quota.check(job(priorityClassName="low"), low_only, [], DRA) != ""
    # Jobs of another class are not counted against it either.
    high_running = Held(gpus=8, worker_spec={"priorityClassName": "high"})
    low_eight = scoped(8, **priority("In", "low"))
    assert quota.check(job(priorityClassName="low"), low_eight, [high_running], DRA) == ""
    # A placement whose job is gone is counted (unknown template: the safe side).
    assert quota.check(job(priorityClassName="low"), low_eight, [Held(gpus=8)], DRA) != ""


@pytest.mark.parametrize(
    ("scopes", "spec", "charged"),
    [
        (["BestEffort"], {}, False),
        (["NotBestEffort"], {}, True),
        (["Terminating"], {}, False),
        (["Terminating"], {"activeDeadlineSeconds": 60}, True),
        (["NotTerminating"], {}, True),
        (["CrossNamespacePodAffinity"], {}, False),
    ],
)
def test_pod_scopes(scopes: list[str], spec: dict[str, Any], charged: bool) -> None:
    assert (quota.check(job(**spec), scoped(0, scopes=scopes), [], DRA) != "") is charged


def test_a_scoped_quota_never_charges_claims_so_we_keep_the_pod_one() -> None:
    """The API server's claim evaluator matches no scope: a scoped device-class quota holds no
    claim (nor any pod), while a scoped nvidia.com/gpu quota would have held the workers' pods,
    so the operator keeps it even where the mapping charges unscoped ones with the claims."""
    device_quota = quota.limits_of(
        resource_quota(
            {keys.QUOTA_GPU_CLAIM_DEVICES: 0},
            {keys.QUOTA_GPU_CLAIM_DEVICES: 0},
            scopes=["NotBestEffort"],
        )
    )
    assert quota.check(job(), device_quota, [], DRA) == ""
    pod_quota = scoped(8, scopes=["NotBestEffort"])
    running = [Held(gpus=8, in_claims=8)]
    assert quota.check(job(), pod_quota, running, DRA, claims_as_gpus=True) != ""


@pytest.mark.parametrize(
    ("version", "extended", "expected"),
    [
        # 1.34's claim evaluator charges claims only to the device class and count/resourceclaims.
        ({"major": "1", "minor": "34"}, keys.GPU_RESOURCE, False),
        ({"major": "1", "minor": "35"}, keys.GPU_RESOURCE, True),
        ({"major": "1", "minor": "36+"}, keys.GPU_RESOURCE, True),
        ({"major": "1", "minor": "35"}, "", False),  # the class maps nothing (gate off)
        ({"major": "1", "minor": "35"}, "example.com/gpu", False),
        ({}, keys.GPU_RESOURCE, False),  # unknown: count the claims ourselves
    ],
)
def test_claims_count_as_gpus_only_where_the_api_server_charges_them(
    version: dict[str, str], extended: str, expected: bool
) -> None:
    minor = quota.server_minor(version)
    assert quota.charges_claims_as_gpus(minor, extended) is expected
