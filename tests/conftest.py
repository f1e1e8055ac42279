"""Suite-wide fixtures: the cluster (session), a namespace per test, tier markers.

Tests under tests/unit are marked ``unit`` and need no cluster; tests under tests/integration are
marked ``integration`` and run against a real API server: the one MPIJOB_TEST_KUBECONFIG names, or
the local control plane (hack/cluster.py), started on first use. Integration tests never skip: a
missing cluster fails them loudly.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from support import lanes
from support.kube import ROOT, Cluster, start_cluster
from support.kueue import Kueue, start_kueue, stop_kueue
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unplaced = []
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(TESTS)
        tier = rel.parts[0]
        if tier in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "integration":
            where = lanes.lane(item.nodeid)
            if where is None:
                unplaced.append(rel.name)
            elif where == lanes.EXCLUSIVE:
                item.add_marker(pytest.mark.exclusive)
    if unplaced:
        raise pytest.UsageError(
            "integration test modules without a lane (add them to tests/support/lanes.py's "
            f"MODULES): {', '.join(sorted(set(unplaced)))}"
        )
    # Fast tiers first: a broken builder fails in seconds, before any cluster starts.
    items.sort(key=lambda i: i.get_closest_marker("integration") is not None)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown when it is off (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with the lanes as scopes: every test of a serial lane goes to one
    worker, in order; any other test is a scope of its own (tests/support/lanes.py)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            where = lanes.lane(nodeid)
            return where if where in lanes.SERIAL else nodeid

    return LaneScheduling(config, log)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return start_cluster()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted afterwards (without waiting for it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    cluster.delete_namespace(name)


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> Cluster:
    """The CRDs from crds/ (MPIJob, PlacementDecision), installed (server-side apply) and
    Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/mpijobs.kubeflow.org",
        "crd/placementdecisions.mpijob.io",
    )
    return cluster


@pytest.fixture
def start_operator(crds: Cluster, namespace: str) -> Iterator[Callable[..., OperatorProcess]]:
    """Start our operator (a subprocess) watching the test's namespace; stopped afterwards.

    Its log is kept in .test-logs/operator-<namespace>.log.
    """
    started: list[OperatorProcess] = []
    log_dir = ROOT / ".test-logs"
    log_dir.mkdir(exist_ok=True)

    def start(*args: str, wait: bool = True) -> OperatorProcess:
        op = OperatorProcess(crds.kubeconfig, namespace, log_dir, *args)
        started.append(op.start(wait=wait))
        return op

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """Our operator with default flags, watching the test's namespace."""
    return start_operator()


@pytest.fixture
def mpijobs(crds: Cluster, namespace: str) -> MPIJobs:
    return MPIJobs(crds, namespace)


@pytest.fixture
def idle_gpus(cluster: Cluster) -> None:
    """Wait until no pod anywhere requests GPUs and no claim holds any (earlier tests'
    namespaces are gone)."""

    def gpu_pods() -> list[str]:
        return [
            f"{p.metadata.namespace}/{p.metadata.name}"
            for p in cluster.core.list_pod_for_all_namespaces().items
            if any(
                (c.resources and (c.resources.limits or {}).get("nvidia.com/gpu"))
                for c in p.spec.containers
            )
        ]

    def allocated_claims() -> list[str]:
        try:
            found = cluster.resource("resource.k8s.io/v1", "ResourceClaim").get()
        except Exception:  # DRA not served: nothing can hold GPUs through it
            return []
        return [
            f"{c.metadata.namespace}/{c.metadata.name}"
            for c in found.items
            if ((c.get("status") or {}).get("allocation") or {}).get("devices")
        ]

    wait_until(lambda: not gpu_pods(), timeout=120, what="no GPU pods left from earlier tests")
    wait_until(
        lambda: not allocated_claims(), timeout=120, what="no GPUs allocated to earlier claims"
    )


@pytest.fixture(scope="module")
def kueue(crds: Cluster) -> Iterator[Kueue]:
    """The real Kueue beside the cluster for one test module, stopped after it (its webhooks
    removed), so the modules after it run without Kueue."""
    start_kueue(crds)
    yield Kueue(crds)
    stop_kueue(crds)
