"""Upstream's own end-to-end suite, compiled unmodified, passes against this operator.

``test/e2e`` of the pinned kubeflow/mpi-operator (``MPI_OPERATOR_VERSION``), built from the Go
module proxy by ``hack/build-bins.sh e2e``, runs its fourteen specs on the local cluster: MPI jobs
in real containers on the real node, the operator as the Deployment ``mpi-operator/mpi-operator``
the suite scales and edits, scheduler-plugins' scheduler as its second scheduler and a stand-in
for Volcano's (tests/support/upstream_e2e.py says how each is made; the README's Tests section why).
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

from support import upstream_e2e as e2e
from support.kube import ROOT, Cluster
from support.realnode import ready_real_node
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

# The suite waits up to 200 s per step (its foreverTimeout); fourteen specs pass in a few minutes.
SUITE_TIMEOUT = 1800
SPEC_COUNT = 14


@pytest.fixture
def operator_deployment(crds: Cluster) -> Iterator[Cluster]:
    """The standalone install's namespace, ServiceAccount and RBAC, and the suite's Deployment."""
    crds.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        str(ROOT / "manifests/overlays/standalone"),
    )
    crds.apply(e2e.operator_deployment())
    yield crds
    crds.kubectl("delete", "deployment", e2e.DEPLOYMENT, "-n", e2e.NAMESPACE, "--wait=false")


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
        e2e.OperatorPods(cluster, tmp_path) as operators,
        e2e.sched_plugins_scheduler(cluster, tmp_path),
        e2e.VolcanoStandIn(cluster, node),
    ):
        e2e.wait_available(cluster)
        results, code, log = e2e.run_suite(
            binary, cluster, tmp_path, sorted(unrunnable), timeout=SUITE_TIMEOUT
        )
    wall = e2e.elapsed(t0)

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
            f"\nupstream e2e (kubeflow/mpi-operator test/e2e), operator processes started: "
            f"{operators.started}"
        )
        print("\n".join(lines))
        print(f"{passed} passed, {failed} failed ({wall}; suite log {log})")

    failures = "\n\n".join(f"{r.name}:\n{r.message[:3000]}" for r in results if r.outcome == "FAIL")
    assert passed == SPEC_COUNT, f"suite exit {code}; log {log}\n{failures}"
    assert code == 0, log
    # The suite restarted the Deployment's pod for each gang-scheduling and cluster-domain spec.
    assert operators.started >= 4


def test_deployment_pods_are_operator_processes_with_their_args(
    operator_deployment: Cluster, tmp_path: Path
) -> None:
    """The stand-in for the operator's pod follows the Deployment as a kubelet would: scaled to
    0 it stops, scaled back with an appended flag it runs with that flag."""
    cluster = operator_deployment
    apps = client.AppsV1Api(cluster.api)
    with e2e.OperatorPods(cluster, tmp_path) as operators:
        e2e.wait_available(cluster)
        (first,) = operators.processes.values()
        assert "--cluster-domain=example.org" not in first.args

        apps.patch_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE, {"spec": {"replicas": 0}})
        wait_until(
            lambda: not operators.processes and first.proc.poll() is not None,
            timeout=60,
            what="the operator process to stop",
        )
        deployment = apps.read_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE)
        args = [*deployment.spec.template.spec.containers[0].args, "--cluster-domain=example.org"]
        deployment.spec.template.spec.containers[0].args = args
        deployment.spec.replicas = 1
        apps.replace_namespaced_deployment(e2e.DEPLOYMENT, e2e.NAMESPACE, deployment)

        def restarted() -> list[e2e.HostProcess]:
            return [
                p
                for p in operators.processes.values()
                if p.ready and p.args[-2:] == ["--cluster-domain=example.org", p.args[-1]]
            ]

        (second,) = wait_until(restarted, timeout=120, what="the operator with the new flag")
        assert second.proc.poll() is None
        assert len(operators.processes) == 1
