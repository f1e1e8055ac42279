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

Callers name kinds and verbs, never URLs: every kind the operator reads or writes is in
:data:`KINDS`, and server-side apply (:meth:`Kube.apply`), JSON patch (:meth:`Kube.json_patch`)
and the discovery reads are methods. A refusal raises a subclass of :class:`ApiError` by status
(:class:`NotFound`, :class:`Conflict`, :class:`Invalid`, ...), in Kopf's manner; each keeps
``status``. Whether an error is the API server not doing a request for now (no answer, 429,
5xx) is decided here, once, for every caller (:func:`transient`). What the API server did not do
(429, a 5xx with ``Retry-After``, a read's 5xx) is sent again a bounded number of times, after
the server's ``Retry-After`` when it names one (:func:`retry_after`). A create whose name
may be taken already (by the caller's own object, or someone else's) is
:func:`create_or_adopt`, for every caller.

The console and the node agent are synchronous programs and use the official ``kubernetes``
client, with credentials from :func:`mpijob.platform.credentials.configuration`.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import json
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

import aiohttp
import kopf
import orjson

from mpijob import keys, metrics
from mpijob.objects import JSON
from mpijob.platform import credentials
from mpijob.platform.backoff import exponential
from mpijob.platform.ratelimit import TokenBucket

REQUEST_TIMEOUT_SECONDS = 60.0
#: The User-Agent of a client that names no replica (the preflight's).
USER_AGENT: Final = "mpijob-operator"
#: Tries after the first of a request the API server answered "not now" (see Kube.request).
MAX_RETRIES: Final = 3
#: The first wait before such a retry when the server names none; it doubles with each try.
RETRY_BASE_SECONDS: Final = 0.5
#: The longest wait before one retry, whatever ``Retry-After`` says: a caller's loop (the
#: leader's renewal, a reconcile) has its own clock and must get the answer back in time.
RETRY_MAX_SECONDS: Final = 10.0
#: The field manager of the operator's server-side applies.
FIELD_MANAGER: Final = "mpijob-operator"


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
    ("scheduling.k8s.io/v1beta1", "PodGroup"): Kind("/apis/scheduling.k8s.io/v1beta1", "podgroups"),
    ("scheduling.k8s.io/v1beta1", "Workload"): Kind("/apis/scheduling.k8s.io/v1beta1", "workloads"),
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
    ("v1", "Namespace"): Kind("/api/v1", "namespaces", namespaced=False),
    ("v1", "ResourceQuota"): Kind("/api/v1", "resourcequotas"),
    ("resource.k8s.io/v1", "ResourceSlice"): Kind(
        "/apis/resource.k8s.io/v1", "resourceslices", namespaced=False
    ),
    ("coordination.k8s.io/v1", "Lease"): Kind("/apis/coordination.k8s.io/v1", "leases"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): Kind(
        "/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", namespaced=False
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): Kind(
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        namespaced=False,
    ),
}


class Fence(Protocol):
    """What a write asks before it is sent: the leader elector's
    (:meth:`mpijob.platform.leader.LeaderElector.write_deadline`)."""

    def write_deadline(self) -> float | None:
        """The loop time by which a write starting now must be done; None: it must not start."""
        ...


class NotLeading(Exception):
    """A write was refused before it was sent: this replica does not hold an unexpired Lease."""


class _FencedBody(aiohttp.BytesPayload):
    """A write's body that asks the fence again when aiohttp writes it, which is when the
    request's first byte goes out (its headers wait to go with the body): a process frozen
    between the fence and the send (SIGSTOP, a stalled VM; aiohttp writes the body in a task of
    its own) sends nothing on resuming."""

    def __init__(self, value: bytes, fence: Fence, what: str, content_type: str) -> None:
        super().__init__(value, content_type=content_type)
        self._fence = fence
        self._what = what

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        if self._fence.write_deadline() is None:
            raise NotLeading(f"{self._what}: the Lease expired before it was sent")
        await super().write_with_length(writer, content_length)


