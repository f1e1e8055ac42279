"""The composition root: start-up builds every object complete, here and only here.

``run`` is the programmatic entry (the CLI calls it); :func:`main` builds, in order: the
credentials, :func:`preflight` (the API server answers, the CRDs are served, the
``--gpu-binding`` mode, which decides the watches registered), Kopf's settings
(:mod:`mpijob.platform.kopf_tuning`), the leader elector and its own client, the API adapter
fenced by it, with ``--fractional-gpus`` the share service (its ledger, certificate, webhook
server and configurations), Kopf's registry and indexers, the cache over their indices, the
workers, the admission, the runtime, the monitoring server (``/metrics``, ``/readyz``) and the
liveness probe (Kopf's probe server, :func:`liveness_probe`); then hands the work to
:class:`~mpijob.platform.manager.Manager`, which campaigns for the Lease only now, and runs
Kopf. Any step that fails is :class:`StartupFailed`: one line naming what and where, exit
status 1, and no Lease was ever asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
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
from mpijob.handlers.cache import Cache, Index
from mpijob.handlers.runtime import OperatorMemo, Runtime
from mpijob.placement import fabric as fabric_module
from mpijob.placement import fabric_labels
from mpijob.placement.fabric import Fabric
from mpijob.platform import credentials, heap, informer, kopf_tuning, tls
from mpijob.platform import kube as kube_module
from mpijob.platform import leader as leader_module
from mpijob.platform.deferred import DeferredPatches
from mpijob.platform.kube import ApiError, Kube, connection_info
from mpijob.platform.kube_api import KubeApi
from mpijob.platform.leader import LeaderElector
from mpijob.platform.manager import Manager, Runnable
from mpijob.platform.recorder import Recorder
from mpijob.platform.workers import KOPF_INDICES, Workers, beat_in_time
from mpijob.settings import OperatorSettings
from mpijob.shares import service as share_service
from mpijob.shares import webhook
from mpijob.shares.service import ShareService

log = logging.getLogger(__name__)


class StartupFailed(Exception):
    """Start-up could not finish: what failed and where, in one line. The process exits with
    status 1 before it has campaigned for the Lease, so the kubelet restarts it."""


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Turn any failure of a start-up step into :class:`StartupFailed` naming ``what``."""
    try:
        yield
    except StartupFailed:
        raise
    except (MissingCRD, ValueError) as e:
        raise StartupFailed(f"{what}: {e}") from None
    except ApiError as e:
        raise StartupFailed(f"{what}: the API server refused: {e}") from None
    except (OSError, kopf.LoginError, yaml.YAMLError, TimeoutError) as e:
        raise StartupFailed(f"{what}: {e or type(e).__name__}") from None
    except Exception as e:  # anything else: still one line, and still no Lease
        raise StartupFailed(f"{what}: {type(e).__name__}: {e}") from None


def kubeconfig_source(ours: OperatorSettings) -> str:
    """Where the credentials come from, as a start-up failure names it."""
    if credentials.in_cluster(ours.kubeconfig or None):
        return "the pod's service account"
    return ours.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"


def write_connections(threadiness: int) -> int:
    """Connections of the client that writes. aiohttp speaks HTTP/1.1, one request at a time
    per connection (client-go multiplexes its requests over one HTTP/2 connection): a sync's
    largest batch of pod creations must find as many, or a large job's pods are paced by the
    API server's latency instead of by the rate limit. With 16 connections the 8,192-GPU job's
    1,024 pods went out at about 80 a second under QPS 100 (docs/scale.md)."""
    return max(threadiness * 2, reconcile.MAX_CREATE_BATCH)


