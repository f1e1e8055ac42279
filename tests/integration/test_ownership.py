"""Children the MPIJob does not control are never overwritten (upstream's ErrResourceExists).

Counterparts of upstream TestLauncherNotControlledByUs, TestConfigMapNotControlledByUs,
TestWorkerServiceNotControlledByUs and TestLauncherServiceNotControlledByUs (v2 has one Service
for both), TestSecretNotControlledByUs and TestWorkerNotControlledByUs: a same-named object
already exists without our controller reference; the job gets a Warning naming it, the object is
left exactly as it was, and the job proceeds once the obstacle is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs

pytestmark = pytest.mark.integration

META = client.V1ObjectMeta
BUSYBOX = [client.V1Container(name="main", image="busybox")]


def _service(c: Cluster, ns: str) -> Any:
    return c.core.create_namespaced_service(
        ns,
        client.V1Service(
            metadata=META(name="foo"),
            spec=client.V1ServiceSpec(
                selector={"app": "someone-else"}, ports=[client.V1ServicePort(port=80)]
            ),
        ),
    )


def _config_map(c: Cluster, ns: str) -> Any:
    return c.core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=META(name="foo-config"), data={"hostfile": "not ours\n"})
    )


def _secret(c: Cluster, ns: str) -> Any:
    return c.core.create_namespaced_secret(
        ns, client.V1Secret(metadata=META(name="foo-ssh"), string_data={"key": "not ours"})
    )


def _launcher(c: Cluster, ns: str) -> Any:
    return c.batch.create_namespaced_job(
        ns,
        client.V1Job(
            metadata=META(name="foo-launcher"),
            spec=client.V1JobSpec(
                suspend=True,
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(restart_policy="Never", containers=BUSYBOX)
                ),
            ),
        ),
    )


def _worker(c: Cluster, ns: str) -> Any:
    return c.core.create_namespaced_pod(
        ns,
        client.V1Pod(metadata=META(name="foo-worker-0"), spec=client.V1PodSpec(containers=BUSYBOX)),
    )


CASES: dict[str, tuple[str, Callable[[Cluster, str], Any], Callable[[Cluster, str], Any]]] = {
    "TestWorkerServiceNotControlledByUs": (
        "foo",
        _service,
        lambda c, ns: c.core.read_namespaced_service("foo", ns),
    ),
    "TestConfigMapNotControlledByUs": (
        "foo-config",
        _config_map,
        lambda c, ns: c.core.read_namespaced_config_map("foo-config", ns),
    ),
    "TestSecretNotControlledByUs": (
        "foo-ssh",
        _secret,
        lambda c, ns: c.core.read_namespaced_secret("foo-ssh", ns),
    ),
    "TestLauncherNotControlledByUs": (
        "foo-launcher",
        _launcher,
        lambda c, ns: c.batch.read_namespaced_job("foo-launcher", ns),
    ),
    "TestWorkerNotControlledByUs": (
        "foo-worker-0",
        _worker,
        lambda c, ns: c.core.read_namespaced_pod("foo-worker-0", ns),
    ),
}


@pytest.mark.parametrize("upstream", list(CASES))
def test_child_not_controlled_by_us_is_left_alone(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs, upstream: str
) -> None:
    name, create, read = CASES[upstream]
    before = create(crds, namespace)
    mpijobs.create(mpijob("foo", workers=1))
    warning = mpijobs.wait_event("foo", "ErrResourceExists")
    assert warning["type"] == "Warning"
    assert f'Resource "{name}" of Kind' in warning["message"]
    assert warning["message"].endswith("already exists and is not managed by MPIJob")
    after = read(crds, namespace)
    # Other controllers may update it (the Job controller, kwok): we never did.
    writers = {m.manager for m in after.metadata.managed_fields or []}
    assert not any("mpijob" in w for w in writers), writers
    assert not after.metadata.owner_references
    assert after.metadata.labels == before.metadata.labels
    # The job does not get past the obstacle: no launcher of ours while a worker is blocked, etc.
    if name == "foo":
        assert not crds.core.list_namespaced_pod(namespace).items
    assert operator.alive()