class ApiError(Exception):
    """A non-2xx answer, with the API's own reason and message.

    ``ApiError(status, reason, message)`` makes the subclass of that status (``ApiError(404,
    ...)`` is a :class:`NotFound`), so a test's fake raises what the API adapter would.
    """

    #: The status a subclass stands for (its instances carry the exact one in ``status``).
    code: ClassVar[int] = 0

    def __new__(cls, status: int, reason: str = "", message: str = "") -> ApiError:
        made = cls
        if cls is ApiError:
            made = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
        return super().__new__(made)

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.reason, self.message))

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
        return ApiError(status, reason, message)


class BadRequest(ApiError):
    code = 400


class Unauthorized(ApiError):
    code = 401


class Forbidden(ApiError):
    code = 403


class NotFound(ApiError):
    code = 404


class Conflict(ApiError):
    """409: a write on a stale ``resourceVersion``, or a create of a name that exists."""

    code = 409


class Gone(ApiError):
    """410: a list's ``continue`` token (or a watch's version) expired."""

    code = 410


class Invalid(ApiError):
    """422: the object was refused (validation, an admission webhook's denial)."""

    code = 422


class TooManyRequests(ApiError):
    code = 429


class ServerError(ApiError):
    """Any 5xx."""

    code = 500


_BY_STATUS: Mapping[int, type[ApiError]] = {
    cls.code: cls
    for cls in (BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Invalid,
                TooManyRequests)
}  # fmt: skip


def transient(error: BaseException, *, refusals: bool = False) -> bool:
    """Whether ``error`` is the API server not doing a request for now, so that the same request
    may succeed later: no answer (a connection refused, reset or cut short, a socket or TLS
    error: ``OSError``, ``aiohttp.ClientError``; a timeout), a 429 (API Priority and Fairness
    refused it first) or a 5xx. Not a refusal (any other :class:`ApiError`: the same request
    gets the same answer), nor :class:`NotLeading`, nor anything else (a bug). The one rule of
    the operator's retries; whether a request that failed so may be sent twice is the caller's
    to know (:func:`retry_after`).

    ``refusals=True`` counts every :class:`ApiError` too, for a caller that tries again on its
    own clock whatever the API answered (the Lease campaign, an informer's list and watch, a
    poll, a requeued reconcile): for it the line is between the API's answer or silence,
    logged as a line, and a bug, logged with its traceback or raised.
    """
    if isinstance(error, ApiError):
        return refusals or error.status == 429 or error.status >= 500
    # aiohttp.ServerDisconnectedError and ClientPayloadError are no OSError; asyncio's and
    # aiohttp's timeouts are TimeoutError.
    return isinstance(error, OSError | TimeoutError | aiohttp.ClientError)


def retry_after(method: str, error: ApiError, header: str | None, attempt: int) -> float | None:
    """Seconds to wait before sending a request again, or None when it must not be.

    Sent again, up to :data:`MAX_RETRIES` times, what the API server did not do
    (:func:`transient`: a 429, a 5xx), except a write's 5xx that names no ``Retry-After``: that
    write may have been done (a JSON patch that adds, sent twice, adds twice), and only a
    ``Retry-After`` says it was not (as client-go reads it). The wait is ``Retry-After``
    (seconds; its date form is taken as 1 s), else :data:`RETRY_BASE_SECONDS` doubled each try;
    never more than :data:`RETRY_MAX_SECONDS`.
    """
    if attempt > MAX_RETRIES or not transient(error):
        return None
    if error.status >= 500 and not header and method != "GET":
        return None
    wait = exponential(RETRY_BASE_SECONDS, attempt, RETRY_MAX_SECONDS)
    if header:
        try:
            wait = max(0.0, float(header))
        except ValueError:
            wait = 1.0
    return min(wait, RETRY_MAX_SECONDS)


