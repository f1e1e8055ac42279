"""Tenants as a cluster gives them: users bound, in their own namespace only, to Kubernetes'
``edit`` role and Kubeflow's MPIJob edit role (the kubeflow overlay's aggregated roles)."""

from __future__ import annotations

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