async def main(ours: OperatorSettings, fabric: Fabric | None) -> None:
    """The composition root: build every object complete, in this order, and hand the work to
    the manager; then run Kopf until SIGINT/SIGTERM. A step that fails raises
    :class:`StartupFailed` before the Lease is asked for."""
    identity = leader_module.identity()
    user_agent = f"{kube_module.USER_AGENT}/{identity}"
    with step(f"reading the credentials ({kubeconfig_source(ours)})"):
        info = kube_module.connection_info(ours.kubeconfig or None)
    where = f"the API server at {info.server}"
    binding, ours = await preflight(ours, where)
    settings = kopf.OperatorSettings()
    kopf_tuning.configure(settings, ours)
    # Leader election's own client, as upstream's: a renewal never waits behind other requests.
    lease_kube = Kube.from_kubeconfig(
        ours.kubeconfig,
        qps=0,
        burst=1,
        concurrency=2,
        user_agent=user_agent,
        timeout=leader_module.REQUEST_TIMEOUT_SECONDS,
    )
    elector = None
    if ours.leader_elect:
        elector = LeaderElector(
            namespace=ours.lock_namespace, name=ours.lock_name, kube=lease_kube, identity=identity
        )
    kube = Kube.from_kubeconfig(
        ours.kubeconfig,
        qps=ours.kube_api_qps,
        burst=ours.kube_api_burst,
        concurrency=write_connections(ours.threadiness),
        user_agent=user_agent,
        fence=elector,
    )
    recorder = Recorder(kube, instance=identity, namespaces=ours.namespaces)
    shares = None
    if ours.fractional_gpus:
        shares = await start_shares(ours, kube, settings, where, recorder.post)
    registry = registry_for(ours, binding, shares, user_agent)
    informed = watches.informed(dra=binding is GpuBinding.DRA)
    # One cache: Kopf's indices, among which the informers file theirs.
    indexers, indices, filings = kopf_tuning.indexers_for(registry, informed)
    cache = Cache(indices=indices, server_minor=await server_minor(kube))
    workers = Workers(ours.threadiness, caches=frozenset({KOPF_INDICES, *informed}))
    admission = Admission(
        write_decision=lambda obj: store_decision(kube, obj),
        enqueue=workers.enqueue,
        snapshot=cache.placement_snapshot,
        live=partial(cache.job, check=partial(reconcile.checked, settings=ours, fabric=fabric)),
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
        recorder=recorder,
        deferred=DeferredPatches(kube),
        workers=workers,
        cache=cache,
        admission=admission,
    )
    watch_kube, informers = make_informers(ours, rt, filings, user_agent)
    runnables = [
        *(Runnable(f"informer-{i.kind}s", i.run, needs_lease=False) for i in informers),
        Runnable("heartbeat", workers.beat, needs_lease=False),
        Runnable("heap-trim", heap.give_back_forever, needs_lease=False),
        Runnable("reconcile", lambda: workers.serve(partial(reconcile.reconcile, rt)), True),
        Runnable("admission", admission.run_forever, needs_lease=True),
    ]
    if fabric is not None and fabric_labels.hypernode_tiers(fabric):
        runnables.append(Runnable("hypernodes", lambda: watches.follow_hypernodes(rt), False))
    if shares is not None:
        patcher = share_service.pod_patcher(kube)
        runnables.append(
            Runnable("gpu-share-placement", lambda: shares.run_placement(patcher), True)
        )
    manager = Manager(
        runnables,
        elector=elector,
        synced=workers.synced,
        stopping=(recorder.close, rt.deferred.drain),
    )

    # Kopf's cleanup activity runs once its watches have stopped and before it waits (5 s) for
    # the tasks it did not start: our work, stopped there, is not left to that wait, so SIGTERM
    # ends the process, and releases the Lease, at once.
    async def stop_our_work(**_: Any) -> None:
        await manager.stop()

    kopf.on.cleanup(registry=registry)(stop_our_work)

    liveness = serve_probes(ours, registry, manager, workers)
    memo = OperatorMemo(settings=ours, gpu_binding=binding, fabric=fabric, runtime=rt)
    log.info(
        "Started mpijob-operator",
        extra={
            "namespaces": list(ours.namespaces) or "all",
            "gang": ours.gang_scheduling or "off",
            "launch_image": ours.launch_image or "none",
            "threadiness": ours.threadiness,
            "leader_election": ours.leader_elect,
            "identity": identity,
        },
    )
    manager.start()
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            indexers=indexers,
            memo=memo,
            standalone=True,
            liveness_endpoint=liveness,
            clusterwide=ours.cluster_wide,
            namespaces=list(ours.namespaces),
        )
    finally:
        await manager.stop()
        await kube.aclose()
        await watch_kube.aclose()
        await lease_kube.aclose()


