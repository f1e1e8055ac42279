"""Operator lifecycle: configure Kopf once, build the runtime, start and stop the workers.

``run`` is the programmatic entry (the CLI calls it). Kopf is configured here and nowhere else:
its peering is off (a Lease elects the leader instead), Event posting is off (we post our own,
with upstream's source component), its finalizer and storage keys use our prefix so that if
anything is ever stored it is ours, and node watches are filtered server-side to opted-in nodes.
With ``--fractional-gpus`` it also registers :mod:`~mpijob.handlers.fractional` (GPU-share
webhooks), serves them with a certificate made at start, and applies their configurations.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from mpijob import keys, metrics
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.handlers import fractional, reconcile, watches
from mpijob.handlers.admission import Admission
from mpijob.handlers.kube import Kube
from mpijob.handlers.leader import LeaderElector
from mpijob.handlers.recorder import Recorder
from mpijob.handlers.runtime import Runtime
from mpijob.handlers.workers import Workers
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.persistence.finalizer = keys.PREFIX + "finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mpijob.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="mpijob.io", key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.watching.chunk_size = 500
    # Pods are watched unfiltered (as upstream's informer does): placement must see the GPUs
    # of every placed pod, not only ours. Nodes: only those opted into topology placement.
    settings.watching.label_selectors["v1", "nodes"] = (
        f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_TOPOLOGY}"
    )
    settings.execution.max_workers = max(4, ours.threadiness)
    if ours.fractional_gpus:
        # Shares go to core_mem nodes; the topology handlers still filter on their own label.
        settings.watching.label_selectors["v1", "nodes"] = (
            f"{keys.NODE_GPU_SCHEDULE_LABEL} in"
            f" ({keys.NODE_GPU_SCHEDULE_TOPOLOGY},{keys.NODE_GPU_SCHEDULE_CORE_MEM})"
        )


async def startup(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    ours: OperatorSettings = memo["settings"]
    configure(settings, ours)
    kube = Kube.from_kubeconfig(
        ours.kubeconfig,
        qps=ours.kube_api_qps,
        burst=ours.kube_api_burst,
        concurrency=max(4, ours.threadiness * 2),
    )
    leader = None
    if ours.leader_elect:
        leader = LeaderElector(
            namespace=ours.lock_namespace, name=ours.lock_name, kubeconfig=ours.kubeconfig
        )
        leader.start()
    else:
        metrics.IS_LEADER.set(1)
    instance = leader.identity if leader else os.environ.get("HOSTNAME", "mpijob-operator")
    rt = Runtime(
        settings=ours,
        kube=kube,
        recorder=Recorder(kube, instance=instance),
        workers=Workers(ours.threadiness, leader=leader),
    )
    # Indices are live mappings: empty now, complete before any resource handler runs.
    rt.cache.indices = {name: kwargs[name] for name in watches.INDICES if name in kwargs}
    memo["runtime"] = rt
    rt.admission = Admission(
        patch_job=lambda key, patch: kube.patch(keys.API_VERSION, keys.KIND, *key, patch),
        enqueue=rt.workers.enqueue,
        snapshot=rt.cache.placement_snapshot,
        live=rt.cache.job,
        priority_values=rt.cache.priority_values,
        inter_node_gbps=ours.inter_node_gbps,
    )
    rt.workers.run(rt.admission.run_forever(), name="admission")
    if ours.fractional_gpus:
        shares: fractional.FractionalAdmission = memo["fractional"]
        selector = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_CORE_MEM}"
        await shares.rebuild(
            await kube.list("v1", "Node", None, labels=selector),
            await kube.list("v1", "Pod", None),
        )
        cert = fractional.serving_certificate(
            ours.lock_namespace, ours.webhook_service, url=ours.webhook_url
        )
        fractional.configure_server(settings, cert, ours.webhook_port)
        await fractional.apply_configurations(
            kube.request,
            service_namespace=ours.lock_namespace,
            service_name=ours.webhook_service,
            port=443,
            ca_bundle=cert.ca_bundle,
            url=ours.webhook_url,
        )
    rt.workers.start(lambda key: reconcile.reconcile(rt, key))
    if ours.monitoring_port:
        metrics.serve(
            ours.monitoring_port, healthy=lambda: rt.workers.alive(HEALTHY_WITHIN_SECONDS)
        )
    log.info(
        "Started mpijob-operator",
        extra={
            "namespaces": list(ours.namespaces) or "all",
            "gang": ours.gang_scheduling or "off",
            "threadiness": ours.threadiness,
            "leader_election": ours.leader_elect,
        },
    )


HEALTHY_WITHIN_SECONDS = 30.0


async def cleanup(memo: Any, **_: Any) -> None:
    rt: Runtime | None = memo.get("runtime")
    if rt is not None:
        await rt.stop()


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


def registry_for(ours: OperatorSettings, memo: kopf.Memo | None = None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.login(registry=registry)(login)
    gang = GangMode.from_flag(ours.gang_scheduling)
    gang_api = None
    if gang.kind is GangKind.VOLCANO:
        gang_api = keys.VOLCANO_POD_GROUP_API_VERSION
    elif gang.kind is GangKind.SCHEDULER_PLUGINS:
        gang_api = keys.SCHED_PLUGINS_POD_GROUP_API_VERSION
    watches.register(registry, gang_api_version=gang_api)
    if ours.fractional_gpus:
        shares = fractional.FractionalAdmission()
        fractional.register(registry, shares)
        if memo is not None:
            memo["fractional"] = shares
    return registry


def run(ours: OperatorSettings) -> None:
    """Run the operator until SIGINT/SIGTERM."""
    if ours.kubeconfig:
        os.environ["KUBECONFIG"] = ours.kubeconfig
    memo = kopf.Memo(settings=ours)
    asyncio.run(
        kopf.operator(
            registry=registry_for(ours, memo),
            memo=memo,
            standalone=True,
            clusterwide=ours.cluster_wide,
            namespaces=list(ours.namespaces),
        )
    )
