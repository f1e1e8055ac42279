"""A stand-in for ``pynvml`` that answers from a :class:`~mpijob.placement.model.Topology`.

It answers link by link as a driver does: direct NVLinks occupy link slots whose remote PCI
info is the peer GPU, NVSwitch systems have every slot pointing at a switch, unused slots are
disabled, slots past the GPU's last one and GPUs without NVLink answer "not supported", and an
unknown NUMA node is "not supported" too. ``init_error`` makes :meth:`FakeNvml.nvmlInit` fail as
a node without driver does; ``memory`` is every GPU's total memory in bytes. Used by the agent's
tests and by ``mpijob-agent --simulate`` on local clusters, whose nodes have no GPU.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, replace
from typing import Final

from mpijob.placement.model import Gpu, PcieLevel, Topology

ERROR_INVALID_ARGUMENT: Final = 2
ERROR_NOT_SUPPORTED: Final = 3
ERROR_DRIVER_NOT_LOADED: Final = 9
ERROR_LIBRARY_NOT_FOUND: Final = 12
_MESSAGES: Final = {
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
}
#: Link slots a GPU of the fake has (past them: invalid argument).
SLOTS: Final = 18
_GPU, _SWITCH = 0, 2
#: NVLink generation to ``nvmlDeviceGetNvLinkVersion`` value.
_VERSION: Final = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}
_SWITCH_BUS: Final = b"00000000:C0:00.0"


class FakeNvmlError(Exception):
    """Raised like ``pynvml.NVMLError``, with the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))
        self.value = value


@dataclass(frozen=True)
class PciInfo:
    """The field of ``nvmlPciInfo_t`` the reader uses (bytes, as ctypes returns it)."""

    busId: bytes


@dataclass(frozen=True)
class MemoryInfo:
    """``nvmlMemory_t``: bytes."""

    total: int
    free: int
    used: int


#: What NVML reports as an H100 80GB HBM3's total memory (81,559 MiB).
H100_MEMORY: Final = 81559 << 20


class FakeNvml:
    """NVML of a node with the given topology; :attr:`topology` is what a reader should see."""

    NVMLError = FakeNvmlError

    def __init__(
        self,
        topology: Topology,
        *,
        product: str = "Fake GPU",
        init_error: int | None = None,
        memory: int = H100_MEMORY,
    ) -> None:
        self.topology = replace(topology, name=product, gpus=_with_identities(topology))
        self.memory = memory
        self.init_error = init_error
        self.initialised = False
        self._slots = _slots(self.topology)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return self.topology.size

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.topology.size:
            raise FakeNvmlError(ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.topology.name

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.topology.gpus[handle].uuid or ""

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> MemoryInfo:
        return MemoryInfo(total=self.memory, free=self.memory, used=0)

    def nvmlDeviceGetPciInfo(self, handle: int) -> PciInfo:
        return PciInfo((self.topology.gpus[handle].pci_bus_id or "").encode())

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        node = self.topology.gpus[handle].numa_node
        if node is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return node

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self.topology.pcie_gen

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        level = self.topology.link(first, second).pcie
        return int(PcieLevel.SYS if level is None else level)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._check_slot(link)
        return 1 if link < len(self._slots[handle]) else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return self._used_slot(handle, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> PciInfo:
        return PciInfo(self._used_slot(handle, link)[1])

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int:
        self._used_slot(handle, link)
        return _VERSION[self.topology.nvlink_gen]

    def _check_slot(self, link: int) -> None:
        if not self.topology.nvlink_gen:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        if not 0 <= link < SLOTS:
            raise FakeNvmlError(ERROR_INVALID_ARGUMENT)

    def _used_slot(self, handle: int, link: int) -> tuple[int, bytes]:
        self._check_slot(link)
        if link >= len(self._slots[handle]):
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return self._slots[handle][link]


def _with_identities(topology: Topology) -> tuple[Gpu, ...]:
    """GPUs with made-up UUIDs and bus ids where the topology has none."""
    return tuple(
        replace(
            gpu,
            uuid=gpu.uuid
            or f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{topology.name}.{gpu.index}')}",
            pci_bus_id=gpu.pci_bus_id or f"00000000:{0x18 + 8 * gpu.index:02X}:00.0",
        )
        for gpu in topology.gpus
    )


def _slots(topology: Topology) -> list[list[tuple[int, bytes]]]:
    """Each GPU's used link slots: (remote device type, remote bus id)."""
    buses = [(gpu.pci_bus_id or "").encode() for gpu in topology.gpus]
    slots: list[list[tuple[int, bytes]]] = [[] for _ in topology.gpus]
    to_switch = [0] * topology.size
    for a, b in itertools.combinations(range(topology.size), 2):
        link = topology.link(a, b)
        if link.nvswitch:
            to_switch[a] = max(to_switch[a], link.nvlinks)
            to_switch[b] = max(to_switch[b], link.nvlinks)
        else:
            slots[a] += [(_GPU, buses[b])] * link.nvlinks
            slots[b] += [(_GPU, buses[a])] * link.nvlinks
    for index, count in enumerate(to_switch):
        slots[index] += [(_SWITCH, _SWITCH_BUS)] * count
    return slots
