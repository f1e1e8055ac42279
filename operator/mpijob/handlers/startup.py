"""Operator lifecycle: tune Kopf once, build the runtime, start and stop the workers.

``run`` is the programmatic entry (the CLI calls it). Kopf's settings and the changes to its
classes are :mod:`mpijob.platform.kopf_tuning`'s, applied here.
Before Kopf starts, :func:`preflight` checks that the CRDs are served and picks the
``--gpu-binding`` mode, which decides the watches registered. With ``--fractional-gpus`` it
also registers :mod:`~mpijob.shares.service` (GPU-share webhooks), serves them with a
certificate made at start, and applies their configurations.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path
from typing import Any

import kopf
import uvloop
import yaml

from mpijob import keys, metrics
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.desired.gpu_binding import Choice, ClusterFacts, GpuBinding, choose
from mpijob.gang import quota
from mpijob.gang.service import Admission, store_decision
from mpijob.handlers import reconcile, watches
from mpijob.handlers.cache import Cache
from mpijob.handlers.runtime import OperatorMemo, Runtime
from mpijob.placement import fabric as fabric_module
from mpijob.placement import fabric_labels
from mpijob.placement.fabric import Fabric
from mpijob.platform import kopf_tuning, tls
from mpijob.platform.deferred import DeferredPatches
from mpijob.platform.kube import ApiError, Kube, connection_info
from mpijob.platform.kube_api import KubeApi
from mpijob.platform.leader import LeaderElector
from mpijob.platform.recorder import Recorder
from mpijob.platform.workers import Workers
from mpijob.settings import OperatorSettings
from mpijob.shares import service as share_service
from mpijob.shares import webhook
from mpijob.shares.service import ShareService

log = logging.getLogger(__name__)


async def startup(settings: kopf.OperatorSettings, memo: OperatorMemo, **kwargs: Any) -> None:
    ours = memo.settings
    kopf_tuning.configure(settings, ours)
    kube = Kube.from_kubeconfig(
        ours.kubeconfig,
        qps=ours.kube_api_qps,
        burst=ours.kube_api_burst,
        concurrency=max(4, ours.threadiness * 2),
    )
    leader = None
    if ours.leader_elect:
        leader = LeaderElector(namespace=ours.lock_namespace, name=ours.lock_name, kube=kube)
        leader.start()
    else:
        metrics.IS_LEADER.set(1)
    instance = leader.identity if leader else os.environ.get("HOSTNAME", "mpijob-operator")
    binding = memo.get("gpu_binding", GpuBinding.ANNOTATIONS)
    fabric = memo.get("fabric")
    cache = Cache()
    # Indices are live mappings: empty now, complete when the workers open (see watches).
    cache.indices = {name: kwargs[name] for name in watches.INDICES if name in kwargs}
    cache.server_minor = await server_minor(kube)
    workers = Workers(ours.threadiness, leader=leader)
    admission = Admission(
        write_decision=lambda obj: store_decision(kube, obj),
        enqueue=workers.enqueue,
        snapshot=cache.placement_snapshot,
        live=cache.job,
        decision_of=cache.decision,
        priority_values=cache.priority_values,
        inter_node_gbps=ours.inter_node_gbps,
        create_object=kube.create,
        get_object=kube.get,
        binding=binding,
        fabric=fabric,
    )
    rt = Runtime(
        settings=ours,
        gpu_binding=binding,
        kube=kube,
        recorder=Recorder(kube, instance=instance, namespaces=ours.namespaces),
        deferred=DeferredPatches(kube),
        workers=workers,
        cache=cache,
        admission=admission,
    )
    memo.runtime = rt
    rt.workers.run(admission.run_forever(), name="admission")
    if fabric is not None and fabric_labels.hypernode_tiers(fabric):
        rt.workers.run(watches.follow_hypernodes(rt), name="hypernodes")
    if ours.fractional_gpus:
        shares = ShareService(
            workers_of=share_service.workers_reader(kube),
            events=rt.recorder.post,
            runtime_class=ours.gpu_share_runtime_class,
        )
        memo[webhook.MEMO_KEY] = shares
        selector = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_CORE_MEM}"
        await shares.rebuild(
            await kube.list("v1", "Node", None, labels=selector),
            await kube.list("v1", "Pod", None),
        )
        cert = (
            tls.mounted_certificate(Path(ours.webhook_cert_dir))
            if ours.webhook_cert_dir
            else tls.serving_certificate(
                ours.lock_namespace, ours.webhook_service, url=ours.webhook_url
            )
        )
        webhook.configure_server(
            settings, cert, ours.webhook_port, client_ca=ours.webhook_client_ca
        )
        rt.workers.run(
            shares.run_placement(
                share_service.pod_patcher(kube), leader.leading if leader is not None else None
            ),
            name="gpu-share-placement",
        )
        await webhook.apply_configurations(
            kube.apply,
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


async def detect_gpu_binding(kube: KubeApi, flag: str) -> Choice:
    """The ``--gpu-binding`` mode on this cluster, logged with its reason.

    Two reads: the ``resource.k8s.io/v1`` discovery document and the ``gpu.nvidia.com``
    DeviceClass. A read the API server refuses otherwise than "not found" (e.g. forbidden) counts
    as absent and is named in the reason. ValueError from :func:`choose` when ``dra`` is forced on
    a server without the API.
    """
    unknown = []
    try:
        served = await kube.resources(keys.DRA_API_VERSION) is not None
    except ApiError as error:
        served = False
        unknown.append(f"{keys.DRA_API_VERSION}: {error.status} {error.message}")
    device_class = False
    if served:
        try:
            found = await kube.get(
                keys.DRA_API_VERSION, "DeviceClass", None, keys.NVIDIA_GPU_DRIVER
            )
            device_class = found is not None
        except ApiError as error:
            unknown.append(f"DeviceClass {keys.NVIDIA_GPU_DRIVER}: {error.status} {error.message}")
    choice = choose(flag, ClusterFacts(served, device_class, "; ".join(unknown)))
    log.log(
        logging.WARNING if choice.warning else logging.INFO,
        "GPU binding mode: %s (%s)",
        choice.mode.value,
        choice.reason,
    )
    return choice


async def server_minor(kube: KubeApi) -> int | None:
    """The API server's Kubernetes minor version; None when it cannot be read (the GPU quota
    check then counts the operator's claims itself, see :mod:`mpijob.gang.quota`)."""
    try:
        return quota.server_minor(await kube.version())
    except (ApiError, OSError) as error:
        log.warning("Could not read the API server's version: %s", error)
        return None


