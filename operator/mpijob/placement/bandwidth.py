"""Per-direction bandwidth, in GB/s, of the links a pair of GPUs can talk over.

NVLink rates are the published per-link figures; PCIe rates are the nominal x16 figures after
line encoding. PCIe peer-to-peer through more bridges is slower, but no public table gives
one number per level, so the level factors below are a model: they keep the order
PIX > PXB > PHB > NODE > SYS and roughly halve the rate across the socket interconnect. They
rank sets; they are not measurements. Used by :mod:`mpijob.placement.model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

#: GB/s per direction of one NVLink, by NVLink generation (P100: 1, V100: 2, A100: 3,
#: H100/H200: 4, B200: 5).
NVLINK_GBPS_PER_LINK: Final[Mapping[int, float]] = MappingProxyType(
    {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
)

#: GB/s per direction of a x16 PCIe link, by PCIe generation.
PCIE_X16_GBPS: Final[Mapping[int, float]] = MappingProxyType(
    {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}
)

#: Share of the x16 rate a peer-to-peer transfer keeps, by NVML topology level (see module doc).
PCIE_LEVEL_FACTOR: Final[Mapping[int, float]] = MappingProxyType(
    {0: 1.0, 10: 0.9, 20: 0.8, 30: 0.7, 40: 0.6, 50: 0.4}
)

#: Default inter-node bandwidth per direction: one 100 Gb/s NIC.
DEFAULT_INTER_NODE_GBPS: Final = 12.5

#: Most NVLinks one GPU has (H100, B200); more than this between one GPU and its peers means
#: the links go through NVSwitch.
MAX_NVLINKS_PER_GPU: Final = 18
