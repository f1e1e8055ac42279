"""Installing with kustomize: every overlay builds, the standalone install runs a job under its
own ServiceAccount, and that account holds exactly the permissions of the RBAC file.

The local cluster runs no images, so the installed Deployment never starts a real process; the
test starts the operator itself with a token of the installed ServiceAccount, which proves the
RBAC is enough to run a job end to end (and leader election in the install's namespace).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import cli, keys
from support.jobs import mpijob
from support.kube import ROOT, Cluster, kubectl_binary
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess

pytestmark = pytest.mark.integration

OVERLAYS = ROOT / "manifests" / "overlays"
RBAC = ROOT / "manifests" / "base" / "rbac" / "operator.yaml"
INSTALL_NAMESPACE = "mpi-operator"
SERVICE_ACCOUNT = "mpijob-operator"

Grant = tuple[str, str, str]


def kustomize(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl_binary(), "kustomize", str(OVERLAYS / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name}"
    return found[0]


def operator_args(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The Deployment's args, parsed by the operator's own command line."""
    container = find(docs, "Deployment", "mpijob-operator")["spec"]["template"]["spec"]
    args = container["containers"][0]["args"]
    assert args[0] == "run"
    return dict(cli.run.make_context("run", list(args[1:])).params)


@pytest.mark.parametrize(
    ("overlay", "namespace", "gang"),
    [
        ("standalone", "mpi-operator", ""),
        ("kubeflow", "kubeflow", ""),
        ("scheduler-plugins", "mpi-operator", "scheduler-plugins-scheduler"),
        ("volcano", "mpi-operator", "volcano"),
        ("monitoring", "mpi-operator", ""),
        ("fractional-gpus", "mpi-operator", ""),
    ],
)
def test_overlay_builds(overlay: str, namespace: str, gang: str) -> None:
    docs = kustomize(overlay)
    params = operator_args(docs)
    assert params["lock_namespace"] == namespace
    assert params["gang_scheduling"] == gang
    assert params["monitoring_port"] == 8080
    assert params["health_port"] == 8081
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert {d["metadata"]["namespace"] for d in namespaced} == {namespace}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert {s["namespace"] for s in binding["subjects"]} == {namespace}
    crd = find(docs, "CustomResourceDefinition", "mpijobs.kubeflow.org")
    source = yaml.safe_load((ROOT / "crds" / "kubeflow.org_mpijobs.yaml").read_text())
    assert crd["spec"] == source["spec"]
    namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    # Kubeflow owns its namespace; the other overlays create theirs.
    assert namespaces == ([] if overlay == "kubeflow" else ["mpi-operator"])


def test_monitoring_overlay_ships_dashboard_rules_and_service_monitor() -> None:
    docs = kustomize("monitoring")
    dashboard = find(docs, "ConfigMap", "mpijob-operator-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["mpijob-operator.json"])
    assert shipped == json.loads((ROOT / "dashboards" / "mpijob-operator.json").read_text())
    rules = find(docs, "PrometheusRule", "mpijob-operator")
    assert rules["spec"] == yaml.safe_load((ROOT / "dashboards" / "rules.yaml").read_text())
    monitor = find(docs, "ServiceMonitor", "mpijob-operator")
    service = find(docs, "Service", "mpijob-operator-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_fractional_overlay_serves_the_webhooks_beside_the_operator() -> None:
    docs = kustomize("fractional-gpus")
    assert operator_args(docs)["fractional_gpus"] is True
    deployment = find(docs, "Deployment", "mpijob-operator")
    service = find(docs, "Service", "mpijob-operator-webhook")
    # The webhook configurations name the Service in the operator's (lock) namespace.
    assert service["metadata"].get("namespace") == deployment["metadata"]["namespace"]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    # Every replica serves the Secret's certificate and answers only the API server's client
    # certificate, whose CA the ConfigMap holds (docs/gpu-shares.md).
    args = operator_args(docs)
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts[args["webhook_cert_dir"]]]["secret"] == {
        "secretName": "mpijob-operator-webhook-tls"
    }
    ca_dir, ca_file = args["webhook_client_ca"].rsplit("/", 1)
    assert ca_file == "ca.crt"
    assert volumes[mounts[ca_dir]]["configMap"] == {"name": "mpijob-operator-webhook-client-ca"}


def test_kubeflow_overlay_adds_upstreams_aggregated_roles() -> None:
    docs = kustomize("kubeflow")
    edit = find(docs, "ClusterRole", "kubeflow-mpijobs-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.kubeflow.org/aggregate-to-kubeflow-edit"]
    find(docs, "ClusterRole", "kubeflow-mpijobs-admin")
    find(docs, "ClusterRole", "kubeflow-mpijobs-view")


# --- installed on the cluster ---------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The standalone overlay, applied (idempotent: other modules may have applied it too)."""
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-k", str(OVERLAYS / "standalone")
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/mpijobs.kubeflow.org",
        "crd/placementdecisions.mpijob.io",
    )
    return cluster