async def cleanup(memo: OperatorMemo, **_: Any) -> None:
    rt: Runtime | None = memo.get("runtime")
    if rt is not None:
        await rt.stop()


def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf's watches log in exactly as the operator's own requests do."""
    return connection_info()


def registry_for(
    ours: OperatorSettings, binding: GpuBinding = GpuBinding.ANNOTATIONS
) -> kopf.OperatorRegistry:
    """Every handler: the watches, and with ``shares`` (``--fractional-gpus``) its webhooks."""
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
    watches.register(registry, gang_api_version=gang_api, dra=binding is GpuBinding.DRA)
    if ours.fractional_gpus:
        webhook.register(registry)
    return registry


class MissingCRD(Exception):
    """A CustomResourceDefinition the operator needs is not installed."""


#: (group/version, plural, the file under crds/ that defines it)
NEEDED_CRDS = (
    (keys.API_VERSION, keys.PLURAL, "kubeflow.org_mpijobs.yaml"),
    (keys.DECISION_API_VERSION, keys.DECISION_PLURAL, "mpijob.io_placementdecisions.yaml"),
)


async def check_crds(kube: KubeApi) -> None:
    """Raise :class:`MissingCRD`, naming the fix, when a kind the operator watches is not
    served: Kopf would otherwise wait for it silently and never reconcile anything. Any other
    failure (the API server still starting) is left to Kopf's own retries."""
    for group_version, plural, source in NEEDED_CRDS:
        try:
            served = await kube.resources(group_version) or {}
        except ApiError as e:
            log.warning("Could not check that %s is served: %s", group_version, e)
            continue
        if not any(r.get("name") == plural for r in served.get("resources") or []):
            raise MissingCRD(
                f"{plural}.{group_version.split('/')[0]} ({group_version}) is not served: "
                f"install it with `kubectl apply --server-side -f crds/{source}` "
                "(or the kustomize overlays, which include every CRD)"
            )