def make_informers(
    ours: OperatorSettings,
    rt: Runtime,
    indices: Mapping[str, informer.Filing],
    user_agent: str,
) -> tuple[Kube, list[informer.Informer]]:
    """An informer per index of ``indices``, of its kind in
    :data:`~mpijob.handlers.watches.WATCHED`, over the operator's namespaces (a cluster-scoped
    kind: the cluster), filing into ``indices``; each one's first list opens the workers for it.
    Their own client: each watch holds a connection for minutes, never one a request waits for."""
    namespaces, admits = informer.scope(ours.namespaces, kopf_tuning.namespace_matcher)
    kube = Kube.from_kubeconfig(
        ours.kubeconfig,
        qps=0,
        burst=1,
        concurrency=len(namespaces) * len(indices) + 1,
        user_agent=user_agent,
    )
    informers = []
    for name, into in indices.items():
        index = Index(name)
        kind = watches.WATCHED[index]
        assert kind.api_version is not None, kind
        namespaced = kube_module.KINDS[kind.api_version, kind.kind].namespaced
        informers.append(
            informer.Informer(
                kube,
                kind.api_version,
                kind.kind,
                labels=kind.labels,
                index=into,
                handle=watches.informer_handler(rt, index),
                namespaces=namespaces if namespaced else (None,),
                admits=admits if namespaced else None,
                on_listed=partial(rt.workers.open, index.value),
                kept=watches.kept_metadata,
                page=kind.page,
            )
        )
    return kube, informers


async def start_shares(
    ours: OperatorSettings,
    kube: Kube,
    settings: kopf.OperatorSettings,
    where: str,
    events: Callable[..., None],
) -> ShareService:
    """The GPU-share service, its ledger rebuilt from the cluster, its webhook server's
    certificate and port, and both webhook configurations applied."""
    shares = ShareService(
        workers_of=share_service.workers_reader(kube),
        events=events,
        runtime_class=ours.gpu_share_runtime_class,
    )
    selector = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_CORE_MEM}"
    with step(f"listing the nodes and pods for GPU shares from {where}"):
        await shares.rebuild(
            await kube.list("v1", "Node", None, labels=selector),
            await kube.list("v1", "Pod", None),
        )
    source = ours.webhook_cert_dir or "a self-signed certificate"
    with step(f"reading the webhook certificate ({source})"):
        cert = (
            tls.mounted_certificate(Path(ours.webhook_cert_dir))
            if ours.webhook_cert_dir
            else tls.serving_certificate(
                ours.lock_namespace, ours.webhook_service, url=ours.webhook_url
            )
        )
    with step(f"serving the webhooks on port {ours.webhook_port}"):
        with socket.socket() as probe:  # Kopf binds it later, where a failure would only log
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("0.0.0.0", ours.webhook_port))
        webhook.configure_server(
            settings, cert, ours.webhook_port, client_ca=ours.webhook_client_ca
        )
    with step(f"applying the GPU-share webhook configurations to {where}"):
        # Every replica serves the webhooks, so every replica applies their configurations at
        # start-up: the one write that needs no Lease.
        await webhook.apply_configurations(
            lambda obj: kube.apply(obj, needs_lease=False),
            service_namespace=ours.lock_namespace,
            service_name=ours.webhook_service,
            port=443,
            ca_bundle=cert.ca_bundle,
            url=ours.webhook_url,
        )
    return shares


def serve_probes(
    ours: OperatorSettings, registry: kopf.OperatorRegistry, manager: Manager, workers: Workers
) -> str | None:
    """Serve ``/metrics`` and ``/readyz`` on ``--monitoring-port`` now, and register the
    liveness probe for Kopf to serve on ``--health-port``: its endpoint (None: off).

    Readiness stays on our own server, a thread: it must turn false the moment the Lease is
    lost or the caches are not filled, where Kopf's probe server keeps an answer for 10 s."""
    if ours.monitoring_port:
        with step(f"serving /metrics and /readyz on port {ours.monitoring_port}"):
            metrics.serve(
                ours.monitoring_port,
                {"/readyz": lambda: manager.ready() and workers.alive(HEALTHY_WITHIN_SECONDS)},
            )
    if not ours.health_port:
        return None
    with step(f"serving the liveness probe /healthz on port {ours.health_port}"):
        endpoint = liveness_endpoint(ours)
    liveness_probe(registry, workers)
    return endpoint


HEALTHY_WITHIN_SECONDS = 30.0
"""How long the event loop may go without a heartbeat before the operator is not alive (the
liveness probe fails) nor ready."""
#: The probe handler's id: the key of its result in the liveness probe's JSON answer.
LIVENESS_PROBE_ID = "heartbeat_age_seconds"


