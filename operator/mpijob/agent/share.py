"""A ``core_mem`` node's GPU shares, node side: what the agent advertises and the step that does it.

:func:`read_gpus` reads each GPU's index, UUID and total memory through NVML;
:func:`extended_resources` turns them into the three extended resources the fractional ledger
and the scheduler count: ``aliyun.com/gpu-count`` (GPUs), ``aliyun.com/gpu-mem`` (the sum over
GPUs of each GPU's memory **rounded down to whole GiB**: an H100 80GB reports 81,559 MiB and
counts 79, so a share never promises memory the card does not have) and
``aliyun.com/gpu-core.percentage`` (100 per GPU). :func:`status_patch` is the JSON patch of the
Node's status that sets them in capacity and allocatable (on a real node the kubelet derives
allocatable from capacity; a simulated node has no kubelet).

:class:`ShareStep` is one turn of the agent's loop: start or check one MPS daemon per GPU
(:mod:`mpijob.agent.mps`), then, only when every daemon is up with its defaults in place, patch
the node status. It patches on every turn, not on change, because the kubelet zeroes extended
resources when it finds the node recreated.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from mpijob import keys
from mpijob.agent.mps import NO_CAPS, Defaults, MpsDaemon, MpsError

logger = logging.getLogger("mpijob.agent.share")

GIB: Final = 1 << 30
PERCENT_PER_GPU: Final = 100


class MemoryNvml(Protocol):
    """The part of ``pynvml`` :func:`read_gpus` calls."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...


@dataclass(frozen=True)
class SharedGpu:
    """One GPU a node shares out."""

    index: int
    uuid: str
    memory_gib: int
    """Total memory rounded down to whole GiB."""


class NoGpus(Exception):
    """Nothing to share: no driver, no GPU, or an NVML error (the message says which)."""


def read_gpus(nvml: MemoryNvml) -> list[SharedGpu]:
    """Initialise NVML, read every GPU's UUID and memory, shut NVML down."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NoGpus(f"NVML did not initialise: {error}") from None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(
                SharedGpu(
                    index,
                    uuid.decode() if isinstance(uuid, bytes) else uuid,
                    total // GIB,
                )
            )
    except nvml.NVMLError as error:
        raise NoGpus(f"NVML failed while reading GPU memory: {error}") from None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if not gpus:
        raise NoGpus("NVML sees no GPU")
    return gpus


def extended_resources(gpus: Sequence[SharedGpu]) -> dict[str, int]:
    """The three advertised counts of a node with ``gpus``."""
    return {
        keys.GPU_COUNT_RESOURCE: len(gpus),
        keys.GPU_MEM_RESOURCE: sum(gpu.memory_gib for gpu in gpus),
        keys.GPU_CORE_PERCENTAGE_RESOURCE: PERCENT_PER_GPU * len(gpus),
    }


def status_patch(resources: dict[str, int]) -> list[dict[str, Any]]:
    """JSON patch (``/status`` subresource) setting ``resources`` in capacity and allocatable."""
    return [
        {"op": "add", "path": f"/status/{section}/{name.replace('/', '~1')}", "value": str(value)}
        for section in ("capacity", "allocatable")
        for name, value in resources.items()
    ]


PatchStatus = Callable[[str, list[dict[str, Any]]], None]


class ShareStep:
    """One turn: daemons up (unless ``daemon`` is None), then the node status patched.

    ``patch`` None prints the patch instead (dry run). Returns whether the turn succeeded.
    """

    def __init__(
        self,
        nvml: MemoryNvml,
        *,
        node: str,
        patch: PatchStatus | None,
        daemon: Callable[[str], MpsDaemon] | None,
        defaults: Defaults = NO_CAPS,
        echo: Callable[[str], None] = print,
    ) -> None:
        self._nvml = nvml
        self._node = node
        self._patch = patch
        self._daemon = daemon
        self._defaults = defaults
        self._echo = echo

    def __call__(self) -> bool:
        try:
            gpus = read_gpus(self._nvml)
        except NoGpus as reason:
            logger.warning("Advertised no GPU shares: %s node=%s", reason, self._node)
            return True  # a node without GPUs is not a failure of the agent
        if self._daemon is not None:
            for gpu in gpus:
                try:
                    self._daemon(gpu.uuid).start(self._defaults)
                except MpsError as error:
                    logger.error("Advertised no GPU shares: %s node=%s", error, self._node)
                    return False
        body = status_patch(extended_resources(gpus))
        if self._patch is None:
            import json

            self._echo(json.dumps(body))
            return True
        try:
            self._patch(self._node, body)
        except Exception:
            logger.exception("Failed to patch the node status node=%s", self._node)
            return False
        return True