def resource(api_version: str, kind: str) -> tuple[str, ...]:
    """The kind as Kopf's handlers name what they watch: ``(group, version, plural)``, or
    ``("v1", plural)`` for the core group; from :data:`KINDS`, the one table of kinds."""
    try:
        k = KINDS[api_version, kind]
    except KeyError:
        raise ValueError(f"unsupported kind {api_version}/{kind}") from None
    return (*api_version.split("/"), k.plural)


def selectors(labels: str = "", fields: str = "") -> dict[str, str]:
    """The query parameters of a list's or watch's label and field selectors (none when empty)."""
    query = {}
    if labels:
        query["labelSelector"] = labels
    if fields:
        query["fieldSelector"] = fields
    return query


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


@dataclass(frozen=True, kw_only=True)
class NamedConnectionInfo(kopf.ConnectionInfo):
    """Kopf's connection info whose requests name the replica in their User-Agent (Kopf sends
    the headers of its credentials with each request, and its own User-Agent only when they
    name none), so the audit log tells Kopf's requests of one replica from the other's."""

    user_agent: str = USER_AGENT

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": self.user_agent}


def named(info: kopf.ConnectionInfo, user_agent: str) -> kopf.ConnectionInfo:
    """``info`` with ``user_agent`` on every request made with it."""
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    return NamedConnectionInfo(**fields, user_agent=user_agent)


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


