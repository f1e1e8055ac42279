"""What each container really got: the kubelet's pod-resources API, against the placement.

The kubelet serves ``PodResourcesLister`` (``podresources/v1``) on a unix socket,
``/var/lib/kubelet/pod-resources/kubelet.sock``; ``List`` returns, per pod and container, the
device-plugin devices by resource name (``nvidia.com/gpu``: GPU UUIDs, or indices under the
device plugin's ``index`` id strategy, with a ``::<n>`` suffix when a GPU is shared) and the DRA
devices by claim (driver, pool, device name, e.g. ``gpu.nvidia.com``, the node, ``gpu-3``).

:func:`check_node` compares, for every pod on this node with ``mpijob.io/gpu-uuids``, the
recorded UUIDs with what the kubelet says its containers hold: ``match``, ``mismatch`` (the
device plugin ignored the placement, or a claim got other devices), ``pod-not-found`` (the
kubelet has not admitted it yet, or it is gone) or ``socket-missing`` (no kubelet socket here:
the agent's hostPath mount is missing, or the node runs no kubelet). Each non-match is one clear
log line; nothing raises. A real gRPC client (grpcio, stubs generated from the kubelet's proto in
:mod:`mpijob.agent.podresources_v1`).
"""

from __future__ import annotations

import enum
import logging
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from mpijob import keys
from mpijob.agent.podresources_v1 import api_pb2, api_pb2_grpc
from mpijob.pods.predicates import terminal

logger = logging.getLogger("mpijob.agent")

SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Seconds one ``List`` may take; the kubelet answers from memory.
TIMEOUT: Final = 10.0

PodKey = tuple[str, str]
"""(namespace, name)."""


@dataclass(frozen=True)
class ClaimDevice:
    """One device a DRA claim gave a container."""

    driver: str
    pool: str
    device: str
    claim: str = ""
    """``<namespace>/<name>`` of the claim."""


@dataclass(frozen=True)
class ContainerHeld:
    """What the kubelet says one container holds."""

    name: str
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Device-plugin device ids by resource name."""
    claimed: tuple[ClaimDevice, ...] = ()


Held = Mapping[PodKey, tuple[ContainerHeld, ...]]


class SocketMissing(Exception):
    """No pod-resources socket at the path."""


def list_pods(
    socket: str = SOCKET, timeout: float = TIMEOUT
) -> dict[PodKey, tuple[ContainerHeld, ...]]:
    """Every pod the kubelet knows on this node, with what its containers hold.

    SocketMissing when ``socket`` is not a unix socket; grpc.RpcError when the kubelet does not
    answer (unavailable, timeout, or the API is turned off).
    """
    try:
        is_socket = stat.S_ISSOCK(Path(socket).stat().st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        raise SocketMissing(socket)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        # The generated stub is untyped; the response is the typed message of api_pb2.pyi.
        stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        response: api_pb2.ListPodResourcesResponse = stub.List(
            api_pb2.ListPodResourcesRequest(), timeout=timeout
        )
    return {
        (pod.namespace, pod.name): tuple(_container(c) for c in pod.containers)
        for pod in response.pod_resources
    }


def _container(message: api_pb2.ContainerResources) -> ContainerHeld:
    devices: dict[str, tuple[str, ...]] = {}
    for entry in message.devices:
        devices[entry.resource_name] = (
            *devices.get(entry.resource_name, ()),
            *entry.device_ids,
        )
    claimed = tuple(
        ClaimDevice(
            r.driver_name,
            r.pool_name,
            r.device_name,
            f"{dynamic.claim_namespace}/{dynamic.claim_name}",
        )
        for dynamic in message.dynamic_resources
        for r in dynamic.claim_resources
    )
    return ContainerHeld(message.name, devices, claimed)


# --- the comparison (pure) --------------------------------------------------------------------


class Verdict(enum.Enum):
    MATCH = "match"
    MISMATCH = "mismatch"
    POD_NOT_FOUND = "pod-not-found"
    SOCKET_MISSING = "socket-missing"
    UNREADABLE = "unreadable"
    """The kubelet did not answer."""


@dataclass(frozen=True)
class Check:
    namespace: str
    pod: str
    verdict: Verdict
    recorded: tuple[str, ...]
    """``mpijob.io/gpu-uuids`` of the pod, in its order."""
    actual: tuple[str, ...] = ()
    """UUIDs (or, where no UUID is known, raw device ids) the kubelet says the pod holds."""
    detail: str = ""

    @property
    def message(self) -> str:
        """One line for the log (and, later, an Event)."""
        where = f"pod {self.namespace}/{self.pod}"
        recorded = ",".join(self.recorded)
        if self.verdict is Verdict.MATCH:
            return f"{where}: holds the placed GPUs {recorded}"
        if self.verdict is Verdict.MISMATCH:
            return (
                f"{where}: placed on GPUs {recorded} but its containers hold "
                f"{','.join(self.actual) or 'no GPU'}"
            )
        if self.verdict is Verdict.POD_NOT_FOUND:
            return f"{where}: the kubelet reports no resources for it (not admitted yet, or gone)"
        if self.verdict is Verdict.SOCKET_MISSING:
            return (
                f"{where}: cannot check its GPUs: no pod-resources socket at {self.detail} "
                "(mount /var/lib/kubelet/pod-resources into the agent)"
            )
        return f"{where}: cannot check its GPUs: the kubelet did not answer ({self.detail})"


def held_gpus(
    containers: Iterable[ContainerHeld],
    *,
    index_uuids: Mapping[str, str] | None = None,
    device_uuids: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The GPUs a pod's containers hold, as UUIDs where they can be told.

    Device-plugin ids of ``nvidia.com/gpu`` are UUIDs, possibly with a ``::<n>`` replica suffix
    (time-slicing, MPS), or indices (``index_uuids`` maps them). DRA devices of NVIDIA's driver
    are named ``gpu-<minor>`` (``device_uuids`` maps them, e.g. from the node's ResourceSlice).
    An id neither map knows is kept as it is, so a mismatch still shows it.
    """
    out: list[str] = []
    for container in containers:
        for device_id in container.devices.get(keys.GPU_RESOURCE, ()):
            base = device_id.split("::", 1)[0]
            out.append((index_uuids or {}).get(base, base))
        for device in container.claimed:
            if device.driver == keys.NVIDIA_GPU_DRIVER:
                out.append((device_uuids or {}).get(device.device, device.device))
    return tuple(dict.fromkeys(out))


