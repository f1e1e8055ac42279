"""Upstream's own end-to-end suite, compiled unmodified, passes against this operator.

``test/e2e`` of the pinned kubeflow/mpi-operator (``MPI_OPERATOR_VERSION``), built from the Go
module proxy by ``hack/build-bins.sh e2e``, runs its fourteen specs on the local cluster: MPI jobs
in real containers on the real node, the operator from its own image as the Deployment
``mpi-operator/mpi-operator`` the suite scales and edits, scheduler-plugins' scheduler as its
second scheduler and a stand-in for Volcano's, and a webhook that makes the suite's un-retried
updates of that Deployment unconditional so the Deployment controller's status writes cannot fail
them with 409 Conflict (tests/support/upstream_e2e.py says how each is made; docs/compatibility.md
why).
Each spec is printed with PASS, FAIL or SKIP, then the counts; every spec must pass. A spec whose
image the real node lacks is skipped rather than left to time out, and fails this test all the
same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hack import incluster
from support import upstream_e2e as e2e
from support.kube import Cluster
from support.realnode import ready_real_node

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

# The suite waits up to 200 s per step (its foreverTimeout); fourteen specs pass in a few minutes.
SUITE_TIMEOUT = 1800
SPEC_COUNT = 14


@pytest.fixture(scope="module")
def operator_deployment(crds: Cluster) -> Iterator[Cluster]:
    """The operator installed from its image as upstream's install names it (hack/incluster.py
    ``deploy --upstream-names``): Deployment ``mpi-operator/mpi-operator``, on the real node,
    watching every namespace (the suite's are random)."""
    ready_real_node(crds)
    incluster.deploy("standalone", upstream_names=True)
    yield crds
    incluster.undeploy()


def test_upstream_e2e_suite_passes(
    operator_deployment: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = operator_deployment
    binary = e2e.suite_binary()
    names = e2e.specs(binary)
    assert len(names) == SPEC_COUNT, names
    node = ready_real_node(cluster)
    images = e2e.node_images(cluster, node)
    unrunnable = {n: image for n in names if (image := e2e.missing_image(n, images))}

    t0 = time.monotonic()
    with (
        e2e.real_node_only(cluster, node),
        e2e.sched_plugins_scheduler(cluster, tmp_path),
        e2e.UnconditionalSpecUpdates(cluster, tmp_path) as webhook,
    ):
        e2e.wait_available(cluster)
        results, code, log = e2e.run_suite(
            binary, cluster, tmp_path, sorted(unrunnable), timeout=SUITE_TIMEOUT
        )
    wall = e2e.elapsed(t0)
    replica_sets = e2e.replica_sets(cluster)

    seen = {r.name: r for r in results}
    lines = []
    for name in names:
        spec = seen.get(name)
        if spec is None:
            lines.append(f"FAIL  {name}  (not run)")
        elif spec.outcome == "SKIP" and name in unrunnable:
            lines.append(f"SKIP  {name}  (the real node has no {unrunnable[name]})")
        else:
            lines.append(f"{spec.outcome}  {name}  ({spec.seconds:.0f}s)")
    lines += [f"FAIL  {r.name}" for r in results if r.name not in names]
    passed = sum(line.startswith("PASS") for line in lines)
    failed = len(lines) - passed
    with capsys.disabled():
        print(
            f"\nupstream e2e (kubeflow/mpi-operator test/e2e), the operator's ReplicaSets: "
            f"{len(replica_sets)}; the suite's Deployment updates made unconditional: "
            f"{webhook.unconditional}"
        )
        print("\n".join(lines))
        print(f"{passed} passed, {failed} failed ({wall}; suite log {log})")

    failures = "\n\n".join(f"{r.name}:\n{r.message[:3000]}" for r in results if r.outcome == "FAIL")
    assert passed == SPEC_COUNT, f"suite exit {code}; log {log}\n{failures}"
    assert code == 0, log
    # The suite restarted the operator with a flag appended for each gang-scheduling and the
    # cluster-domain spec: a ReplicaSet for each besides the install's.
    assert len(replica_sets) >= 4, replica_sets
    # Each of those set-ups updated the Deployment through the webhook at least once.
    assert webhook.unconditional >= 4


def test_only_the_suites_updates_of_the_deployment_are_unconditional(
    operator_deployment: Cluster, tmp_path: Path
) -> None:
    """With the harness's webhook, an update of the Deployment carrying a stale resourceVersion
    is written when the suite's user sends it and is still a 409 Conflict from a ``system:`` user
    (a controller's writes stay conditional); with the webhook gone, the suite's is a 409 again."""
    cluster = operator_deployment
    apps = client.AppsV1Api(cluster.api)
    controller = client.AppsV1Api(_impersonating(cluster, "system:e2e-controller"))

    def stale_update(api: client.AppsV1Api, replicas: int) -> int:
        deployment = apps.read_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE)
        assert deployment.metadata is not None
        assert deployment.spec is not None
        deployment.metadata.resource_version = "1"
        deployment.spec.replicas = replicas
        try:
            api.replace_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE, deployment)
        except ApiException as e:
            return int(e.status)
        return 200

    with e2e.UnconditionalSpecUpdates(cluster, tmp_path) as webhook:
        assert stale_update(controller, 3) == 409
        assert stale_update(apps, 2) == 200
        assert webhook.unconditional == 1
        assert apps.read_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE).spec.replicas == 2
    assert stale_update(apps, 1) == 409
    assert not cluster.kubectl(
        "get", "mutatingwebhookconfiguration", e2e.WEBHOOK, "--ignore-not-found", "-o", "name"
    )


def _impersonating(cluster: Cluster, user: str) -> client.ApiClient:
    """An admin client acting as ``user`` (in system:masters, so only its name differs)."""
    api = e2e._new_api(cluster)
    api.default_headers |= {"Impersonate-User": user, "Impersonate-Group": "system:masters"}
    return api
