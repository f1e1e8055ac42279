"""The agent's API calls: its Node's topology annotation, the report on placed pods and, on
``core_mem`` nodes, the GPU-share extended resources in its Node's status.

Uses the in-cluster service account in a pod, else the local kubeconfig
(:func:`~mpijob.platform.credentials.configuration`). The agent's RBAC
(``manifests/base/rbac/agent.yaml``) allows exactly what is called here: ``get`` and
``patch`` nodes; ``patch`` ``nodes/status``; ``list`` and ``patch`` pods; ``create`` events;
``list`` ResourceSlices. Called by :mod:`mpijob.agent.main`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from mpijob import keys
from mpijob.api.models import format_time
from mpijob.objects import JSON
from mpijob.platform.credentials import configuration


class NodeAnnotator:
    """Patches one annotation on a Node (a merge patch: other annotations stay)."""

    def __init__(self) -> None:
        api = kubernetes.client.ApiClient(configuration())
        self._api = kubernetes.client.CoreV1Api(api)

    def __call__(self, node: str, key: str, value: str) -> None:
        self._api.patch_node(node, {"metadata": {"annotations": {key: value}}})


class AgentKube:
    """The calls of :class:`mpijob.agent.gpu_actual.NodeKube`, through the official client."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        self._client = kubernetes.client.ApiClient(configuration(kubeconfig))
        # The generated methods are typed loosely; read them as Any here.
        self._core: Any = kubernetes.client.CoreV1Api(self._client)
        self._custom: Any = kubernetes.client.CustomObjectsApi(self._client)
        self._node = node

    def node_pods(self, node: str) -> list[JSON]:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return [self._client.sanitize_for_serialization(p) for p in pods.items]

    def node_slices(self, node: str) -> list[JSON]:
        group, version = keys.DRA_API_VERSION.split("/")
        try:
            result = self._custom.list_cluster_custom_object(
                group, version, "resourceslices", field_selector=f"spec.nodeName={node}"
            )
        except ApiException as exc:
            if exc.status == 404:  # resource.k8s.io/v1 not served: no DRA here
                return []
            raise
        return list(result.get("items", []))

    def annotate_pod(self, namespace: str, name: str, key: str, value: str | None) -> None:
        self._core.patch_namespaced_pod(
            name, namespace, {"metadata": {"annotations": {key: value}}}
        )

    def post_event(self, involved: JSON, type_: str, reason: str, message: str) -> None:
        now = format_time(datetime.now(UTC))
        namespace = str(involved.get("namespace"))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved.get('name')}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": keys.AGENT_COMPONENT, "host": self._node},
            "reportingComponent": keys.AGENT_COMPONENT,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._core.create_namespaced_event(namespace, body)


class NodeStatusPatcher:
    """Applies a JSON patch to a Node's status subresource."""

    def __init__(self) -> None:
        api = kubernetes.client.ApiClient(configuration())
        self._api = kubernetes.client.CoreV1Api(api)

    def __call__(self, node: str, body: list[dict[str, Any]]) -> None:
        # A list body is sent as application/json-patch+json by the client.
        self._api.patch_node_status(node, body)


class NodePods:
    """One pod bound to the agent's node, for the CSI node service
    (:class:`mpijob.agent.csi.PodReader`): a list with the field selectors ``metadata.name`` and
    ``spec.nodeName``, so the agent reads no pod of another node (RBAC cannot narrow ``list``
    to one node; the agent never asks for more)."""

    def __init__(self) -> None:
        self._client = kubernetes.client.ApiClient(configuration())
        self._core: Any = kubernetes.client.CoreV1Api(self._client)

    def __call__(self, namespace: str, name: str, node: str) -> JSON | None:
        pods = self._core.list_namespaced_pod(
            namespace, field_selector=f"metadata.name={name},spec.nodeName={node}"
        )
        if not pods.items:
            return None
        found: JSON = self._client.sanitize_for_serialization(pods.items[0])
        return found
