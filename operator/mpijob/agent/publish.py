"""Writes the GPU topology annotation onto the agent's own Node: the agent's only API call.

Uses the in-cluster service account when there is one, else the local kubeconfig. The agent's
RBAC needs ``patch`` on ``nodes``. Called by :mod:`mpijob.agent.main`.
"""

from __future__ import annotations

import kubernetes


class NodeAnnotator:
    """Patches one annotation on a Node (a merge patch: other annotations stay)."""

    def __init__(self) -> None:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        self._api = kubernetes.client.CoreV1Api()

    def __call__(self, node: str, key: str, value: str) -> None:
        self._api.patch_node(node, {"metadata": {"annotations": {key: value}}})
