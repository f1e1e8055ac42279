"""The Helm chart (charts/mpijob-operator): clean to Helm's linter, the same objects as the
kustomize overlays for each overlay's values, and installed, upgraded and uninstalled with Helm
on the local cluster, the operator from its own image on a real node.

The chart's templates are generated from the overlays (hack/gen_chart.py; ``make lint`` checks
they are current); these tests render both with the real tools and compare the objects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hack import gen_chart, incluster
from mpijob import keys
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.realnode import exit_codes, launcher_log, on_real_node, pods, ready_real_node
from support.wait import wait_until

pytestmark = pytest.mark.integration

NS = incluster.NAMESPACE
RELEASE = incluster.RELEASE
TIMEOUT = 180
#: What the chart leaves to Helm or to the cluster admin: the Namespace (``--create-namespace``)
#: and the CRDs (the chart's crds/, compared on their own).
NOT_TEMPLATES = ("Namespace", "CustomResourceDefinition")


def by_ident(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found = {gen_chart.ident(d): d for d in docs if d["kind"] not in NOT_TEMPLATES}
    assert len(found) == len([d for d in docs if d["kind"] not in NOT_TEMPLATES])
    return found


def test_helm_lint_is_clean() -> None:
    out = incluster.helm("lint", "--strict", str(gen_chart.CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out, out
    assert "[ERROR]" not in out, out


@pytest.mark.parametrize("overlay", list(gen_chart.OVERLAY_VALUES))
def test_each_overlay_has_values_that_render_its_objects(overlay: str) -> None:
    namespace, values = gen_chart.OVERLAY_VALUES[overlay]
    chart = by_ident(gen_chart.helm_template(namespace, values))
    kustomize = by_ident(gen_chart.render(overlay))
    assert sorted(chart) == sorted(kustomize)
    for ident, obj in kustomize.items():
        assert chart[ident] == obj, ident


def test_the_charts_crds_are_the_overlays() -> None:
    chart = [
        d
        for d in gen_chart.helm_template(NS, [], "--include-crds")
        if d["kind"] == "CustomResourceDefinition"
    ]
    kustomize = [
        d for d in gen_chart.render("standalone") if d["kind"] == "CustomResourceDefinition"
    ]
    assert by_ident_all(chart) == by_ident_all(kustomize)


def by_ident_all(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """CRDs compared without the labels kustomize's base adds to every object."""
    out = {}
    for doc in docs:
        copy = json.loads(json.dumps(doc))
        copy["metadata"].pop("labels", None)
        out[gen_chart.ident(copy)] = copy
    return out


def test_the_schema_refuses_a_wrong_value_naming_it() -> None:
    with pytest.raises(SystemExit, match="gpuBinding"):
        gen_chart.helm_template(NS, ["gpuBinding=pinned"])
    with pytest.raises(SystemExit, match="leaderElection"):
        gen_chart.helm_template(NS, ["replicas=2", "leaderElection=false"])


# --- installed with Helm on the local cluster -------------------------------------------------

#: Objects of the install, by kind, that carry the base's part-of label.
KINDS = (
    "deployment,daemonset,service,serviceaccount,role,rolebinding,configmap",
    "clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,"
    "csidriver,mutatingwebhookconfiguration,validatingwebhookconfiguration",
)
PART_OF = "app.kubernetes.io/part-of=mpijob-operator"


def installed(cluster: Cluster) -> set[str]:
    """Every object of an install still in the cluster (CRDs aside), as kind/name."""
    namespaced = cluster.kubectl("get", KINDS[0], "-n", NS, "-l", PART_OF, "-o", "name")
    scoped = cluster.kubectl("get", KINDS[1], "-l", PART_OF, "-o", "name")
    webhooks = cluster.kubectl(
        "get", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "-o", "name"
    )
    gpu_share = {w for w in webhooks.split() if w.endswith("/mpijob-gpu-share")}
    return set(namespaced.split()) | set(scoped.split()) | gpu_share


@pytest.fixture
def helm_cluster(crds: Cluster) -> Iterator[Cluster]:
    """The cluster with its real nodes and no install of the operator in the way (an earlier
    kustomize install leaves its RBAC, which Helm would refuse to adopt); afterwards, nothing of
    the release."""
    ready_real_node(crds)
    incluster.undeploy()
    crds.kubectl("delete", KINDS[0], "-n", NS, "-l", PART_OF, "--ignore-not-found")
    crds.kubectl("delete", KINDS[1], "-l", PART_OF, "--ignore-not-found")
    # test_fractional.py applies the agent's CSIDriver from the base as it is, without the
    # overlays' labels: Helm refuses to adopt an object of its release it did not make.
    crds.kubectl("delete", "csidriver", keys.MPS_CSI_DRIVER, "--ignore-not-found")
    yield crds
    incluster.helm("uninstall", RELEASE, "--namespace", NS, "--wait", check=False)
    incluster.undeploy()


