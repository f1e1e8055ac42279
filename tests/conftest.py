"""Suite-wide fixtures: the cluster (session), a namespace per test, tier markers.

Tests under tests/unit are marked ``unit`` and need no cluster; tests under tests/integration are
marked ``integration`` and run against a real API server: the one MPIJOB_TEST_KUBECONFIG names, or
the local control plane (hack/cluster.py), started on first use. Integration tests never skip: a
missing cluster fails them loudly.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from support.kube import Cluster, start_cluster

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(TESTS)
        tier = rel.parts[0]
        if tier in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, tier))
    # Fast tiers first: a broken builder fails in seconds, before any cluster starts.
    items.sort(key=lambda i: i.get_closest_marker("integration") is not None)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return start_cluster()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted afterwards (without waiting)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    cluster.core.delete_namespace(name, propagation_policy="Background")
