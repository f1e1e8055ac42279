"""MPIJob access for tests: create, read, patch, and wait on conditions and Events."""

from __future__ import annotations

from typing import Any

from support.kube import Cluster
from support.wait import wait_until


class MPIJobs:
    """MPIJob access in one namespace, through the dynamic client."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.api = cluster.resource("kubeflow.org/v2beta1", "MPIJob")
        self.decisions = cluster.resource("mpijob.io/v1alpha1", "PlacementDecision")

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.create(body=body, namespace=self.namespace).to_dict()

    def get(self, name: str) -> dict[str, Any]:
        return self.api.get(name=name, namespace=self.namespace).to_dict()

    def decision(self, name: str) -> dict[str, Any] | None:
        """The job's PlacementDecision, as the operator wrote it; None when it holds none."""
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self.decisions.get(name=name, namespace=self.namespace).to_dict()
        except NotFoundError:
            return None

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch(
            name=name,
            namespace=self.namespace,
            body=patch,
            content_type="application/merge-patch+json",
        ).to_dict()

    def delete(self, name: str) -> None:
        self.api.delete(name=name, namespace=self.namespace)

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for c in (self.get(name).get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return dict(c)
        return None

    def wait_condition(
        self, name: str, type_: str, status: str = "True", timeout: float = 60
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            c = self.condition(name, type_)
            return c if c and c["status"] == status else None

        return wait_until(probe, timeout=timeout, what=f"MPIJob {name} {type_}={status}")

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.cluster.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        items.sort(key=lambda e: (e.first_timestamp or e.event_time or 0, e.metadata.name))
        return [
            {
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
                "count": e.count,
                "component": e.source.component if e.source else None,
            }
            for e in items
        ]

    def wait_event(self, name: str, reason: str, timeout: float = 30) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next((e for e in self.events(name) if e["reason"] == reason), None)

        return wait_until(probe, timeout=timeout, what=f"event {reason} on {name}")