def liveness_probe(
    registry: kopf.OperatorRegistry, workers: Workers
) -> Callable[..., Awaitable[float]]:
    """Register, and return, the ``kopf.on.probe`` handler behind ``/healthz`` on
    ``--health-port``: the seconds since the event loop last beat, or
    :class:`kopf.PermanentError` once that is :data:`HEALTHY_WITHIN_SECONDS` or more, which
    makes the probe answer 500.

    Kopf's probe server runs on the event loop it probes: a loop stuck for good does not answer
    at all, which the kubelet counts as a failure once its probe times out, and this handler
    catches a loop that was stuck and is not any more (or whose heartbeat task is gone).
    A coroutine, as every handler (:class:`~mpijob.platform.kopf_tuning.NoThreads`); the error
    is permanent because Kopf retries an activity handler's other errors after a backoff,
    holding that request, and every later one, until the handler succeeds."""

    async def heartbeat_age(**_: Any) -> float:
        age = workers.since_beat()
        if not beat_in_time(age, HEALTHY_WITHIN_SECONDS):  # judged from the one reading
            raise kopf.PermanentError(
                f"the event loop last beat {age:.0f} s ago "
                f"(alive within {HEALTHY_WITHIN_SECONDS:.0f} s)"
            )
        return round(age, 3)

    kopf.on.probe(registry=registry, id=LIVENESS_PROBE_ID)(heartbeat_age)
    return heartbeat_age


def liveness_endpoint(ours: OperatorSettings) -> str:
    """Kopf's liveness endpoint, ``http://0.0.0.0:<--health-port>/healthz``, once that port is
    known to be free and not the monitoring port: Kopf binds it only once it runs, after the
    manager has started (and may campaign for the Lease), where a failure is a traceback in its
    log that stops the operator, rather than one line before the Lease was ever asked for.
    OSError when it cannot be bound, ValueError when both ports are one."""
    if ours.health_port == ours.monitoring_port:
        raise ValueError(
            f"--health-port and --monitoring-port are both {ours.health_port}; "
            "Kopf's liveness probe and our /metrics and /readyz need a port each"
        )
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", ours.health_port))
    return f"http://0.0.0.0:{ours.health_port}/healthz"


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


#: The gang backends and the API each needs served: the PodGroup kind of each.
GANG_APIS = (
    (GangKind.VOLCANO, keys.VOLCANO_POD_GROUP_API_VERSION),
    (GangKind.SCHEDULER_PLUGINS, keys.SCHED_PLUGINS_POD_GROUP_API_VERSION),
    (GangKind.WORKLOAD_API, keys.WORKLOAD_API_VERSION),
)


async def detect_gang_backends(kube: KubeApi, flag: str) -> None:
    """Say which gang backends this cluster serves and which one the flag chose.

    :class:`StartupFailed`, naming the fix, when ``--gang-scheduling=workload-api`` is chosen
    and the API server does not serve its PodGroups (a gate off, an older minor): its pods
    would be refused. Volcano's and scheduler-plugins' PodGroups may be installed after the
    operator starts, as upstream allows: their absence is a warning, and they are watched once
    served."""
    chosen = GangMode.from_flag(flag)
    served: list[str] = []
    for kind, group_version in GANG_APIS:
        try:
            found = await kube.resources(group_version) or {}
        except ApiError as error:
            log.warning("Could not read whether %s is served: %s", group_version, error)
            continue
        if any(r.get("name") == keys.POD_GROUP_PLURAL for r in found.get("resources") or []):
            served.append(f"{kind.value} ({group_version})")
        elif kind is chosen.kind and kind is GangKind.WORKLOAD_API:
            raise StartupFailed(
                f"--gang-scheduling={flag}: the API server does not serve {group_version} "
                "PodGroups; run Kubernetes 1.37 or later with the feature gate GenericWorkload "
                f"on and --runtime-config={group_version}=true, or choose another backend"
            )
        elif kind is chosen.kind:
            log.warning(
                "--gang-scheduling=%s: %s PodGroups are not served yet; watched once they are",
                flag,
                group_version,
            )
    log.info(
        "Gang backends served here: %s; gang scheduling: %s",
        ", ".join(served) or "none",
        f"{chosen.kind.value} (--gang-scheduling={flag})" if chosen.enabled else "off",
    )


async def server_minor(kube: KubeApi) -> int | None:
    """The API server's Kubernetes minor version; None when it cannot be read (the GPU quota
    check then counts the operator's claims itself, see :mod:`mpijob.gang.quota`)."""
    try:
        return quota.server_minor(await kube.version())
    except Exception as error:
        if not kube_module.transient(error, refusals=True):
            raise
        log.warning("Could not read the API server's version: %s", error)
        return None


