"""Writes the GPU topology annotation onto the agent's own Node: the agent's only API call.

Uses the in-cluster service account in a pod, else the local kubeconfig (the operator's
:func:`~mpijob.handlers.kube.configuration`). The agent's
RBAC needs ``patch`` on ``nodes``. Called by :mod:`mpijob.agent.main`.
"""

from __future__ import annotations

import kubernetes

from mpijob.handlers.kube import configuration


class NodeAnnotator:
    """Patches one annotation on a Node (a merge patch: other annotations stay)."""

    def __init__(self) -> None:
        api = kubernetes.client.ApiClient(configuration())
        self._api = kubernetes.client.CoreV1Api(api)

    def __call__(self, node: str, key: str, value: str) -> None:
        self._api.patch_node(node, {"metadata": {"annotations": {key: value}}})
