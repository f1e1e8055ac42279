"""The console's only door to the API server, through the official ``kubernetes`` client.

Objects come back as plain dicts in the API's own (camelCase) shape, whatever client call
fetched them, so the pure modules read one shape. API failures become :class:`ConsoleError`
with a message fit for a terminal. Called by :mod:`mpijob.console.main`.
"""

from __future__ import annotations

import codecs
import json
import warnings
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from mpijob import keys
from mpijob.objects import JSON
from mpijob.platform.credentials import configuration


class ConsoleError(Exception):
    """Something the user should read; the CLI prints it and exits 1."""


def explain(exc: ApiException, what: str) -> ConsoleError:
    if exc.status == 404:
        return ConsoleError(f"{what} not found")
    if exc.status == 403:
        return ConsoleError(f"not allowed to read or change {what} (HTTP 403)")
    reason = exc.reason or "error"
    return ConsoleError(f"{what}: {exc.status} {reason}")


class Api:
    """MPIJobs, pods and nodes of the cluster the kubeconfig (or in-cluster account) names."""

    def __init__(self, kubeconfig: str | None = None, namespace: str | None = None) -> None:
        # A kubeconfig that skips TLS verification was the user's choice; kubectl does not
        # warn about it on every request either.
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        try:
            self._client = client.ApiClient(configuration(kubeconfig))
        except config.ConfigException as exc:
            raise ConsoleError(f"no cluster configured: {exc}") from None
        context_namespace = _context_namespace(kubeconfig)
        self.namespace = namespace or context_namespace or "default"
        # The client's generated methods are typed loosely (``object``); read them as Any here.
        self._core: Any = client.CoreV1Api(self._client)
        self._custom: Any = client.CustomObjectsApi(self._client)

    def _plain(self, obj: Any) -> Any:
        return self._client.sanitize_for_serialization(obj)

    # --- MPIJobs --------------------------------------------------------------------------------

    def create_job(self, body: JSON) -> JSON:
        namespace = body.get("metadata", {}).get("namespace") or self.namespace
        try:
            created: JSON = self._custom.create_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL, body
            )
        except ApiException as exc:
            if exc.status == 409:
                name = body["metadata"]["name"]
                raise ConsoleError(f"MPIJob {namespace}/{name} already exists") from None
            raise ConsoleError(f"cannot create the MPIJob: {_message(exc)}") from None
        return created

    def get_job(self, name: str) -> JSON:
        try:
            job: JSON = self._custom.get_namespaced_custom_object(
                keys.GROUP, keys.VERSION, self.namespace, keys.PLURAL, name
            )
        except ApiException as exc:
            raise explain(exc, f"MPIJob {self.namespace}/{name}") from None
        return job

    def get_decision(self, name: str) -> JSON | None:
        """The job's PlacementDecision; None when it has none or this user may not read it."""
        try:
            decision: JSON = self._custom.get_namespaced_custom_object(
                keys.DECISION_GROUP,
                keys.DECISION_VERSION,
                self.namespace,
                keys.DECISION_PLURAL,
                name,
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise explain(exc, f"PlacementDecision {self.namespace}/{name}") from None
        return decision

    def list_jobs(self, *, all_namespaces: bool = False) -> list[JSON]:
        """The namespace's MPIJobs, or with ``all_namespaces`` those of every namespace."""
        try:
            if all_namespaces:
                result: JSON = self._custom.list_cluster_custom_object(
                    keys.GROUP, keys.VERSION, keys.PLURAL
                )
            else:
                result = self._custom.list_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, self.namespace, keys.PLURAL
                )
        except ApiException as exc:
            where = "all namespaces" if all_namespaces else self.namespace
            raise explain(exc, f"MPIJobs in {where}") from None
        return list(result.get("items", []))

    def delete_job(self, name: str) -> None:
        try:
            self._custom.delete_namespaced_custom_object(
                keys.GROUP,
                keys.VERSION,
                self.namespace,
                keys.PLURAL,
                name,
                propagation_policy="Background",
            )
        except ApiException as exc:
            raise explain(exc, f"MPIJob {self.namespace}/{name}") from None

    # --- pods -----------------------------------------------------------------------------------

    def job_pods(self, job: str | None = None, *, all_namespaces: bool = False) -> list[JSON]:
        """Pods of one job (or of every job) in the namespace, launcher pods included.

        With ``all_namespaces``, the pods of every job in every namespace.
        """
        selector = f"{keys.LABEL_OPERATOR_NAME}={keys.OPERATOR_NAME}"
        if job:
            selector += f",{keys.LABEL_JOB_NAME}={job}"
        try:
            if all_namespaces:
                pods = self._core.list_pod_for_all_namespaces(label_selector=selector)
            else:
                pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector)
        except ApiException as exc:
            where = "all namespaces" if all_namespaces else self.namespace
            raise explain(exc, f"pods in {where}") from None
        return [self._plain(p) for p in pods.items]

    def node_pods(self, node: str) -> tuple[list[JSON], bool]:
        """Pods bound to a node in every namespace; else (no right to list them all) in ours.

        The flag says whether the list covers the whole cluster.
        """
        selector = f"spec.nodeName={node}"
        try:
            pods = self._core.list_pod_for_all_namespaces(field_selector=selector)
            cluster_wide = True
        except ApiException as exc:
            if exc.status != 403:
                raise explain(exc, f"pods on node {node}") from None
            try:
                pods = self._core.list_namespaced_pod(self.namespace, field_selector=selector)
            except ApiException as inner:
                raise explain(inner, f"pods on node {node}") from None
            cluster_wide = False
        return [self._plain(p) for p in pods.items], cluster_wide

    def logs(self, pod: str, *, follow: bool) -> Iterator[str]:
        """The pod's log, chunk by chunk (until the container ends, with ``follow``), as text:
        a character whose UTF-8 bytes two chunks split is decoded whole, not as two U+FFFD."""
        try:
            response: Any = self._core.read_namespaced_pod_log(
                pod, self.namespace, follow=follow, _preload_content=False
            )
        except ApiException as exc:
            raise ConsoleError(
                f"cannot read the logs of pod {self.namespace}/{pod}: {_message(exc)}"
            ) from None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in response.stream(4096):
                if text := decoder.decode(chunk):
                    yield text
            if rest := decoder.decode(b"", final=True):
                yield rest
        finally:
            response.release_conn()

    # --- DRA claims -----------------------------------------------------------------------------

    def job_claims(self, job: str) -> list[JSON]:
        """The ResourceClaims of a job's workers (they carry its job-name label); none where
        ``resource.k8s.io/v1`` is not served or this user may not read claims."""
        group, version = keys.DRA_API_VERSION.split("/")
        try:
            result: JSON = self._custom.list_namespaced_custom_object(
                group,
                version,
                self.namespace,
                "resourceclaims",
                label_selector=f"{keys.LABEL_JOB_NAME}={job}",
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                return []
            raise explain(exc, f"ResourceClaims in {self.namespace}") from None
        return list(result.get("items", []))

    # --- nodes ----------------------------------------------------------------------------------

    def node(self, name: str) -> JSON:
        try:
            return dict(self._plain(self._core.read_node(name)))
        except ApiException as exc:
            raise explain(exc, f"node {name}") from None


def _message(exc: ApiException) -> str:
    """The API's own message from an error body, else the HTTP status line."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{exc.status} {exc.reason}"


def _context_namespace(kubeconfig: str | None) -> str | None:
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return None
    namespace = (active or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else None
