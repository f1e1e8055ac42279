"""Pod-template steps shared by the worker and launcher builders.

Each step edits a deep copy of the user's template; the user's template is never modified.
Only ``containers[0]`` gets env, mounts and the default command, as upstream does.
"""

from __future__ import annotations

from typing import Any

from mpijob import keys
from mpijob.api import MPIJob, ReplicaSpec
from mpijob.objects import clone

ENV_JOB_ROLE = "K_MPI_JOB_ROLE"
#: hostNetwork pods need this to resolve the Service's short names.
DNS_CLUSTER_FIRST_WITH_HOST_NET = "ClusterFirstWithHostNet"


def copy_template(replica: ReplicaSpec | None) -> dict[str, Any]:
    """A deep copy of the replica's pod template with ``metadata`` and ``spec`` present."""
    template = clone(replica.template) if replica is not None else {}
    template["metadata"] = template.get("metadata") or {}
    template["spec"] = template.get("spec") or {}
    template["spec"]["containers"] = template["spec"].get("containers") or [{}]
    return template


def add_labels(template: dict[str, Any], labels: dict[str, str]) -> None:
    """Set ``labels`` on the template, over any the user set under the same keys."""
    template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **labels}


def set_host(template: dict[str, Any], job: MPIJob, hostname: str) -> None:
    """Give the pod its stable DNS name ``<hostname>.<job>`` under the job's Service."""
    spec = template["spec"]
    spec["hostname"] = hostname
    spec["subdomain"] = job.name
    if spec.get("hostNetwork"):
        spec["dnsPolicy"] = DNS_CLUSTER_FIRST_WITH_HOST_NET


def restart_policy(replica: ReplicaSpec | None) -> str:
    """The pod restart policy of a replica spec; ``ExitCode`` is the operator's, pods get Never."""
    policy = replica.restart_policy if replica is not None else ""
    return keys.RESTART_NEVER if policy == keys.RESTART_EXIT_CODE else policy


def append_env(template: dict[str, Any], env: list[dict[str, str]]) -> None:
    """Append ``env`` after the user's variables on the first container."""
    container = template["spec"]["containers"][0]
    container["env"] = [*(container.get("env") or []), *env]


def env_var(name: str, value: str) -> dict[str, str]:
    """One container env entry."""
    return {"name": name, "value": value}
