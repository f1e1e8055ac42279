"""Operator lifecycle: configure Kopf once, build the runtime, start and stop the workers.

``run`` is the programmatic entry (the CLI calls it). Kopf is configured here and nowhere else:
its peering is off (a Lease elects the leader instead), Event posting is off (we post our own,
with upstream's source component), its finalizer and storage keys use our prefix so that if
anything is ever stored it is ours, and node watches are filtered server-side to opted-in nodes.
Before Kopf starts, :func:`preflight` checks that the CRDs are served and picks the
``--gpu-binding`` mode, which decides the watches registered. With ``--fractional-gpus`` it
also registers :mod:`~mpijob.handlers.fractional` (GPU-share webhooks), serves them with a
certificate made at start, and applies their configurations.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import orjson
import uvloop
import yaml

from mpijob import keys, metrics
from mpijob.admission import quota
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.desired.gpu_binding import Choice, ClusterFacts, GpuBinding, choose
from mpijob.handlers import fractional, reconcile, watches
from mpijob.handlers.admission import Admission, store_decision
from mpijob.handlers.deferred import DeferredPatches
from mpijob.handlers.kube import ApiError, Kube, connection_info
from mpijob.handlers.leader import LeaderElector
from mpijob.handlers.recorder import Recorder
from mpijob.handlers.runtime import Runtime
from mpijob.handlers.workers import Workers
from mpijob.placement import fabric as fabric_module
from mpijob.placement import fabric_labels
from mpijob.placement.fabric import Fabric
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: the operator registers no on.create/update/resume handlers, the only ones a
    diff is for. Kopf still builds an essence of every event's body (a deep copy of the whole
    object) before it knows whether any handler needs it; this storage makes that essence empty
    and never stores one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.persistence.finalizer = keys.PREFIX + "finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mpijob.io")
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.watching.chunk_size = 500
    # Kopf's worker for an object keeps that object's last event body until it exits, 5 s
    # idle by default: under a burst of pod events that held every recent pod whole (peak RSS
    # 102 -> 91 MiB in make bench with 0.5 s). A pod's next event after that costs a new task.
    settings.queueing.idle_timeout = 0.5
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
        leader = LeaderElector(namespace=ours.lock_namespace, name=ours.lock_name, kube=kube)
        leader.start()
    else:
        metrics.IS_LEADER.set(1)
    instance = leader.identity if leader else os.environ.get("HOSTNAME", "mpijob-operator")
    rt = Runtime(
        settings=ours,
        gpu_binding=memo.get("gpu_binding", GpuBinding.ANNOTATIONS),
        kube=kube,
        recorder=Recorder(kube, instance=instance, namespaces=ours.namespaces),
        deferred=DeferredPatches(kube),
        workers=Workers(ours.threadiness, leader=leader),
    )
    # Indices are live mappings: empty now, complete when the workers open (see watches).
    rt.cache.indices = {name: kwargs[name] for name in watches.INDICES if name in kwargs}
    rt.cache.server_minor = await server_minor(kube)
    memo["runtime"] = rt
    rt.admission = Admission(
        write_decision=lambda obj: store_decision(kube, obj),
        enqueue=rt.workers.enqueue,
        snapshot=rt.cache.placement_snapshot,
        live=rt.cache.job,
        decision_of=rt.cache.decision,
        priority_values=rt.cache.priority_values,
        inter_node_gbps=ours.inter_node_gbps,
        binding=rt.gpu_binding,
        fabric=memo.get("fabric"),
        create_object=kube.create,
        get_object=kube.get,
    )
    rt.workers.run(rt.admission.run_forever(), name="admission")
    fabric = memo.get("fabric")
    if fabric is not None and fabric_labels.hypernode_tiers(fabric):
        rt.workers.run(watches.follow_hypernodes(rt), name="hypernodes")
    if ours.fractional_gpus:
        shares: fractional.FractionalAdmission = memo["fractional"]
        shares.workers_of = fractional.workers_reader(kube)
        shares.events = rt.recorder.post
        selector = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_CORE_MEM}"
        await shares.rebuild(
            await kube.list("v1", "Node", None, labels=selector),
            await kube.list("v1", "Pod", None),
        )
        cert = (
            fractional.mounted_certificate(Path(ours.webhook_cert_dir))
            if ours.webhook_cert_dir
            else fractional.serving_certificate(
                ours.lock_namespace, ours.webhook_service, url=ours.webhook_url
            )
        )
        fractional.configure_server(
            settings, cert, ours.webhook_port, client_ca=ours.webhook_client_ca
        )
        rt.workers.run(
            shares.run_placement(
                fractional.pod_patcher(kube), leader.leading if leader is not None else None
            ),
            name="gpu-share-placement",
        )
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


async def detect_gpu_binding(kube: Kube, flag: str) -> Choice:
    """The ``--gpu-binding`` mode on this cluster, logged with its reason.

    Two reads: the ``resource.k8s.io/v1`` discovery document and the ``gpu.nvidia.com``
    DeviceClass. A read the API server refuses otherwise than "not found" (e.g. forbidden) counts
    as absent and is named in the reason. ValueError from :func:`choose` when ``dra`` is forced on
    a server without the API.
    """
    unknown = []
    try:
        await kube.request("GET", "/apis/" + keys.DRA_API_VERSION)
        served = True
    except ApiError as error:
        served = False
        if not error.not_found:
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


async def server_minor(kube: Kube) -> int | None:
    """The API server's Kubernetes minor version; None when it cannot be read (the GPU quota
    check then counts the operator's claims itself, see :mod:`mpijob.admission.quota`)."""
    try:
        return quota.server_minor(await kube.request("GET", "/version"))
    except (ApiError, OSError) as error:
        log.warning("Could not read the API server's version: %s", error)
        return None


