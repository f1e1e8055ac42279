"""Where the API server is and how to authenticate, for every program of the project.

One rule, one place: the pod's service account when running in a pod and no kubeconfig is
named (argument or ``$KUBECONFIG``), else the kubeconfig (the named file, else
``$KUBECONFIG``, else ``~/.kube/config``). The operator logs in through Kopf with it
(:func:`mpijob.platform.kube.connection_info`); the console and the node agent, synchronous
programs on the official ``kubernetes`` client, get a :func:`configuration`. This module
imports neither Kopf nor aiohttp nor orjson, so those programs load none of them.
"""

from __future__ import annotations

import os
from typing import Any


def in_cluster(kubeconfig: str | None = None) -> bool:
    """Whether the service account is the credential: in a pod, and no kubeconfig named."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (
        kubeconfig or os.environ.get("KUBECONFIG")
    )


#: Where the kubelet puts a pod's namespace beside its service account token.
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_pod() -> tuple[str, str] | None:
    """This process's pod, (namespace, name), when it runs in one that says its name
    (``POD_NAME`` from the downward API); None elsewhere."""
    name = os.environ.get("POD_NAME")
    if not name:
        return None
    try:
        with open(NAMESPACE_FILE, encoding="utf-8") as f:
            namespace = f.read().strip()
    except OSError:
        return None
    return (namespace, name) if namespace else None


def configuration(kubeconfig: str | None = None) -> Any:
    """The official client's ``Configuration`` for the synchronous programs (console, agent),
    with the credentials :func:`in_cluster` chooses.

    A new configuration each call; the client's global default is never touched. The client is
    imported here, not by the operator, which does not use it.
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    if in_cluster(kubeconfig):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return cfg
