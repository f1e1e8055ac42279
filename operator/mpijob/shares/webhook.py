"""The share webhook's wiring: Kopf's registry (node and pod watches, the mutating and
validating webhooks), its HTTPS server, and the webhook configurations the operator applies.

The decisions are :class:`~mpijob.shares.service.ShareService`'s; the configurations are
built by :func:`mpijob.shares.pod_edits.webhook_configurations`, so that their failure policy,
timeout, match conditions and namespace selector are ours.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import jsonpatch
import kopf

from mpijob import keys
from mpijob.objects import JSON
from mpijob.platform.kube import resource
from mpijob.platform.tls import ServingCertificate
from mpijob.shares.pod_edits import MUTATE_ID, VALIDATE_ID, webhook_configurations
from mpijob.shares.service import ShareService

log = logging.getLogger(__name__)


def register(registry: kopf.OperatorRegistry, service: ShareService) -> None:
    """Add the node and pod watches and both webhooks to ``registry``. They ask the operator's
    one :class:`ShareService`, made complete at start-up before Kopf starts, and all run on the
    event loop, as the watches that change its ledger do."""
    core_mem = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM}

    async def node_event(body: Any, type: str | None, **_: Any) -> None:
        await service.on_node(dict(body), type)

    async def pod_event(body: Any, type: str | None, **_: Any) -> None:
        await service.on_pod(dict(body), type)

    async def mutate(body: Any, patch: kopf.Patch, dryrun: bool, **_: Any) -> None:
        ops = await service.mutate(dict(body), dryrun=dryrun)
        if ops:
            patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))

    # A coroutine, as every handler: Kopf would run a plain function in a thread, reading the
    # ledger while the loop changes it (the operator's Kopf refuses that: kopf_tuning.NoThreads).
    # On the loop, the ledger is read between two of its changes, never during one.
    async def validate(body: Any, **_: Any) -> None:
        service.validate(dict(body))

    kopf.on.event(*resource("v1", "Node"), labels=core_mem, registry=registry)(node_event)

    def counted(annotations: Any, spec: Any, **_: Any) -> bool:
        """Share pods, waiting pods, and bound pods (their requests take room on nodes)."""
        return (
            keys.GPU_SHARE in annotations
            or keys.GPU_SHARE_WAITING in annotations
            or bool(spec.get("nodeName"))
        )

    pods = resource("v1", "Pod")
    kopf.on.event(*pods, when=counted, registry=registry)(pod_event)
    kopf.on.mutate(*pods, id=MUTATE_ID, operations=["CREATE"], registry=registry)(mutate)
    kopf.on.validate(*pods, id=VALIDATE_ID, operations=["CREATE"], registry=registry)(validate)


def configure_server(
    settings: kopf.OperatorSettings, cert: ServingCertificate, port: int, *, client_ca: str = ""
) -> None:
    """Kopf serves the webhooks over HTTPS on ``port``; it manages no configuration itself.

    With ``client_ca`` (a PEM file) the TLS handshake requires a client certificate it signed:
    only the API server, which presents one through its admission configuration, is answered;
    any other client is refused before a request is read.
    """
    if not client_ca:
        log.warning(
            "The GPU-share webhooks answer any client that reaches port %d: set"
            " --webhook-client-ca so that only the API server is answered",
            port,
        )
    settings.admission.server = kopf.WebhookServer(
        addr="0.0.0.0",  # all interfaces: the Service reaches the pod on its IP
        port=port,
        certfile=str(cert.certfile),
        pkeyfile=str(cert.keyfile),
        verify_mode=ssl.CERT_REQUIRED if client_ca else None,
        verify_cafile=client_ca or None,
    )
    settings.admission.managed = None


async def apply_configurations(
    apply: Callable[[JSON], Awaitable[Any]],
    *,
    service_namespace: str,
    service_name: str,
    port: int,
    ca_bundle: str,
    url: str = "",
) -> None:
    """Server-side apply both webhook configurations (``apply`` is :meth:`Kube.apply`)."""
    for obj in webhook_configurations(
        service_namespace=service_namespace,
        service_name=service_name,
        port=port,
        ca_bundle=ca_bundle,
        exempt_namespaces=(service_namespace, "kube-system"),
        url=url,
    ):
        await apply(obj)
        log.info("Applied the %s for GPU shares", obj["kind"])
