"""Writes onto the agent's own Node: the GPU topology annotation and, on ``core_mem`` nodes,
the GPU-share extended resources in its status. The agent's only API calls.

Uses the in-cluster service account in a pod, else the local kubeconfig (the operator's
:func:`~mpijob.handlers.kube.configuration`). The agent's
RBAC needs ``patch`` on ``nodes`` and ``nodes/status``. Called by :mod:`mpijob.agent.main`.
"""

from __future__ import annotations

from typing import Any

import kubernetes

from mpijob.handlers.kube import configuration


class NodeAnnotator:
    """Patches one annotation on a Node (a merge patch: other annotations stay)."""

    def __init__(self) -> None:
        api = kubernetes.client.ApiClient(configuration())
        self._api = kubernetes.client.CoreV1Api(api)

    def __call__(self, node: str, key: str, value: str) -> None:
        self._api.patch_node(node, {"metadata": {"annotations": {key: value}}})


class NodeStatusPatcher:
    """Applies a JSON patch to a Node's status subresource."""

    def __init__(self) -> None:
        api = kubernetes.client.ApiClient(configuration())
        self._api = kubernetes.client.CoreV1Api(api)

    def __call__(self, node: str, body: list[dict[str, Any]]) -> None:
        # A list body is sent as application/json-patch+json by the client.
        self._api.patch_node_status(node, body)
