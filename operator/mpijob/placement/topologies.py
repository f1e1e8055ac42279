"""Shipped node topologies, by name: the systems users run and the tests and benchmark use.

NVLink layouts are the published ones (DGX-1 P100 and V100 hybrid cube-mesh as NVIDIA's
go-gpuallocator fixtures give them, NVSwitch all-to-all systems, the bridged PCIe box of
NVIDIA/k8s-device-plugin#546, 4x RTX 8000). Where no source gives a PCIe tree or a NUMA layout,
the one here is a plain two-socket model; it only matters for pairs without NVLink. Read by
tests, the benchmark, the fake NVML and local-cluster tooling through :func:`load`.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from typing import Final

from mpijob.placement.model import Gpu, PcieLevel, Topology, links_from

Pair = tuple[int, int]


def _pcie_tree(
    size: int,
    *,
    switches: Sequence[Sequence[int]] = (),
    sockets: Sequence[Sequence[int]],
    switch_level: PcieLevel = PcieLevel.PIX,
    socket_level: PcieLevel = PcieLevel.PHB,
) -> dict[Pair, PcieLevel]:
    """PCIe level of every pair: same switch, same socket, or across sockets."""
    switch_of = {gpu: number for number, group in enumerate(switches) for gpu in group}
    socket_of = {gpu: number for number, group in enumerate(sockets) for gpu in group}
    levels = {}
    for a, b in itertools.combinations(range(size), 2):
        if a in switch_of and switch_of.get(a) == switch_of.get(b):
            levels[(a, b)] = switch_level
        elif socket_of[a] == socket_of[b]:
            levels[(a, b)] = socket_level
        else:
            levels[(a, b)] = PcieLevel.SYS
    return levels


def _gpus(numa: Sequence[int]) -> tuple[Gpu, ...]:
    return tuple(Gpu(index, numa_node=node) for index, node in enumerate(numa))


_TWO_SOCKETS_8: Final = ((0, 1, 2, 3), (4, 5, 6, 7))
_NUMA_8: Final = (0, 0, 0, 0, 1, 1, 1, 1)
_PAIRS_8: Final = ((0, 1), (2, 3), (4, 5), (6, 7))


def dgx1_p100() -> Topology:
    """DGX-1 with 8 P100: one NVLink 1 on each pair inside each quad and on (i, i+4)."""
    quads = [p for q in _TWO_SOCKETS_8 for p in itertools.combinations(q, 2)]
    nvlinks = dict.fromkeys([*quads, (0, 4), (1, 5), (2, 6), (3, 7)], 1)
    switches = ((0, 2), (1, 3), (4, 6), (5, 7))
    return Topology(
        "dgx1-p100",
        _gpus(_NUMA_8),
        links_from(
            8, nvlinks=nvlinks, pcie=_pcie_tree(8, switches=switches, sockets=_TWO_SOCKETS_8)
        ),
        nvlink_gen=1,
        pcie_gen=3,
    )


def dgx1_v100() -> Topology:
    """DGX-1 with 8 V100: the hybrid cube-mesh, 6 NVLink 2 per GPU, NV2 edges forming a ring."""
    nv2 = ((0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7))
    nv1 = ((0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7))
    nvlinks = {**dict.fromkeys(nv2, 2), **dict.fromkeys(nv1, 1)}
    return Topology(
        "dgx1-v100",
        _gpus(_NUMA_8),
        links_from(
            8, nvlinks=nvlinks, pcie=_pcie_tree(8, switches=_PAIRS_8, sockets=_TWO_SOCKETS_8)
        ),
        nvlink_gen=2,
        pcie_gen=3,
    )


def dgx2() -> Topology:
    """DGX-2: 16 V100 all-to-all through NVSwitch, 6 NVLink 2 per GPU, two baseboards."""
    sockets = (tuple(range(8)), tuple(range(8, 16)))
    switches = tuple((i, i + 1) for i in range(0, 16, 2))
    pcie = _pcie_tree(16, switches=switches, sockets=sockets, socket_level=PcieLevel.NODE)
    return Topology(
        "dgx2",
        _gpus((0,) * 8 + (1,) * 8),
        links_from(16, nvswitch_links=6, pcie=pcie),
        nvlink_gen=2,
        pcie_gen=3,
    )


def dgx_a100() -> Topology:
    """DGX A100: 8 A100 all-to-all through NVSwitch, 12 NVLink 3 per GPU (NV12)."""
    pcie = _pcie_tree(
        8,
        switches=_PAIRS_8,
        sockets=_TWO_SOCKETS_8,
        switch_level=PcieLevel.PXB,
        socket_level=PcieLevel.NODE,
    )
    return Topology(
        "dgx-a100",
        _gpus(_NUMA_8),
        links_from(8, nvswitch_links=12, pcie=pcie),
        nvlink_gen=3,
        pcie_gen=4,
    )


def dgx_h100() -> Topology:
    """DGX H100: 8 H100 all-to-all through NVSwitch, 18 NVLink 4 per GPU (NV18)."""
    pcie = _pcie_tree(8, sockets=_TWO_SOCKETS_8, socket_level=PcieLevel.NODE)
    return Topology(
        "dgx-h100",
        _gpus(_NUMA_8),
        links_from(8, nvswitch_links=18, pcie=pcie),
        nvlink_gen=4,
        pcie_gen=5,
    )


def gb200_tray() -> Topology:
    """A GB200 NVL72 compute tray: 4 GPUs, two per Grace CPU, 18 NVLink 5 each through the
    rack's NVLink switches (the same switches join the rack's 18 trays into one clique)."""
    return Topology(
        "gb200-tray",
        _gpus((0, 0, 1, 1)),
        links_from(
            4,
            nvswitch_links=18,
            pcie=_pcie_tree(4, sockets=((0, 1), (2, 3)), socket_level=PcieLevel.NODE),
        ),
        nvlink_gen=5,
        pcie_gen=5,
    )


def pcie_8gpu_2socket() -> Topology:
    """A PCIe-only box: 8 GPUs in pairs under PCIe switches, two sockets."""
    pcie = _pcie_tree(8, switches=_PAIRS_8, sockets=_TWO_SOCKETS_8, socket_level=PcieLevel.NODE)
    return Topology("pcie-8gpu-2socket", _gpus(_NUMA_8), links_from(8, pcie=pcie), pcie_gen=4)


def pcie_nvlink_bridge() -> Topology:
    """8 A100 PCIe with NV12 bridges on (0,2), (1,3), (4,5), (6,7) and SYS between all others.

    SYS between every unbridged pair means each bridged pair sits on its own NUMA node.
    """
    bridged = ((0, 2), (1, 3), (4, 5), (6, 7))
    numa = (0, 1, 0, 1, 2, 2, 3, 3)
    pcie = {
        (a, b): PcieLevel.NODE if numa[a] == numa[b] else PcieLevel.SYS
        for a, b in itertools.combinations(range(8), 2)
    }
    return Topology(
        "pcie-nvlink-bridge",
        _gpus(numa),
        links_from(8, nvlinks=dict.fromkeys(bridged, 12), pcie=pcie),
        nvlink_gen=3,
        pcie_gen=4,
    )


def rtx8000_4x() -> Topology:
    """4x Quadro RTX 8000: NV2 bridges on (0,3) and (1,2); (0,1), (2,3) share a CPU."""
    pcie = _pcie_tree(4, sockets=((0, 1), (2, 3)), socket_level=PcieLevel.NODE)
    return Topology(
        "rtx8000-4x",
        _gpus((0, 0, 1, 1)),
        links_from(4, nvlinks={(0, 3): 2, (1, 2): 2}, pcie=pcie),
        nvlink_gen=2,
        pcie_gen=3,
    )


_BUILDERS: Final[dict[str, Callable[[], Topology]]] = {
    "dgx1-p100": dgx1_p100,
    "dgx1-v100": dgx1_v100,
    "dgx2": dgx2,
    "dgx-a100": dgx_a100,
    "dgx-h100": dgx_h100,
    "gb200-tray": gb200_tray,
    "pcie-8gpu-2socket": pcie_8gpu_2socket,
    "pcie-nvlink-bridge": pcie_nvlink_bridge,
    "rtx8000-4x": rtx8000_4x,
}

#: Names :func:`load` accepts.
NAMES: Final[tuple[str, ...]] = tuple(_BUILDERS)


@cache
def load(name: str) -> Topology:
    """The shipped topology called ``name`` (GPUs without UUIDs or bus ids)."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown topology {name!r}; known: {', '.join(NAMES)}")
    return builder()


def for_node(name: str, node: str) -> Topology:
    """A shipped topology with stable made-up UUIDs and bus ids, as if read on ``node``.

    For simulated nodes (local clusters, tests) that need GPU identities to annotate pods.
    """
    topology = load(name)
    gpus = tuple(
        replace(
            gpu,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{name}.{gpu.index}')}",
            pci_bus_id=f"00000000:{0x18 + 8 * gpu.index:02X}:00.0",
        )
        for gpu in topology.gpus
    )
    return replace(topology, gpus=gpus)