def decode(raw: bytes) -> Any:
    """JSON from the API server: orjson, or the standard library for what orjson refuses and
    the API server may still send (a lone surrogate in a tenant's annotation)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


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
        reload: Callable[[], kopf.ConnectionInfo] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        user_agent: str = USER_AGENT,
        fence: Fence | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        """``fence``: every write (any verb but GET) asks it first, and is given up when the
        fence's deadline comes (None: writes are not fenced, a single replica). ``timeout``:
        each request's limit."""
        self._info = info
        self._user_agent = user_agent
        self._fence = fence
        self._timeout = timeout
        self._reload = reload
        self._sleep = sleep
        self._qps, self._burst = qps, burst
        self._limiters: dict[str, TokenBucket] = {}
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None,
        *,
        qps: float,
        burst: int,
        concurrency: int,
        user_agent: str = USER_AGENT,
        fence: Fence | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> Kube:
        """A client with :func:`connection_info`'s credentials (``kubeconfig`` names the file)."""

        def login() -> kopf.ConnectionInfo:
            return connection_info(kubeconfig)

        return cls(
            login(),
            qps=qps,
            burst=burst,
            concurrency=concurrency,
            reload=login,
            user_agent=user_agent,
            fence=fence,
            timeout=timeout,
        )

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            context: ssl.SSLContext | bool = (
                self._info.as_ssl_context() if self._info.server.startswith("https") else False
            )
            connector = aiohttp.TCPConnector(ssl=context, limit=self._concurrency)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                headers={"User-Agent": self._user_agent, "Accept": "application/json"},
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
        retry: bool = True,
        needs_lease: bool = True,
    ) -> JSON:
        """One request; ``urgent=False`` lets every urgent request of its bucket go first.

        A write (any verb but GET) asks the fence just before it is sent and raises
        :class:`NotLeading` when this replica may not write; it is given up (``TimeoutError``)
        when the fence's deadline comes first. ``needs_lease=False`` only for what every
        replica writes at start-up (the webhook configurations of the webhooks each serves).

        What the API server did not do is sent again (:func:`retry_after`), each try drawing its
        own token, unless ``retry=False`` (a caller whose own loop retries on a clock, as the
        leader's renewal). A 401 logs in again once (a rotated service-account token or a
        refreshed kubeconfig). Any other refusal raises its :class:`ApiError`.
        """
        limiter = self._limiter(url)
        data = None if body is None else orjson.dumps(body)
        relogged = False
        attempt = 0
        while True:
            if limiter is not None:
                await limiter.take(urgent=urgent)
            total = self._timeout
            fenced = method != "GET" and needs_lease and self._fence is not None
            if fenced and self._fence is not None:
                deadline = self._fence.write_deadline()
                left = None if deadline is None else deadline - asyncio.get_running_loop().time()
                if left is None or left <= 0:
                    raise NotLeading(f"{method} {url}: this replica does not hold the Lease")
                total = min(total, left)
            metrics.API_REQUESTS.labels(verb=method.lower()).inc()
            headers = {"Content-Type": content_type, **self._info.as_http_headers()}
            sent: bytes | aiohttp.Payload | None = data
            if fenced and self._fence is not None:
                sent = _FencedBody(data or b"", self._fence, f"{method} {url}", content_type)
            try:
                async with self._open().request(
                    method,
                    self._info.server.rstrip("/") + url,
                    params=query,
                    data=sent,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=total),
                ) as resp:
                    raw = await resp.read()
                    status, reason = resp.status, resp.reason or ""
                    wait_header = resp.headers.get("Retry-After")
            except aiohttp.ClientConnectionError as e:
                if isinstance(e.__cause__, NotLeading):
                    raise e.__cause__ from None
                raise
            if status < 400:
                return decode(raw) if raw else {}
            if status == 401 and not relogged and self._reload is not None:
                relogged = True
                self._info = await asyncio.to_thread(self._reload)
                continue
            attempt += 1
            error = ApiError.from_response(status, reason, raw)
            wait = retry_after(method, error, wait_header, attempt) if retry else None
            if wait is None:
                raise error
            await self._sleep(wait)

    # --- verbs on objects -------------------------------------------------------------------

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, retry: bool = True
    ) -> JSON | None:
        """The object, or None when there is none."""
        try:
            return await self.request("GET", path(api_version, kind, namespace, name), retry=retry)
        except NotFound:
            return None

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
        """Every object the selectors match, page by page (:meth:`list_page`)."""
        items: list[JSON] = []
        selected = selectors(labels, fields)
        cont = ""
        while True:
            page = await self.list_page(api_version, kind, namespace, selected, cont, urgent)
            items += page.get("items", [])
            if not (cont := str((page.get("metadata") or {}).get("continue") or "")):
                return items

    async def list_page(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        selected: Mapping[str, str],
        cont: str = "",
        urgent: bool = False,
        limit: int = 500,
    ) -> JSON:
        """One page of a list (``limit`` objects) of what ``selected`` (:func:`selectors`) matches,
        whole: its ``metadata`` holds the ``continue`` token and the ``resourceVersion`` a watch
        starts from. By default never ahead of a write in its client's bucket (``urgent=False``):
        an informer's lists."""
        query = {"limit": str(limit), **selected}
        if cont:
            query["continue"] = cont
        url = path(api_version, kind, namespace)
        return await self.request("GET", url, query=query, urgent=urgent)

    async def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        version: str,
        timeout_seconds: int,
        labels: str = "",
    ) -> AsyncIterator[JSON]:
        """The watch events after ``version``, decoded, until the API server ends the stream
        (after ``timeout_seconds``) or the connection drops (``aiohttp.ClientError``, or
        ``TimeoutError`` when nothing came for a minute past ``timeout_seconds``). Bookmarks
        are asked for: they keep the version a watch resumes from current. A refusal raises
        its :class:`ApiError`, and so does an ``ERROR`` event (:class:`Gone` when ``version``
        is too old: list again). Not rate-limited: one request serves the whole stream.
        ``labels``: a label selector; an object that stops matching it comes as ``DELETED``."""
        query = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **selectors(labels),
        }
        metrics.API_REQUESTS.labels(verb="watch").inc()
        quiet = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 60)
        async with self._open().get(
            self._info.server.rstrip("/") + path(api_version, kind, namespace),
            params=query,
            headers=self._info.as_http_headers(),
            timeout=quiet,
        ) as resp:
            if resp.status >= 400:
                raw = await resp.read()
                if resp.status == 401 and self._reload is not None:
                    self._info = await asyncio.to_thread(self._reload)  # the next watch logs in
                raise ApiError.from_response(resp.status, resp.reason or "", raw)
            pending = b""
            async for chunk in resp.content.iter_any():
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        event = decode(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            raise ApiError(
                                int(status.get("code") or 500),
                                str(status.get("reason") or ""),
                                str(status.get("message") or ""),
                            )
                        yield event

    async def create(self, obj: JSON, *, urgent: bool = True, retry: bool = True) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return await self.request("POST", url, obj, urgent=urgent, retry=retry)

    async def replace(self, obj: JSON, *, retry: bool = True) -> JSON:
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.request("PUT", url, obj, retry=retry)

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
        """A JSON merge patch (RFC 7386)."""
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self.request(
            "PATCH", url, patch, content_type="application/merge-patch+json", urgent=urgent
        )

    async def json_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        ops: builtins.list[JSON],
        *,
        subresource: str = "",
    ) -> JSON:
        """A JSON patch (RFC 6902): a list of operations, applied in order or not at all."""
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self.request("PATCH", url, ops, content_type="application/json-patch+json")

    async def apply(
        self, obj: JSON, *, field_manager: str = FIELD_MANAGER, needs_lease: bool = True
    ) -> JSON:
        """Server-side apply of ``obj`` (the fields it names are this manager's, by force)."""
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.request(
            "PATCH",
            url,
            obj,
            query={"fieldManager": field_manager, "force": "true"},
            content_type="application/apply-patch+yaml",
            needs_lease=needs_lease,
        )

    # --- discovery ----------------------------------------------------------------------------

    async def version(self) -> JSON:
        """The API server's ``/version``."""
        return await self.request("GET", "/version")

    async def resources(self, group_version: str) -> JSON | None:
        """The discovery document of ``group_version`` (its served resources); None when the
        API server does not serve that group version."""
        prefix = "/api/" if group_version == "v1" else "/apis/"
        try:
            return await self.request("GET", prefix + group_version)
        except NotFound:
            return None

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
        except (NotFound, Conflict):
            return False
        return True


