"""Tenants as a cluster gives them: users bound, in their own namespace only, to Kubernetes'
``edit`` role and Kubeflow's MPIJob edit role (the kubeflow overlay's aggregated roles)."""

from __future__ import annotations

from typing import Any

from kubernetes import client, config

from mpijob import keys
from support.kube import ROOT, Cluster


def bind_tenant(cluster: Cluster, namespace: str, user: str) -> str:
    """Give ``user`` the two roles in ``namespace``; returns ``user``."""
    roles = ROOT / "manifests" / "overlays" / "kubeflow" / "user-roles.yaml"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(roles))
    for role in ("edit", "kubeflow-mpijobs-edit"):
        binding = cluster.kubectl(
            "create",
            "rolebinding",
            f"{user.split('@', maxsplit=1)[0]}-{role}",
            f"--clusterrole={role}",
            f"--user={user}",
            "-n",
            namespace,
            "--dry-run=client",
            "-o",
            "yaml",
        )
        cluster.apply(binding, namespace)
    return user


def can_i(
    cluster: Cluster, user: str, namespace: str, verb: str, resource: str, subresource: str = ""
) -> bool:
    """What RBAC answers for ``user`` (``kubectl auth can-i --as``)."""
    extra = [f"--subresource={subresource}"] if subresource else []
    out = cluster.kubectl(
        "auth", "can-i", verb, resource, *extra, f"--as={user}", "-n", namespace, check=False
    )
    return out.strip() == "yes"


class TenantJobs:
    """MPIJobs and pods as ``user`` writes them: every request impersonated, so RBAC and
    admission judge it as they would the tenant's own credentials."""

    def __init__(self, cluster: Cluster, namespace: str, user: str) -> None:
        self.namespace = namespace
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        group, version = keys.API_VERSION.split("/")
        out = self.custom.create_namespaced_custom_object(
            group, version, self.namespace, "mpijobs", body
        )
        return dict(out)

    def patch_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the MPIJob's ``status``, which ``kubeflow-mpijobs-edit`` grants."""
        group, version = keys.API_VERSION.split("/")
        out = self.custom.patch_namespaced_custom_object_status(
            group, version, self.namespace, "mpijobs", name, patch
        )
        return dict(out)

    def create_pod(self, body: dict[str, Any]) -> Any:
        return self.core.create_namespaced_pod(self.namespace, body)