async def cleanup(memo: Any, **_: Any) -> None:
    rt: Runtime | None = memo.get("runtime")
    if rt is not None:
        await rt.stop()


def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf's watches log in exactly as the operator's own requests do."""
    return connection_info()


def registry_for(
    ours: OperatorSettings,
    binding: GpuBinding = GpuBinding.ANNOTATIONS,
    memo: kopf.Memo | None = None,
) -> kopf.OperatorRegistry:
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
        shares = fractional.FractionalAdmission(runtime_class=ours.gpu_share_runtime_class)
        fractional.register(registry, shares)
        if memo is not None:
            memo["fractional"] = shares
    return registry


class MissingCRD(Exception):
    """A CustomResourceDefinition the operator needs is not installed."""


#: (group/version, plural, the file under crds/ that defines it)
NEEDED_CRDS = (
    (keys.API_VERSION, keys.PLURAL, "kubeflow.org_mpijobs.yaml"),
    (keys.DECISION_API_VERSION, keys.DECISION_PLURAL, "mpijob.io_placementdecisions.yaml"),
)


async def check_crds(kube: Kube) -> None:
    """Raise :class:`MissingCRD`, naming the fix, when a kind the operator watches is not
    served: Kopf would otherwise wait for it silently and never reconcile anything. Any other
    failure (the API server still starting) is left to Kopf's own retries."""
    for group_version, plural, source in NEEDED_CRDS:
        try:
            served = await kube.request("GET", f"/apis/{group_version}")
        except ApiError as e:
            if not e.not_found:
                log.warning("Could not check that %s is served: %s", group_version, e)
                continue
            served = {}
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


def _loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # what orjson refuses and json takes (lone surrogates)
        return json.loads(text)