# --- create, or adopt what holds the name -------------------------------------------------------


class NameTaken(Exception):
    """A create found its name held by an object that is not the caller's
    (:func:`create_or_adopt`)."""

    def __init__(self, obj: JSON, existing: JSON) -> None:
        meta = obj["metadata"]
        super().__init__(f"{obj['kind']} {meta.get('namespace') or ''}/{meta['name']} exists")
        self.obj = obj
        """What was to be created."""
        self.existing = existing
        """The object that holds the name."""


@dataclass(frozen=True)
class Made:
    """What :func:`create_or_adopt` ends with: the object, and whether it was there already."""

    obj: JSON
    """As the create returned it, or as it was read (as sent, when the name is unique)."""
    adopted: bool
    """The name was taken, by an object of the caller's."""


async def create_or_adopt(
    create: Callable[[JSON], Awaitable[JSON]],
    obj: JSON,
    *,
    ours: Callable[[JSON], bool] | None,
    read: Callable[[str, str, str | None, str], Awaitable[JSON | None]] | None = None,
) -> Made:
    """Create ``obj``; when its name is taken (409), the object that holds it, read by name,
    is adopted if ``ours`` says it is the caller's (a child made by an earlier sync whose watch
    event has not come, or made before a restart), and :class:`NameTaken` otherwise: what
    someone else made is never touched. An object deleted between the create and the read
    leaves the 409 raised: the caller tries again from a fresh look. Any other refusal is
    raised as it came.

    ``ours=None`` (then no ``read``) is for a name unique to this create, as an Event's random
    suffix: a taken name can only be an earlier try of the same create whose answer was lost,
    so it counts as made, from ``obj``, and nothing is read."""
    try:
        return Made(await create(obj), adopted=False)
    except ApiError as e:
        if not e.conflict:
            raise
        if ours is None:
            return Made(obj, adopted=True)
        taken = e
    if read is None:
        raise TypeError("create_or_adopt: what ours is asked of must be read") from taken
    meta = obj["metadata"]
    existing = await read(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
    if existing is None:
        raise taken
    if not ours(existing):
        raise NameTaken(obj, existing)
    return Made(existing, adopted=True)
