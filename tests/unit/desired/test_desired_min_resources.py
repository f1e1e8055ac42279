"""minResources: counterparts of upstream TestCalculatePGMinResources, TestAddResources and
TestReplicasOrder, plus the case where we deliberately differ from upstream."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.desired import min_resources, podgroup
from mpijob.desired.min_resources import ReplicaPriority
from mpijob.pods.quantity import Quantity
from support.gang_jobs import job, template

pytestmark = pytest.mark.unit

MIN_RESOURCES = {"cpu": "100", "memory": "512Gi", "example.com/gpu": "40"}
PRIORITIES = {"high": 100_010, "low": 10_010}


def _quantities(resources: dict[str, str]) -> dict[str, Quantity]:
    return {name: Quantity.parse(text) for name, text in resources.items()}


def _manifest(resources: dict[str, Quantity] | None) -> dict[str, str] | None:
    return None if resources is None else min_resources.to_manifest(resources)


# Upstream passes minMember explicitly; here it is the job's minAvailable (or its default), which
# is what upstream's newPodGroup passes.
VOLCANO_CASES: dict[str, tuple[Any, dict[str, str] | None]] = {
    "minResources is not empty": (job(policy={"minResources": MIN_RESOURCES}), MIN_RESOURCES),
    "schedulingPolicy is nil": (job(policy={"minAvailable": 0}), None),
    "without priorityClass": (
        job(
            launcher=template({"cpu": "2", "memory": "1Gi"}),
            worker=template({"cpu": "10", "memory": "32Gi"}),
            workers=2,
        ),
        {"cpu": "22", "memory": "65Gi"},
    ),
    "without worker without priorityClass": (
        job(launcher=template({"cpu": "2", "memory": "1Gi"})),
        {"cpu": "2", "memory": "1Gi"},
    ),
}

SCHED_CASES: dict[str, tuple[Any, dict[str, str] | None]] = {
    "schedulingPolicy.minResources isn't empty": (
        job(policy={"minResources": MIN_RESOURCES}),
        MIN_RESOURCES,
    ),
    "schedulingPolicy.minMember is 0": (job(policy={"minAvailable": 0}), None),
    "without priorityClass": (
        job(
            launcher=template({"cpu": "2", "memory": "1Gi"}),
            worker=template({"cpu": "10", "memory": "32Gi"}, {"cpu": "50", "memory": "512Gi"}),
            workers=2,
        ),
        {"cpu": "122", "memory": "1089Gi"},
    ),
    "with non-existence priorityClass": (
        job(
            policy={"minAvailable": 2},
            launcher=template({"cpu": "2", "memory": "2Gi"}, priority_class="non-existence"),
            worker=template({"cpu": "5", "memory": "16Gi"}, priority_class="non-existence"),
            workers=2,
        ),
        {"cpu": "7", "memory": "18Gi"},
    ),
    "with existence priorityClass": (
        job(
            policy={"minAvailable": 2},
            launcher=template({"cpu": "2", "memory": "4Gi"}, priority_class="high"),
            worker=template({"cpu": "20", "memory": "64Gi"}, priority_class="low"),
            workers=100,
        ),
        {"cpu": "22", "memory": "68Gi"},
    ),
}


@pytest.mark.parametrize(
    ("mpi_job", "expected"),
    [pytest.param(*case, id=f"volcano: {name}") for name, case in VOLCANO_CASES.items()]
    + [pytest.param(*case, id=f"sched: {name}") for name, case in SCHED_CASES.items()],
)
def test_calculate_pg_min_resources(mpi_job: Any, expected: dict[str, str] | None) -> None:
    """Counterpart of upstream TestCalculatePGMinResources (volcano and scheduler-plugins)."""
    got = podgroup.gang_min_resources(mpi_job, PRIORITIES)
    assert _manifest(got) == (None if expected is None else dict(sorted(expected.items())))


@pytest.mark.parametrize(
    ("total", "requirements", "expected"),
    [
        pytest.param(None, {"requests": {"cpu": "20"}}, None, id="minResources is nil"),
        pytest.param(
            {}, {"requests": {"cpu": "20"}}, {"cpu": "20"}, id="add a new resource to minResources"
        ),
        pytest.param(
            {"memory": "20Gi"},
            {"requests": {"memory": "10Gi"}},
            {"memory": "30Gi"},
            id="increase a quantity of minResources",
        ),
        pytest.param(
            {},
            {
                "requests": {"cpu": "10", "memory": "16Gi"},
                "limits": {"example.com/gpu": "8", "cpu": "20", "memory": "32Gi"},
            },
            {"example.com/gpu": "8", "cpu": "10", "memory": "16Gi"},
            id="same resource names exist in requests and limits",
        ),
    ],
)
def test_add_resources(
    total: dict[str, str] | None,
    requirements: dict[str, Any],
    expected: dict[str, str] | None,
) -> None:
    """Counterpart of upstream TestAddResources: requests win, limits fill the gaps."""
    start = None if total is None else _quantities(total)
    got = min_resources.add_resources(start, requirements)
    assert _manifest(got) == (None if expected is None else dict(sorted(expected.items())))


def test_add_resources_multiplies_by_replicas_and_leaves_its_input_alone() -> None:
    start = _quantities({"cpu": "1"})
    got = min_resources.add_resources(start, {"requests": {"cpu": "500m"}}, 4)
    assert _manifest(got) == {"cpu": "3"}
    assert _manifest(start) == {"cpu": "1"}


LAUNCHER = ReplicaPriority("Launcher", 1, {}, priority=1)
WORKER = ReplicaPriority("Worker", 2, {}, priority=0)


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        pytest.param(
            [LAUNCHER, WORKER],
            [LAUNCHER, WORKER],
            id="1-lancher, 2-worker, lancher higher priority",
        ),
        pytest.param(
            [WORKER, ReplicaPriority("Launcher", 1, {}, priority=0)],
            [WORKER, ReplicaPriority("Launcher", 1, {}, priority=0)],
            id="1-lancher, 2-worker, equal priority",
        ),
    ],
)
def test_replicas_order(original: list[ReplicaPriority], expected: list[ReplicaPriority]) -> None:
    """Counterpart of upstream TestReplicasOrder: highest priority first, ties keep their order."""
    assert min_resources.replicas_order(original) == expected


def test_replicas_order_puts_a_higher_priority_worker_first() -> None:
    assert min_resources.replicas_order([LAUNCHER, ReplicaPriority("Worker", 2, {}, 5)])[0] == (
        ReplicaPriority("Worker", 2, {}, 5)
    )


def test_min_resources_take_the_first_min_member_pods_when_workers_outrank_the_launcher() -> None:
    """Deliberate difference: upstream would count minMember-1 launchers plus every worker."""
    mpi_job = job(
        policy={"minAvailable": 3},
        launcher=template({"cpu": "1", "memory": "1Gi"}, priority_class="low"),
        worker=template({"cpu": "10", "memory": "8Gi"}, priority_class="high"),
        workers=5,
    )
    got = podgroup.gang_min_resources(mpi_job, PRIORITIES)
    assert _manifest(got) == {"cpu": "30", "memory": "24Gi"}


def test_min_resources_keep_the_format_of_the_first_term() -> None:
    """Sums print as upstream's Quantity.Add does: in the format of the first quantity added."""
    mpi_job = job(
        launcher=template({"cpu": "500m", "memory": "1G"}),
        worker=template({"cpu": "1", "memory": "1Gi"}),
        workers=1,
    )
    got = podgroup.gang_min_resources(mpi_job, {})
    assert _manifest(got) == {"cpu": "1500m", "memory": "2073741824"}