PREFLIGHT_SECONDS = 60.0


async def preflight(ours: OperatorSettings) -> GpuBinding:
    """Before Kopf starts: the CRDs are served (:class:`MissingCRD` otherwise) and the GPU
    binding mode (ValueError when ``--gpu-binding=dra`` cannot work here). An API server that
    does not answer within :data:`PREFLIGHT_SECONDS` leaves the CRDs to Kopf's own retries and
    the mode at ``annotations`` (or the forced one), with a warning."""
    kube = Kube.from_kubeconfig(ours.kubeconfig, qps=0, burst=1, concurrency=1)
    deadline = asyncio.get_running_loop().time() + PREFLIGHT_SECONDS
    try:
        while True:
            try:
                await check_crds(kube)
                return (await detect_gpu_binding(kube, ours.gpu_binding)).mode
            except OSError as e:
                if asyncio.get_running_loop().time() > deadline:
                    forced = ours.gpu_binding == GpuBinding.DRA.value
                    mode = GpuBinding.DRA if forced else GpuBinding.ANNOTATIONS
                    log.warning("API server unreachable (%s): GPU binding mode %s", e, mode.value)
                    return mode
                await asyncio.sleep(2)
    finally:
        await kube.aclose()


#: Allocations between two collections of the cyclic garbage collector's youngest generation
#: (Python's default: 700). A watch event decodes into hundreds of objects that live until Kopf
#: has handled it; at 700 the collector ran every few events while they were alive, scanned
#: them, promoted them and scanned them again in the older generations: 0.9 s of 4.0 s CPU in
#: ``make bench``. At this size most of them are freed by their reference counts first.
GC_YOUNG_THRESHOLD = 20_000


def load_fabric(value: str) -> Fabric | None:
    """The ``--fabric``: a shipped one by name, or read from a YAML/JSON file; None if empty.
    ValueError (naming the flag) when it cannot be read."""
    if not value:
        return None
    if value in fabric_module.NAMES:
        return fabric_module.load(value)
    try:
        spec = yaml.safe_load(Path(value).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(
            f"--fabric {value!r}: neither a shipped fabric "
            f"({', '.join(fabric_module.NAMES)}) nor a readable YAML/JSON file: {e}"
        ) from None
    if not isinstance(spec, dict):
        raise ValueError(f"--fabric {value!r}: the file must hold a mapping with 'levels'")
    try:
        return fabric_labels.fabric_from_spec(spec, name=Path(value).name)
    except ValueError as e:
        raise ValueError(f"--fabric {value!r}: {e}") from None


def tune_garbage_collector() -> None:
    """Before the loop: what the imports made lives for the process (frozen: never scanned
    again), and the youngest generation is collected less often (:data:`GC_YOUNG_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run(ours: OperatorSettings, *, verbose: bool = False, json_logs: bool = False) -> None:
    """Run the operator until SIGINT/SIGTERM."""
    kopf_tuning.configure_logging(verbose=verbose, json_lines=json_logs)
    if ours.kubeconfig:
        os.environ["KUBECONFIG"] = ours.kubeconfig
    kopf_tuning.patch_kopf()
    fabric = load_fabric(ours.fabric)  # a bad --fabric stops here, naming the problem
    binding = asyncio.run(preflight(ours))
    memo = OperatorMemo(settings=ours, gpu_binding=binding, fabric=fabric)
    tune_garbage_collector()
    # uvloop: the watch streams, Kopf's per-event tasks and our API calls all run on this loop.
    uvloop.run(
        kopf.operator(
            registry=registry_for(ours, binding),
            memo=memo,
            standalone=True,
            clusterwide=ours.cluster_wide,
            namespaces=list(ours.namespaces),
        )
    )