def compare(
    pods: Iterable[Mapping[str, Any]],
    held: Held | None,
    *,
    index_uuids: Mapping[str, str] | None = None,
    device_uuids: Mapping[str, str] | None = None,
    unavailable: Verdict = Verdict.SOCKET_MISSING,
    detail: str = "",
) -> list[Check]:
    """A check per unfinished pod with ``mpijob.io/gpu-uuids`` among ``pods`` (this node's).

    ``held`` is None when the kubelet could not be read; every pod then gets ``unavailable``.
    """
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(keys.GPU_UUIDS)
        if not text or terminal(pod):
            continue
        recorded = tuple(u.strip() for u in text.split(",") if u.strip())
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if held is None:
            out.append(Check(*key, unavailable, recorded, detail=detail))
        elif key not in held:
            out.append(Check(*key, Verdict.POD_NOT_FOUND, recorded))
        else:
            actual = held_gpus(held[key], index_uuids=index_uuids, device_uuids=device_uuids)
            verdict = Verdict.MATCH if set(actual) == set(recorded) else Verdict.MISMATCH
            out.append(Check(*key, verdict, recorded, actual))
    return out


def device_uuids(slices: Iterable[Mapping[str, Any]], node: str) -> dict[str, str]:
    """``gpu-<minor>`` -> UUID of this node's NVIDIA devices, from its ResourceSlices."""
    out = {}
    for item in slices:
        spec = item.get("spec") or {}
        if (
            spec.get("driver") != keys.NVIDIA_GPU_DRIVER
            or (spec.get("pool") or {}).get("name") != node
        ):
            continue
        for device in spec.get("devices") or []:
            uuid = ((device.get("attributes") or {}).get("uuid") or {}).get("string")
            if uuid:
                out[str(device.get("name"))] = str(uuid)
    return out


# --- the agent's step --------------------------------------------------------------------------


def check_node(
    pods: Iterable[Mapping[str, Any]],
    *,
    socket: str = SOCKET,
    timeout: float = TIMEOUT,
    index_uuids: Mapping[str, str] | None = None,
    device_uuids: Mapping[str, str] | None = None,
) -> list[Check]:
    """Read the kubelet and compare; logs every check that is not a match. Never raises."""
    pods = list(pods)
    try:
        held: Held | None = list_pods(socket, timeout)
        unavailable, detail = Verdict.SOCKET_MISSING, ""
    except SocketMissing:
        held, unavailable, detail = None, Verdict.SOCKET_MISSING, socket
    except grpc.RpcError as error:
        code = error.code() if isinstance(error, grpc.Call) else None
        text = error.details() if isinstance(error, grpc.Call) else str(error)
        held, unavailable = None, Verdict.UNREADABLE
        detail = f"{code.name if code else 'error'}: {text}"
    checks = compare(
        pods,
        held,
        index_uuids=index_uuids,
        device_uuids=device_uuids,
        unavailable=unavailable,
        detail=detail,
    )
    for check in checks:
        if check.verdict is Verdict.MATCH:
            logger.debug(check.message)
        elif check.verdict is Verdict.POD_NOT_FOUND:
            logger.info(check.message)
        else:
            logger.warning(check.message)
    return checks