def service_account_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the installed ServiceAccount (a bound token)."""
    token = cluster.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", INSTALL_NAMESPACE, "--duration=1h"
    ).strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    # The admin's server and TLS settings (CA or skip-verify, whichever it has); our token.
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_standalone_install_runs_a_job_as_its_service_account(
    installed: Cluster,
    namespace: str,
    mpijobs: MPIJobs,
    tmp_path: Path,
) -> None:
    kubeconfig = service_account_kubeconfig(installed, tmp_path / "sa.kubeconfig")
    op = OperatorProcess(
        kubeconfig,
        namespace,
        tmp_path,
        "--leader-elect",
        f"--lock-namespace={INSTALL_NAMESPACE}",
    )
    op.start()
    try:
        mpijobs.create(
            mpijob(
                "installed",
                workers=2,
                launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
                run_policy={"cleanPodPolicy": "Running"},
            )
        )
        mpijobs.wait_condition("installed", "Succeeded", timeout=120)
        assert op.metric("mpi_operator_is_leader") == 1
        lease = installed.kubectl(
            "get", "lease", "mpijob-operator", "-n", INSTALL_NAMESPACE, "-o", "json"
        )
        assert json.loads(lease)["spec"]["holderIdentity"]
        logs = op.logs()
        assert "Forbidden" not in logs, logs[-3000:]
    finally:
        op.stop()


# --- the ServiceAccount's permissions --------------------------------------------------------

ROW = re.compile(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")


def can_i(cluster: Cluster, user: str, namespace: str) -> set[Grant]:
    """``kubectl auth can-i --list`` for ``user`` in ``namespace``, as (group, resource, verb)."""
    out = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace)
    grants: set[Grant] = set()
    for line in out.splitlines()[1:]:
        match = ROW.match(line)
        if not match:  # non-resource URLs start with blanks: not ours to compare
            continue
        name, _urls, resource_names, verbs = match.groups()
        assert not resource_names, line
        # "<resource>.<group>/<subresource>", e.g. "mpijobs.kubeflow.org/status".
        qualified, slash, subresource = name.partition("/")
        resource, _, group = qualified.partition(".")
        grants |= {(group, resource + slash + subresource, verb) for verb in verbs.split()}
    return grants


def rbac_file() -> tuple[set[Grant], set[Grant]]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]

    def flat(kind: str) -> set[Grant]:
        (role,) = [d for d in docs if d["kind"] == kind]
        return {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    return flat("ClusterRole"), flat("Role")


def test_service_account_holds_exactly_the_rbac_files_permissions(
    installed: Cluster, namespace: str
) -> None:
    """What the API server grants, less what every authenticated account gets, is the file."""
    account = f"system:serviceaccount:{INSTALL_NAMESPACE}:{SERVICE_ACCOUNT}"
    nobody = f"system:serviceaccount:{INSTALL_NAMESPACE}:no-such-account"
    cluster_wide, lock_namespace = rbac_file()
    for where, expected in (
        (namespace, cluster_wide),
        (INSTALL_NAMESPACE, cluster_wide | lock_namespace),
    ):
        baseline = can_i(installed, nobody, where)
        granted = can_i(installed, account, where) - baseline
        # No Secret of the cluster is listed or watched: the SSH Secrets are read by name.
        assert not {("", "secrets", "list"), ("", "secrets", "watch")} & granted
        assert granted == expected, (
            f"in {where}: extra {sorted(granted - expected)}, missing {sorted(expected - granted)}"
        )