def registry_for(
    ours: OperatorSettings,
    binding: GpuBinding = GpuBinding.ANNOTATIONS,
    shares: ShareService | None = None,
    user_agent: str = kube_module.USER_AGENT,
) -> kopf.OperatorRegistry:
    """Every handler: the watches, and with ``shares`` (``--fractional-gpus``) its webhooks.
    Kopf's watches log in exactly as the operator's own requests do, naming the replica."""
    registry = kopf.OperatorRegistry()

    async def login(**_: Any) -> kopf.ConnectionInfo:
        # A coroutine, as every handler (Kopf would run a plain function in its executor, which
        # the operator refuses: kopf_tuning.NoThreads). The credentials' files are read in the
        # loop's default executor: a read of files, nothing the loop changes.
        return kube_module.named(await asyncio.to_thread(connection_info), user_agent)

    kopf.on.login(registry=registry)(login)
    gang = GangMode.from_flag(ours.gang_scheduling)
    watches.register(
        registry, gang_api_version=gang.pod_group_api_version, dra=binding is GpuBinding.DRA
    )
    if shares is not None:
        webhook.register(registry, shares)
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


async def launch_image(ours: OperatorSettings, where: str) -> str:
    """The image jobs with ``mpijob.io/launch: agent`` copy the launch agent from:
    ``--launch-image``, else this operator's own (its pod's first container's, so a kustomize or
    Helm image override follows), else none (such jobs are then refused, saying why). Not a
    start-up failure when the pod cannot be read: only those jobs need it, and the log says."""
    if ours.launch_image:
        return ours.launch_image
    pod = credentials.own_pod()
    if pod is None:
        log.info(
            "No launch image: not in a pod and no --launch-image; jobs annotated "
            "%s: %s are refused",
            keys.LAUNCH,
            keys.LAUNCH_AGENT,
        )
        return ""
    kube = Kube.from_kubeconfig(ours.kubeconfig, qps=0, burst=1, concurrency=1)
    try:
        body = await kube.get("v1", "Pod", *pod)
    except Exception as e:
        if not kube_module.transient(e, refusals=True):
            raise
        log.warning(
            "Could not read this operator's pod %s/%s on %s for its image (%s); jobs "
            "annotated %s: %s are refused until --launch-image names it",
            *pod,
            where,
            e,
            keys.LAUNCH,
            keys.LAUNCH_AGENT,
        )
        return ""
    finally:
        await kube.aclose()
    containers = ((body or {}).get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("image") or "")


async def preflight(ours: OperatorSettings, where: str) -> tuple[GpuBinding, OperatorSettings]:
    """Before anything else: the API server answers, the CRDs are served and the GPU binding
    mode is chosen; returned with ``ours`` completed by the launch image (:func:`launch_image`).
    :class:`StartupFailed` when the API server does not answer within
    :data:`PREFLIGHT_SECONDS` (the kubelet restarts the pod, which tries again), when a CRD is
    missing, or when ``--gpu-binding=dra`` cannot work here."""
    with step(f"reading the kubeconfig for {where}"):
        kube = Kube.from_kubeconfig(ours.kubeconfig, qps=0, burst=1, concurrency=1)
    deadline = asyncio.get_running_loop().time() + PREFLIGHT_SECONDS
    try:
        while True:
            with step(f"checking the CRDs and the GPU binding mode on {where}"):
                try:
                    await check_crds(kube)
                    await detect_gang_backends(kube, ours.gang_scheduling)
                    mode = (await detect_gpu_binding(kube, ours.gpu_binding)).mode
                    image = await launch_image(ours, where)
                    return mode, dataclasses.replace(ours, launch_image=image)
                except OSError as e:
                    if asyncio.get_running_loop().time() > deadline:
                        raise StartupFailed(
                            f"reaching {where}: no answer within {PREFLIGHT_SECONDS:.0f} s: {e}"
                        ) from None
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
    again), and the youngest generation is collected less often (:data:`GC_YOUNG_THRESHOLD`).

    No collection first: the imports leave next to no cyclic garbage (5 objects of 68,000), and
    a full collection of everything they made costs 20 to 40 ms of start-up CPU."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run(ours: OperatorSettings, *, verbose: bool = False, json_logs: bool = False) -> None:
    """Run the operator until SIGINT/SIGTERM. :class:`StartupFailed` (logged by the caller, one
    line) when start-up cannot finish."""
    kopf_tuning.configure_logging(verbose=verbose, json_lines=json_logs)
    if ours.kubeconfig:
        os.environ["KUBECONFIG"] = ours.kubeconfig
    kopf_tuning.patch_kopf()
    with step("reading --fabric"):
        fabric = load_fabric(ours.fabric)
    tune_garbage_collector()
    # uvloop: the watch streams, Kopf's per-event tasks and our API calls all run on this loop.
    uvloop.run(main(ours, fabric))