def job_pods(cluster: Cluster, namespace: str, job: str) -> set[str]:
    """The uids of a job's launcher and worker pods."""
    roles = (keys.ROLE_LAUNCHER, keys.ROLE_WORKER)
    return {p.metadata.uid for role in roles for p in pods(cluster, namespace, job, role)}


def operator_pod(cluster: Cluster) -> Any:
    selector = "app.kubernetes.io/name=mpijob-operator,app.kubernetes.io/component=operator"
    live = [
        p
        for p in cluster.core.list_namespaced_pod(NS, label_selector=selector).items
        if p.metadata.deletion_timestamp is None
    ]
    (pod,) = live
    return pod


@pytest.mark.realnode
def test_helm_install_runs_pi_on_a_real_node_upgrade_keeps_a_job_uninstall_keeps_the_crds(
    helm_cluster: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    cluster = helm_cluster
    watched = f"namespaces={{{namespace}}}"
    notes = incluster.helm_install(watched)
    assert "kubectl delete crd mpijobs.kubeflow.org" in notes, notes  # NOTES say what stays
    pod = operator_pod(cluster)
    assert pod.spec.node_name.startswith("real-node-")
    image = pod.spec.containers[0].image
    assert image.startswith("mpijob.local/mpijob-operator:"), image
    assert pod.spec.containers[0].args[-1] == f"--namespace={namespace}"
    release = json.loads(incluster.helm("list", "--namespace", NS, "--output", "json"))
    assert [(r["name"], r["status"]) for r in release] == [(RELEASE, "deployed")]

    # Upstream's pi example, run by the operator Helm installed, on the real node.
    body = on_real_node(yaml.safe_load((ROOT / "examples" / "pi.yaml").read_text()))
    cluster.apply(body, namespace=namespace)
    mpijobs.wait_condition("pi", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    launchers = pods(cluster, namespace, "pi", keys.ROLE_LAUNCHER)
    assert all(0 in exit_codes(p) for p in launchers), [exit_codes(p) for p in launchers]
    assert "pi is approximately" in launcher_log(cluster, namespace, "pi")

    # helm upgrade to a new image tag while a job runs: the job goes on to Succeeded, its
    # children untouched. Its launcher (on a simulated node) runs until told to finish, which
    # it is once the new release runs.
    from support.jobs import mpijob

    mpijobs.create(mpijob("in-flight", workers=2, run_policy={"cleanPodPolicy": "None"}))
    mpijobs.wait_condition("in-flight", keys.COND_RUNNING, timeout=TIMEOUT)
    wait_until(
        lambda: len(pods(cluster, namespace, "in-flight", keys.ROLE_WORKER)) == 2,
        timeout=60,
        what="the in-flight job's workers",
    )
    before = job_pods(cluster, namespace, "in-flight")
    new_image = incluster.retag(image, f"{image.rsplit(':', 1)[1]}-next")
    t0 = time.monotonic()
    incluster.helm_install(watched, verb="upgrade", image=new_image)
    upgraded = operator_pod(cluster)
    assert upgraded.spec.containers[0].image == new_image
    assert upgraded.metadata.name != pod.metadata.name
    print(f"[helm] upgrade to the new pod Ready: {time.monotonic() - t0:.1f}s")
    assert mpijobs.condition("in-flight", keys.COND_SUCCEEDED) is None
    (launcher,) = pods(cluster, namespace, "in-flight", keys.ROLE_LAUNCHER)
    cluster.core.patch_namespaced_pod(
        launcher.metadata.name,
        namespace,
        {"metadata": {"annotations": {keys.SIM_SUCCEED_AFTER: "1s"}}},
    )
    mpijobs.wait_condition("in-flight", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    assert job_pods(cluster, namespace, "in-flight") == before
    revisions = json.loads(incluster.helm("history", RELEASE, "-n", NS, "--output", "json"))
    assert [r["status"] for r in revisions] == ["superseded", "deployed"]

    # helm uninstall: nothing of the release is left but the CRDs, and the jobs they hold.
    out = incluster.helm("uninstall", RELEASE, "--namespace", NS, "--wait")
    assert f'release "{RELEASE}" uninstalled' in out, out
    wait_until(lambda: not installed(cluster), timeout=120, what="the release's objects gone")
    crds = cluster.kubectl("get", "crd", "-o", "name").split()
    assert "customresourcedefinition.apiextensions.k8s.io/mpijobs.kubeflow.org" in crds
    assert "customresourcedefinition.apiextensions.k8s.io/placementdecisions.mpijob.io" in crds
    assert mpijobs.get("pi")["metadata"]["name"] == "pi"


def test_the_readmes_helm_install_is_the_one_tested() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Install on a cluster\n", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("helm install ")]
    assert line.split() == [
        "helm", "install", RELEASE, str(incluster.CHART.relative_to(ROOT)),
        "-n", NS, "--create-namespace",
    ]  # fmt: skip
