"""The node annotation ``mpijob.io/gpu-topology``: compact versioned JSON of a topology.

Shape (version 1)::

    {"v":1,"name":"dgx1-v100","nvlink":2,"pcie":3,
     "gpus":[{"uuid":"GPU-...","bus":"00000000:18:00.0","numa":0},...],
     "links":["NV1:PIX","NV1:PHB","NV2:PHB",...]}

``links`` lists the pairs (0,1), (0,2), ... (0,n-1), (1,2), ... in that order. A link code is
``NV<k>`` (k direct NVLinks) or ``NS<k>`` (k NVLinks through NVSwitch), then ``:`` and a PCIe
level (INTERNAL, PIX, PXB, PHB, NODE, SYS); either part may be missing but not both. Keys of
unknown GPU fields are left out. Written by the node agent, read by the operator through
:func:`loads` (cached: nodes keep their annotation for long).
"""

from __future__ import annotations

import itertools
import json
import re
from functools import lru_cache
from typing import Final, Literal

import pydantic
from pydantic import BaseModel, ConfigDict

from mpijob import keys
from mpijob.placement.model import Gpu, Link, PcieLevel, Topology

VERSION: Final = 1
_NVLINK_CODE: Final = re.compile(r"(NV|NS)(\d+)")


class _GpuRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str | None = None
    bus: str | None = None
    numa: int | None = None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1]
    name: str
    nvlink: int = 0
    """NVLink generation (0: none)."""
    pcie: int = 3
    """PCIe generation."""
    gpus: list[_GpuRecord]
    links: list[str]


def dumps(topology: Topology) -> str:
    """The annotation text of a topology."""
    record = _Record(
        v=VERSION,
        name=topology.name,
        nvlink=topology.nvlink_gen,
        pcie=topology.pcie_gen,
        gpus=[_GpuRecord(uuid=g.uuid, bus=g.pci_bus_id, numa=g.numa_node) for g in topology.gpus],
        links=[_code(link) for link in topology.links],
    )
    return record.model_dump_json(exclude_none=True)


@lru_cache(maxsize=4096)
def loads(text: str) -> Topology:
    """The topology in an annotation; ValueError names what is wrong."""
    prefix = f"{keys.GPU_TOPOLOGY}: "
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{prefix}not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{prefix}expected a JSON object, got {type(data).__name__}")
    if data.get("v") != VERSION:
        raise ValueError(f"{prefix}unsupported version {data.get('v')!r}; this reads {VERSION}")
    try:
        record = _Record.model_validate(data)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
        )
        where = where.removeprefix(".")
        raise ValueError(f"{prefix}{where}: {first['msg']}") from None
    size = len(record.gpus)
    pairs = list(itertools.combinations(range(size), 2))
    if len(record.links) != len(pairs):
        raise ValueError(f"{prefix}{size} GPUs need {len(pairs)} links, found {len(record.links)}")
    links = tuple(
        _link(a, b, code, prefix) for (a, b), code in zip(pairs, record.links, strict=True)
    )
    gpus = tuple(
        Gpu(index, uuid=gpu.uuid, pci_bus_id=gpu.bus, numa_node=gpu.numa)
        for index, gpu in enumerate(record.gpus)
    )
    try:
        return Topology(record.name, gpus, links, nvlink_gen=record.nvlink, pcie_gen=record.pcie)
    except ValueError as error:
        raise ValueError(f"{prefix}{error}") from None


def _code(link: Link) -> str:
    nvlink = f"{'NS' if link.nvswitch else 'NV'}{link.nvlinks}" if link.nvlinks else ""
    pcie = "" if link.pcie is None else link.pcie.name
    return f"{nvlink}:{pcie}" if nvlink and pcie else nvlink or pcie


def _link(a: int, b: int, code: str, prefix: str) -> Link:
    head, colon, tail = code.partition(":")
    if colon:
        nvlink_code, level = head, tail
    else:
        nvlink_code, level = ("", head) if head in PcieLevel.__members__ else (head, "")
    nvlink = _NVLINK_CODE.fullmatch(nvlink_code)
    if (
        not (nvlink_code or level)
        or (colon and not (nvlink_code and level))
        or (nvlink_code and nvlink is None)
        or (level and level not in PcieLevel.__members__)
    ):
        raise ValueError(f"{prefix}link of GPU pair ({a}, {b}): unknown code {code!r}")
    return Link(
        a,
        b,
        nvlinks=int(nvlink.group(2)) if nvlink else 0,
        nvswitch=bool(nvlink) and nvlink is not None and nvlink.group(1) == "NS",
        pcie=PcieLevel[level] if level else None,
    )
