"""The operator's one adapter to the Kubernetes API: async calls on plain dicts.

Requests go out on Kopf's own event loop through aiohttp (the library Kopf watches with), with
the credentials Kopf logs in with (:func:`connection_info`: the pod's service account, else the
kubeconfig), so the operator's writes and its watches always authenticate alike. Objects stay
plain JSON dicts, as the builders produce them, encoded and decoded by orjson (every create
returns the whole object: decoding is a good part of a request's cost). Every request is
counted by verb for ``mpi_operator_api_requests_total``.

Client-side rate limits follow upstream's clients: ``--kube-api-qps``/``--kube-api-burst``
apply per API client, and upstream has one client for the core and batch kinds (Events
included), one for MPIJobs, one per PodGroup API and one for leader election; so each of those
API groups has its own token bucket here (:func:`bucket_of`).

The console and the node agent are synchronous programs and use the official ``kubernetes``
client, with credentials from :func:`mpijob.platform.credentials.configuration`.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf
import orjson

from mpijob import keys, metrics
from mpijob.objects import JSON
from mpijob.platform import credentials
from mpijob.platform.ratelimit import TokenBucket

REQUEST_TIMEOUT_SECONDS = 60.0


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
    ("topology.volcano.sh/v1alpha1", "HyperNode"): Kind(
        "/apis/topology.volcano.sh/v1alpha1", "hypernodes", namespaced=False
    ),
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): Kind(
        "/apis/resource.nvidia.com/v1beta1", "computedomains"
    ),
}


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
    def from_response(cls, status: int, reason: str, raw: bytes) -> ApiError:
        """From a non-2xx answer: the API's Status ``reason`` and ``message`` when it sent one."""
        message = raw.decode(errors="replace")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or message)
        return cls(status, reason, message)


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


def connection_info(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """Kopf's connection info with the credentials :func:`credentials.in_cluster` chooses: the
    service account, else the kubeconfig (the named file, else ``$KUBECONFIG``, else
    ``~/.kube/config``); the operator's Kopf login handler logs in with it too."""
    settings = kopf.OperatorSettings()
    info = None
    if credentials.in_cluster(kubeconfig):
        info = kopf.login_with_service_account(settings=settings)
    elif kubeconfig:
        # Kopf reads the file from $KUBECONFIG only; name it there for this one read.
        before = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = kubeconfig
        try:
            info = kopf.login_with_kubeconfig(settings=settings)
        finally:
            if before is None:
                del os.environ["KUBECONFIG"]
            else:
                os.environ["KUBECONFIG"] = before
    else:
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("No credentials: no service account token and no kubeconfig")
    return info


#: API path prefixes with their own client-side rate limit, as upstream's separate clients
#: (MPIJobs, each PodGroup API, and leader election's Lease).
OWN_BUCKETS = (
    f"/apis/{keys.GROUP}/",
    "/apis/coordination.k8s.io/",
    f"/apis/{keys.VOLCANO_POD_GROUP_API_VERSION.split('/')[0]}/",
    f"/apis/{keys.SCHED_PLUGINS_POD_GROUP_API_VERSION.split('/')[0]}/",
)


def bucket_of(url: str) -> str:
    """The rate-limit bucket a request path draws from: its API group's, or the shared one."""
    return next((prefix for prefix in OWN_BUCKETS if url.startswith(prefix)), "")


class Kube:
    """Async JSON access to the API server, on the running event loop.

    Made anywhere; its HTTP session opens with the first request, in that request's loop.
    """

    def __init__(
        self,
        info: kopf.ConnectionInfo,
        *,
        qps: float = 0,
        burst: int = 1,
        concurrency: int = 16,
        reload: Any = None,
    ) -> None:
        self._info = info
        self._reload = reload
        self._qps, self._burst = qps, burst
        self._limiters: dict[str, TokenBucket] = {}
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None, *, qps: float, burst: int, concurrency: int
    ) -> Kube:
        """A client with :func:`connection_info`'s credentials (``kubeconfig`` names the file)."""

        def login() -> kopf.ConnectionInfo:
            return connection_info(kubeconfig)

        return cls(login(), qps=qps, burst=burst, concurrency=concurrency, reload=login)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            context: ssl.SSLContext | bool = (
                self._info.as_ssl_context() if self._info.server.startswith("https") else False
            )
            connector = aiohttp.TCPConnector(ssl=context, limit=self._concurrency)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
                headers={"User-Agent": "mpijob-operator", "Accept": "application/json"},
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _limiter(self, url: str) -> TokenBucket | None:
        if self._qps <= 0:
            return None
        bucket = bucket_of(url)
        if bucket not in self._limiters:
            self._limiters[bucket] = TokenBucket(self._qps, self._burst)
        return self._limiters[bucket]

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        urgent: bool = True,
    ) -> JSON:
        """One request; ``urgent=False`` lets every urgent request of its bucket go first."""
        limiter = self._limiter(url)
        if limiter is not None:
            await limiter.take(urgent=urgent)
        metrics.API_REQUESTS.labels(verb=method.lower()).inc()
        data = None if body is None else orjson.dumps(body)
        for attempt in (1, 2):
            headers = {"Content-Type": content_type, **self._info.as_http_headers()}
            async with self._open().request(
                method,
                self._info.server.rstrip("/") + url,
                params=query,
                data=data,
                headers=headers,
            ) as resp:
                raw = await resp.read()
                if resp.status == 401 and attempt == 1 and self._reload is not None:
                    # A rotated service-account token (or a refreshed kubeconfig): log in again.
                    self._info = await asyncio.to_thread(self._reload)
                    continue
                if resp.status >= 400:
                    raise ApiError.from_response(resp.status, resp.reason or "", raw)
                return orjson.loads(raw) if raw else {}
        raise AssertionError("unreachable")

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
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        labels: str = "",
        fields: str = "",
        urgent: bool = True,
    ) -> list[JSON]:
        """Every object, page by page (500 a page)."""
        items: list[JSON] = []
        query = {"limit": "500"}
        if labels:
            query["labelSelector"] = labels
        if fields:
            query["fieldSelector"] = fields
        while True:
            url = path(api_version, kind, namespace)
            result = await self.request("GET", url, query=query, urgent=urgent)
            items += result.get("items", [])
            more = (result.get("metadata") or {}).get("continue")
            if not more:
                return items
            query = {**query, "continue": more}

    async def create(self, obj: JSON, *, urgent: bool = True) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return await self.request("POST", url, obj, urgent=urgent)

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
        urgent: bool = True,
    ) -> JSON:
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self.request(
            "PATCH", url, patch, content_type="application/merge-patch+json", urgent=urgent
        )

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete by name (and uid, when given, so a same-named successor is safe).
        ``grace_seconds=0`` removes a pod at once (one on a deleted node: no kubelet confirms)."""
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", path(api_version, kind, namespace, name), body)
        except ApiError as e:
            if e.not_found or e.conflict:
                return False
            raise
        return True
