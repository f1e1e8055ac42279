"""Least privilege: the operator and the agent get exactly what their code calls."""

from __future__ import annotations

import pytest
from manifests_files import (
    AGENT_RBAC,
    OPERATOR_RBAC,
    ROOT,
    documents,
    one,
    operator_permissions,
)

from mpijob.shares.pod_edits import WEBHOOK_CONFIGURATION

pytestmark = pytest.mark.unit


def grants(group: str, resources: str, verbs: str) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources.split() for v in verbs.split()}


#: What the operator's code calls today (platform/kube.py, recorder, leader election, Kopf).
OPERATOR_CLUSTER = (
    grants("kubeflow.org", "mpijobs", "list watch")
    | grants("kubeflow.org", "mpijobs/status", "update")
    | grants("", "pods", "get list watch create delete")
    | grants("", "services", "get list watch create patch")
    | grants("", "configmaps", "get list watch create patch")
    | grants("", "secrets", "get create update")
    | grants("", "events", "list create patch")
    | grants("batch", "jobs", "get list watch create patch update delete")
    | grants("batch", "jobs/status", "patch")
    | grants("scheduling.x-k8s.io", "podgroups", "get list watch create patch delete")
    | grants("scheduling.volcano.sh", "podgroups", "get list watch create patch delete")
    | grants("scheduling.k8s.io", "podgroups", "get list watch create patch delete")
    | grants("scheduling.k8s.io", "workloads", "get create")
    | grants("scheduling.k8s.io", "priorityclasses", "list watch")
    | grants("mpijob.io", "placementdecisions", "get list watch create update delete")
    | grants("resource.k8s.io", "resourceclaims", "get list watch create delete")
    | grants("resource.k8s.io", "resourceslices", "list watch")
    | grants("resource.k8s.io", "deviceclasses", "get list watch")
    | grants("resource.nvidia.com", "computedomains", "get create")
    | grants("topology.volcano.sh", "hypernodes", "list")
    | grants("", "resourcequotas", "list watch")
    | grants("", "nodes", "get list watch")
    | grants("", "namespaces", "list watch")
    | grants("apiextensions.k8s.io", "customresourcedefinitions", "list watch")
)
OPERATOR_LOCK_NAMESPACE = grants("coordination.k8s.io", "leases", "get create update")


def test_operator_gets_exactly_what_it_uses() -> None:
    cluster, namespaced = operator_permissions()
    assert cluster == OPERATOR_CLUSTER
    assert namespaced == OPERATOR_LOCK_NAMESPACE


def test_no_wildcards_and_no_secret_deletion_or_patching() -> None:
    cluster, namespaced = operator_permissions()
    everything = cluster | namespaced
    assert not any("*" in part for grant in everything for part in grant)
    # Secrets are read by name, never listed or watched (a watch would bring every Secret of
    # the cluster to the operator); it only ever replaces its own, never deletes or patches.
    assert not {("", "secrets", verb) for verb in ("list", "watch", "delete", "patch")} & everything


def test_bindings_name_the_operator_service_account() -> None:
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(OPERATOR_RBAC, kind)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": one(OPERATOR_RBAC, role_kind)["metadata"]["name"],
        }
        # No namespace: kustomize sets the ServiceAccount's, per overlay.
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mpijob-operator"}]


#: What the agent's code calls (agent/publish.py): its Node's topology annotation; the pods of
#: its node and their mpijob.io/gpu-actual; Events on MPIJobs; its node's ResourceSlices; on
#: core_mem nodes, its Node's status (the GPU-share extended resources).
AGENT_CLUSTER = (
    grants("", "nodes", "get patch")
    | grants("", "nodes/status", "patch")
    | grants("", "pods", "list patch")
    | grants("", "events", "create")
    | grants("resource.k8s.io", "resourceslices", "list")
)


def test_agent_gets_exactly_what_it_uses() -> None:
    role = one(AGENT_RBAC, "ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == AGENT_CLUSTER
    # Reading pods is list only (field selector on its node): no get, no watch, no delete.
    assert not {("", "pods", v) for v in ("get", "watch", "delete", "update")} & granted
    binding = one(AGENT_RBAC, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mpijob-agent"}]
    assert [d["kind"] for d in documents(AGENT_RBAC)] == ["ClusterRole", "ClusterRoleBinding"]


def test_the_share_overlay_lets_the_operator_patch_its_own_webhook_configurations_only() -> None:
    """Who may create an admission webhook configuration may intercept any request: the
    overlay ships ours, and the operator may only patch them, by name."""
    overlay = ROOT / "manifests" / "overlays" / "fractional-gpus"
    role = one(overlay / "webhook-rbac.yaml", "ClusterRole")
    shipped = {
        (d["kind"], d["metadata"]["name"])
        for d in documents(overlay / "webhook-configurations.yaml")
    }
    assert shipped == {
        ("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
        ("ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
    }
    kustomization = documents(overlay / "kustomization.yaml")[0]
    assert "webhook-configurations.yaml" in kustomization["resources"]
    assert "share-records-policy.yaml" in kustomization["resources"]
    webhook_rules = [r for r in role["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
    assert webhook_rules
    for rule in webhook_rules:
        assert rule.get("resourceNames") == [WEBHOOK_CONFIGURATION], rule
        assert set(rule["verbs"]) <= {"get", "patch"}, rule