def decode_watch_events_with_orjson() -> None:
    """Kopf decodes every line of its watch streams with the standard library's ``json``
    (about a tenth of the operator's CPU under load); orjson gives the same objects in a
    fraction of the time. Kopf has no setting for it, so the name its streaming module decodes
    with is pointed at :func:`_loads`; a Kopf without that name keeps its own decoding."""
    from kopf._cogs.clients import api

    if getattr(api, "json", None) is json:
        decoding = types.ModuleType(json.__name__, json.__doc__)
        vars(decoding).update({**vars(json), "loads": _loads})
        api.json = decoding  # type: ignore[attr-defined]
    else:
        log.warning("Kopf's watch decoding was not found; watch events decode with json")


class _SetCondition(asyncio.Condition):
    """A Kopf ``ToggleSet``'s condition that wakes its waiters only when the set's state is not
    the one they saw (see :func:`toggle_sets_wake_on_change`)."""

    def __init__(self, toggles: Any) -> None:
        super().__init__()
        self.toggles = toggles
        self.seen: set[bool | None] = set()
        """The set's state each task waiting now saw when it last looked; None: a task waiting
        on one of its toggles (woken at every change, as before)."""

    def notify_all(self) -> None:
        if self.seen - {self.toggles.is_on()}:
            self.seen.clear()  # every waiter looks again, and says what it saw
            super().notify_all()


def toggle_sets_wake_on_change() -> None:
    """Kopf holds every object's first event until all indices are filled: each object's task
    waits on one condition shared by a ``ToggleSet`` of one toggle per object still to index,
    and every object indexed wakes all of those tasks, each then looking at every toggle left.
    With N objects that is about N^2 wake-ups: with 10,000 MPIJobs, ten minutes after a start
    no job's status said it waited yet, the process busy in those wake-ups (make
    bench-queue-cluster, profiled). Here a set's waiters are woken only when the set's state is
    not the one they saw, which during the filling happens once, at its end. A Kopf whose
    toggles differ keeps its own."""
    from kopf._cogs.aiokits import aiotoggles

    toggle_set, toggle = aiotoggles.ToggleSet, aiotoggles.Toggle
    if getattr(toggle_set, "_wakes_on_change", False):
        return
    if not all(
        callable(getattr(cls, name, None))
        for cls, name in ((toggle_set, "wait_for"), (toggle_set, "is_on"), (toggle, "wait_for"))
    ):
        log.warning("Kopf's toggle sets were not found; their waiters wake at every change")
        return
    init, wait_on_toggle = toggle_set.__init__, toggle.wait_for

    def __init__(self: Any, fn: Any) -> None:
        init(self, fn)
        if not isinstance(getattr(self, "_condition", None), asyncio.Condition):
            raise TypeError("Kopf's ToggleSet has no condition")
        self._condition = _SetCondition(self)  # no toggle shares the old one yet

    async def wait_for_set(self: Any, state: bool) -> None:
        condition: _SetCondition = self._condition

        def reached() -> bool:
            on = bool(self.is_on())
            if on != bool(state):
                condition.seen.add(on)
            return on == bool(state)

        async with condition:
            await condition.wait_for(reached)

    async def wait_for_toggle(self: Any, state: bool) -> None:
        condition = self._condition
        if not isinstance(condition, _SetCondition):
            await wait_on_toggle(self, state)
            return

        def reached() -> bool:
            if self.is_on() != bool(state):
                condition.seen.add(None)
            return bool(self.is_on() == bool(state))

        async with condition:
            await condition.wait_for(reached)

    toggle_set.__init__ = __init__  # type: ignore[method-assign]
    toggle_set.wait_for = wait_for_set  # type: ignore[method-assign]
    toggle.wait_for = wait_for_toggle  # type: ignore[method-assign]
    toggle_set._wakes_on_change = True  # type: ignore[attr-defined]


#: Allocations between two collections of the cyclic garbage collector's youngest generation
#: (Python's default: 700). A watch event decodes into hundreds of objects that live until Kopf
#: has handled it; at 700 the collector ran every few events while they were alive, scanned
#: them, promoted them and scanned them again in the older generations: 0.9 s of 4.0 s CPU in
#: ``make bench``. At this size most of them are freed by their reference counts first.
GC_YOUNG_THRESHOLD = 20_000


