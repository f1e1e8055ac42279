"""The one adapter between the operator and the Kubernetes API: async calls on plain dicts.

It drives the official ``kubernetes`` client's ``ApiClient.call_api`` in a bounded thread pool, so
Kopf's event loop never blocks, and skips the client's model classes: objects stay plain JSON
dicts, as the builders produce them, which is also several times cheaper than deserializing
into models. Every request is counted by verb for ``mpi_operator_api_requests_total``.

:func:`configuration` is the one way the operator, its leader election, the console and the
agent load credentials. Only the handlers and the entrypoints (console, agent) import the
``kubernetes`` package.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from mpijob import metrics

JSON = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    prefix: str
    plural: str
    namespaced: bool = True


KINDS: Mapping[tuple[str, str], Kind] = {
    ("v1", "Pod"): Kind("/api/v1", "pods"),
    ("v1", "Service"): Kind("/api/v1", "services"),
    ("v1", "ConfigMap"): Kind("/api/v1", "configmaps"),
    ("v1", "Secret"): Kind("/api/v1", "secrets"),
    ("v1", "Event"): Kind("/api/v1", "events"),
    ("v1", "Node"): Kind("/api/v1", "nodes", namespaced=False),
    ("batch/v1", "Job"): Kind("/apis/batch/v1", "jobs"),
    ("kubeflow.org/v2beta1", "MPIJob"): Kind("/apis/kubeflow.org/v2beta1", "mpijobs"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): Kind(
        "/apis/scheduling.x-k8s.io/v1alpha1", "podgroups"
    ),
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): Kind(
        "/apis/scheduling.volcano.sh/v1beta1", "podgroups"
    ),
    ("mpijob.io/v1alpha1", "PlacementDecision"): Kind(
        "/apis/mpijob.io/v1alpha1", "placementdecisions"
    ),
    ("resource.k8s.io/v1", "ResourceClaim"): Kind("/apis/resource.k8s.io/v1", "resourceclaims"),
    ("resource.k8s.io/v1", "DeviceClass"): Kind(
        "/apis/resource.k8s.io/v1", "deviceclasses", namespaced=False
    ),
    ("scheduling.k8s.io/v1", "PriorityClass"): Kind(
        "/apis/scheduling.k8s.io/v1", "priorityclasses", namespaced=False
    ),
}


def configuration(kubeconfig: str | None = None) -> client.Configuration:
    """Credentials for the cluster: the in-cluster service account when running in a pod and no
    kubeconfig is named (argument or ``$KUBECONFIG``), else the kubeconfig (the named file, else
    ``~/.kube/config``).

    Returns a new configuration and never touches the client's global default, so several
    clients in one process cannot overwrite each other's settings.
    """
    cfg = client.Configuration()
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if in_pod and not kubeconfig and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return cfg


class ApiError(Exception):
    """A non-2xx answer, with the API's own reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @classmethod
    def from_exception(cls, exc: ApiException) -> ApiError:
        reason, message = str(exc.reason or ""), str(exc.body or "")
        try:
            body = json.loads(exc.body or "{}")
        except (TypeError, ValueError):
            body = {}
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or message)
        return cls(int(exc.status or 0), reason, message)


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    try:
        k = KINDS[api_version, kind]
    except KeyError:
        raise ValueError(f"unsupported kind {api_version}/{kind}") from None
    parts = [k.prefix]
    if k.namespaced and namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(k.plural)
    if name:
        parts.append(name)
    return "/".join(parts)


class Kube:
    """Async JSON access to the API server through the official client."""

    def __init__(self, api_client: client.ApiClient, *, concurrency: int = 16) -> None:
        api_client.configuration.connection_pool_maxsize = concurrency
        self._api = api_client
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None, *, qps: float, burst: int, concurrency: int
    ) -> Kube:
        """A client with :func:`configuration`'s credentials."""
        api = client.ApiClient(configuration(kubeconfig))
        api.user_agent = "mpijob-operator"
        kube = cls(api, concurrency=concurrency)
        kube._limiter = TokenBucket(qps, burst) if qps > 0 else None
        return kube

    _limiter: TokenBucket | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._api.close()

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        if self._limiter is not None:
            await self._limiter.take()
        metrics.API_REQUESTS.labels(verb=method.lower()).inc()
        loop = asyncio.get_running_loop()

        def call() -> JSON:
            method_, full_url, headers, data, _ = self._api.param_serialize(
                method,
                url,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            try:
                resp = self._api.call_api(method_, full_url, header_params=headers, body=data)
            except ApiException as exc:
                raise ApiError.from_exception(exc) from None
            raw = resp.read()
            if resp.status >= 400:
                raise ApiError.from_exception(
                    ApiException(status=resp.status, reason=resp.reason, body=raw)
                )
            return json.loads(raw) if raw else {}

        return await loop.run_in_executor(self._pool, call)

    # --- verbs on objects -------------------------------------------------------------------

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> JSON | None:
        try:
            return await self.request("GET", path(api_version, kind, namespace, name))
        except ApiError as e:
            if e.not_found:
                return None
            raise

    async def list(
        self, api_version: str, kind: str, namespace: str | None, *, labels: str = ""
    ) -> list[JSON]:
        query = {"labelSelector": labels} if labels else None
        result = await self.request("GET", path(api_version, kind, namespace), query=query)
        return list(result.get("items", []))

    async def create(self, obj: JSON) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return await self.request("POST", url, obj)

    async def replace(self, obj: JSON) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.request("PUT", url, obj)

    async def replace_status(self, obj: JSON) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.request("PUT", url + "/status", obj)

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: JSON,
        *,
        subresource: str = "",
    ) -> JSON:
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self.request("PATCH", url, patch, content_type="application/merge-patch+json")

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete by name (and uid, when given, so a same-named successor is safe)."""
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path(api_version, kind, namespace, name), body)
        except ApiError as e:
            if e.not_found or e.conflict:
                return False
            raise
        return True


class TokenBucket:
    """Client-side QPS/burst limit, as client-go applies with --kube-api-qps/--kube-api-burst."""

    def __init__(self, qps: float, burst: int) -> None:
        self._rate = qps
        self._capacity = float(max(burst, 1))
        self._tokens = self._capacity
        self._last = 0.0
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            loop = asyncio.get_running_loop()
            now = loop.time()
            if self._last:
                self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
            self._last = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self._rate)
                self._last = loop.time()
                self._tokens = 0.0
            else:
                self._tokens -= 1
