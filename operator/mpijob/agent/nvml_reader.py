"""Reads a node's GPU topology through NVML.

Takes any object shaped like the ``pynvml`` module (the real one, or
:class:`~mpijob.agent.fake_nvml.FakeNvml` in tests and simulated nodes). Per GPU: index, UUID,
PCI bus id, NUMA node. Per pair: the PCIe common ancestor, and NVLinks counted link by link:
an enabled link whose remote end is a GPU counts toward that GPU (fewer of the two directions,
should they disagree); links into NVSwitch make every pair of switch-attached GPUs linked by the
fewer of their switch link counts, which is what NVIDIA's own allocator misses. Links NVML
reports as unsupported are skipped. Called by :mod:`mpijob.agent.main`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from typing import Any, Final, Protocol

from mpijob.placement.model import Gpu, Link, PcieLevel, Topology

#: ``NVML_NVLINK_MAX_LINKS`` of current NVML; older GPUs answer "not supported" past their own.
NVLINK_MAX_LINKS: Final = 36
FEATURE_ENABLED: Final = 1
DEVICE_TYPE_SWITCH: Final = 2
#: ``nvmlDeviceGetNvLinkVersion`` values to NVLink generations (2.2 and 3.1 are minor revisions).
NVLINK_GENERATION: Final = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}


class Nvml(Protocol):
    """The part of ``pynvml`` the reader calls."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any: ...
    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int: ...


class NoTopology(Exception):
    """Nothing to publish: no driver or library, no GPU, an NVML error, or unsupported GPUs."""


def discover(nvml: Nvml) -> Topology:
    """Initialise NVML, read the topology, shut NVML down; NoTopology says why there is none."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NoTopology(f"NVML did not initialise: {error}") from None
    try:
        return read_topology(nvml)
    except nvml.NVMLError as error:
        raise NoTopology(f"NVML failed while reading the topology: {error}") from None
    except ValueError as error:
        raise NoTopology(f"GPUs not supported: {error}") from None
    finally:
        # Nothing to do about a failed shutdown; the reading stands.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def read_topology(nvml: Nvml) -> Topology:
    """The topology of the GPUs NVML sees (NVML already initialised)."""
    count = nvml.nvmlDeviceGetCount()
    if count < 1:
        raise NoTopology("NVML sees no GPU")
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    buses = [_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId) for handle in handles]
    gpus = tuple(
        Gpu(
            index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=buses[index],
            numa_node=_numa(nvml, handle),
        )
        for index, handle in enumerate(handles)
    )
    index_of_bus = {bus: index for index, bus in enumerate(buses)}
    direct = [Counter[int]() for _ in handles]
    switched = [0] * count
    versions: Counter[int] = Counter()
    for index, handle in enumerate(handles):
        for link in _enabled_links(nvml, handle):
            if _remote_type(nvml, handle, link) == DEVICE_TYPE_SWITCH:
                switched[index] += 1
            else:
                remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                if remote not in index_of_bus:
                    continue  # a CPU (IBM NPU) or a device we do not place on
                direct[index][index_of_bus[remote]] += 1
            versions[_version(nvml, handle, link)] += 1
    links = []
    for a, b in itertools.combinations(range(count), 2):
        pcie = _pcie_level(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
        nvlinks = min(direct[a][b], direct[b][a])
        through_switch = not nvlinks and min(switched[a], switched[b]) > 0
        if through_switch:
            nvlinks = min(switched[a], switched[b])
        links.append(Link(a, b, nvlinks=nvlinks, nvswitch=through_switch, pcie=pcie))
    any_nvlink = any(link.nvlinks for link in links)
    versions.pop(0, None)
    generation = max((NVLINK_GENERATION.get(v, 5) for v in versions), default=2)
    return Topology(
        _text(nvml.nvmlDeviceGetName(handles[0])),
        gpus,
        tuple(links),
        nvlink_gen=generation if any_nvlink else 0,
        pcie_gen=_pcie_generation(nvml, handles),
    )


def _pcie_level(value: int) -> PcieLevel:
    try:
        return PcieLevel(value)
    except ValueError:
        return PcieLevel.SYS  # a level newer than this code: assume the farthest


def _enabled_links(nvml: Nvml, handle: Any) -> list[int]:
    enabled = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == FEATURE_ENABLED:
                enabled.append(link)
        except nvml.NVMLError:
            continue  # not supported / invalid argument: this GPU has no such link
    return enabled


def _remote_type(nvml: Nvml, handle: Any, link: int) -> int:
    try:
        return nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    except nvml.NVMLError:
        return 0  # drivers before NVSwitch systems only link GPUs


def _version(nvml: Nvml, handle: Any, link: int) -> int:
    try:
        return nvml.nvmlDeviceGetNvLinkVersion(handle, link)
    except nvml.NVMLError:
        return 0


def _numa(nvml: Nvml, handle: Any) -> int | None:
    try:
        node = nvml.nvmlDeviceGetNumaNodeId(handle)
    except nvml.NVMLError:
        return None
    return node if node >= 0 else None


def _pcie_generation(nvml: Nvml, handles: list[Any]) -> int:
    try:
        generation = min(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle) for handle in handles)
    except nvml.NVMLError:
        return 3
    return min(max(generation, 1), 6)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus_id(value: str | bytes) -> str:
    """Bus id in NVML's long form, upper case, with an 8-digit domain (remote ids may differ)."""
    text = _text(value).strip().upper()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):08X}:{rest}" if rest else text