def views_without_cycles() -> None:
    """Kopf wraps every event's body in a ``Body`` and gives each handler call a ``Patch``;
    both keep their ``metadata``/``spec``/``status`` views as attributes, and the metadata view
    its ``labels``/``annotations`` views, while each view points back at its parent. So every
    event's whole object stayed until the garbage collector found the cycle. Built on each
    access instead (a view is a path over the same dict: reads and writes go where they went),
    the views leave no cycle and an event's body is freed as soon as Kopf drops it. A Kopf
    whose classes differ keeps its own."""
    from kopf._cogs.structs import bodies, dicts, patches

    views: dict[type, dict[str, type]] = {
        bodies.Body: {"metadata": bodies.Meta, "meta": bodies.Meta, "spec": bodies.Spec,
                      "status": bodies.Status},
        patches.Patch: {"metadata": patches.MetaPatch, "meta": patches.MetaPatch,
                        "spec": patches.SpecPatch, "status": patches.StatusPatch},
        bodies.Meta: {"labels": dicts.MappingView, "annotations": dicts.MappingView},
        patches.MetaPatch: {"labels": dicts.MutableMappingView,
                            "annotations": dicts.MutableMappingView},
    }  # fmt: skip
    cached = {"_meta", "_spec", "_status"}
    if not all(
        isinstance(vars(cls).get(name), property) for cls, named in views.items() for name in named
    ):
        log.warning("Kopf's body and patch views were not found; they keep their cycles")
        return

    def without_cached_views(init: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            for name in cached & vars(self).keys():
                delattr(self, name)  # the view goes, and with it the cycle

        return __init__

    # A body and a metadata view are only their path over the object now: nothing is built
    # first to be dropped (the properties below build the views when asked).
    bodies.Body.__init__ = _path_view(dicts.ReplaceableMappingView)  # type: ignore[method-assign,assignment]
    bodies.Meta.__init__ = _path_view(dicts.MappingView, "metadata")  # type: ignore[method-assign,assignment]
    patches.MetaPatch.__init__ = _path_view(dicts.MutableMappingView, "metadata")  # type: ignore[method-assign,assignment]
    patches.Patch.__init__ = without_cached_views(patches.Patch.__init__)  # type: ignore[method-assign]
    for cls, named in views.items():
        for name, view in named.items():
            setattr(cls, name, _view_property(view, name))


def _path_view(base: Any, *path: str) -> Callable[[Any, Any], None]:
    def __init__(self: Any, src: Any) -> None:
        base.__init__(self, src, *path)

    return __init__


def _view_property(view: type, name: str) -> property:
    """A parent's view built on access: metadata's labels and annotations are plain views by
    path, the others know their path."""
    if name in ("labels", "annotations"):
        return property(lambda self: view(self, name))
    return property(view)


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


def run(ours: OperatorSettings) -> None:
    """Run the operator until SIGINT/SIGTERM."""
    if ours.kubeconfig:
        os.environ["KUBECONFIG"] = ours.kubeconfig
    decode_watch_events_with_orjson()
    views_without_cycles()
    toggle_sets_wake_on_change()
    fabric = load_fabric(ours.fabric)  # a bad --fabric stops here, naming the problem
    binding = asyncio.run(preflight(ours))
    memo = kopf.Memo(settings=ours, gpu_binding=binding, fabric=fabric)
    tune_garbage_collector()
    # uvloop: the watch streams, Kopf's per-event tasks and our API calls all run on this loop.
    uvloop.run(
        kopf.operator(
            registry=registry_for(ours, binding, memo),
            memo=memo,
            standalone=True,
            clusterwide=ours.cluster_wide,
            namespaces=list(ours.namespaces),
        )
    )
