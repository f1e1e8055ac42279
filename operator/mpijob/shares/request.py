"""A pod's request for a share of one GPU, read from its containers' limits, and its validation.

A container asks for ``aliyun.com/gpu-mem`` (whole GiB of GPU memory) and optionally
``aliyun.com/gpu-core.percentage`` (percent of the GPU's compute, a multiple of 5 from 5 to
100) in ``resources.limits``. The pod's share is the sum over its containers and must fit one
GPU: every container of a pod sees the same GPU. Rules, each refused with the field path and
the fix: memory a positive whole number, percentage a multiple of 5 within 5..100, no compute
without memory in the same container, no pod mixing memory-only and memory+compute containers,
no whole GPUs (``nvidia.com/gpu``) beside a share, no share in init containers.

Pure; read by the fractional ledger (:mod:`mpijob.shares.ledger`), the pod edits
(:mod:`mpijob.shares.pod_edits`) and, later, the share webhook.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mpijob import keys
from mpijob.api.errors import FieldError, forbidden, invalid, required

PERCENT_STEP: Final = 5
PERCENT_MIN: Final = 5
PERCENT_MAX: Final = 100

_MEM = keys.GPU_MEM_RESOURCE
_CORE = keys.GPU_CORE_PERCENTAGE_RESOURCE


@dataclass(frozen=True)
class Share:
    """A share of one GPU: ``memory_gib`` GiB and, unless memory-only, ``percentage`` percent."""

    memory_gib: int
    percentage: int | None = None
    """None: memory-only (no compute limit; never mixed with compute shares on a node)."""
    clients: int = 1
    """MPS clients it counts as: one per container holding part of it."""

    @property
    def with_compute(self) -> bool:
        return self.percentage is not None


@dataclass(frozen=True)
class ContainerShare:
    """One container's part of its pod's share (what its MPS limits are written from)."""

    name: str
    memory_gib: int
    percentage: int | None


@dataclass(frozen=True)
class FractionalRequest:
    """What a pod asks for: its containers' parts, the pod's share, and every error found."""

    containers: tuple[ContainerShare, ...] = ()
    errors: tuple[FieldError, ...] = ()

    @property
    def share(self) -> Share | None:
        """The pod's share (None: the pod asks for none, or is invalid)."""
        if self.errors or not self.containers:
            return None
        compute = [c.percentage for c in self.containers if c.percentage is not None]
        return Share(
            memory_gib=sum(c.memory_gib for c in self.containers),
            percentage=sum(compute) if compute else None,
            clients=len(self.containers),
        )


def asks_for_share(pod_spec: Mapping[str, Any] | None) -> bool:
    """Whether any container (init containers included) names either share resource."""
    for _, container in _all_containers(pod_spec or {}, "spec"):
        resources = _mapping(container.get("resources"))
        for section in ("limits", "requests"):
            names = _mapping(resources.get(section))
            if _MEM in names or _CORE in names:
                return True
    return False


def read_request(pod_spec: Mapping[str, Any] | None, path: str = "spec") -> FractionalRequest:
    """The share ``pod_spec`` asks for, with every rule it breaks (paths below ``path``)."""
    spec = pod_spec or {}
    errors: list[FieldError] = []
    parts: list[ContainerShare] = []
    for kind, index, container in _indexed(spec):
        where = f"{path}.{kind}[{index}].resources"
        resources = _mapping(container.get("resources"))
        limits = _mapping(resources.get("limits"))
        requests = _mapping(resources.get("requests"))
        for name in (_MEM, _CORE):
            if name in requests and name not in limits:
                errors.append(
                    required(
                        f"{where}.limits[{name}]",
                        f"{name} is set in requests only; set it in limits (a request of an"
                        " extended resource must equal its limit)",
                    )
                )
        if _MEM not in limits and _CORE not in limits:
            continue
        if kind == "initContainers":
            errors.append(
                forbidden(
                    f"{where}.limits",
                    "init containers cannot hold a GPU share; ask for it in a container",
                )
            )
            continue
        memory, memory_errors = _memory(limits, f"{where}.limits[{_MEM}]")
        percentage, percentage_errors = _percentage(limits, f"{where}.limits[{_CORE}]")
        errors += memory_errors + percentage_errors
        if _CORE in limits and _MEM not in limits:
            errors.append(
                required(
                    f"{where}.limits[{_MEM}]",
                    f"{_CORE} needs {_MEM} in the same container: add {_MEM} (GiB of GPU"
                    " memory, e.g. 2)",
                )
            )
        if keys.GPU_RESOURCE in limits:
            errors.append(
                forbidden(
                    f"{where}.limits[{keys.GPU_RESOURCE}]",
                    f"a container asks for whole GPUs or a share ({_MEM}), not both",
                )
            )
        if memory is not None and not memory_errors and not percentage_errors:
            parts.append(ContainerShare(str(container.get("name") or ""), memory, percentage))
    if parts and not errors:
        errors += _pod_rules(parts, spec, path)
    return FractionalRequest(tuple(parts), tuple(errors))


def _pod_rules(
    parts: Sequence[ContainerShare], spec: Mapping[str, Any], path: str
) -> list[FieldError]:
    errors: list[FieldError] = []
    with_compute = [p for p in parts if p.percentage is not None]
    if with_compute and len(with_compute) != len(parts):
        errors.append(
            invalid(
                f"{path}.containers",
                ", ".join(p.name for p in parts if p.percentage is None),
                f"memory-only and memory+compute shares cannot mix in one pod: give every"
                f" container with {_MEM} a {_CORE} too, or none",
            )
        )
    total = sum(p.percentage or 0 for p in parts)
    if total > PERCENT_MAX:
        errors.append(
            invalid(
                f"{path}.containers",
                total,
                f"the containers' {_CORE} add up to more than {PERCENT_MAX}: a pod's share"
                " must fit one GPU",
            )
        )
    return errors


def _memory(limits: Mapping[str, Any], path: str) -> tuple[int | None, list[FieldError]]:
    if _MEM not in limits:
        return None, []
    value = _whole(limits[_MEM])
    if value is None or value < 1:
        return None, [
            invalid(
                path,
                _shown(limits[_MEM]),
                "must be a positive whole number of GiB of GPU memory, e.g. 2 (not 2Gi)",
            )
        ]
    return value, []


def _percentage(limits: Mapping[str, Any], path: str) -> tuple[int | None, list[FieldError]]:
    if _CORE not in limits:
        return None, []
    value = _whole(limits[_CORE])
    if value is None or not PERCENT_MIN <= value <= PERCENT_MAX or value % PERCENT_STEP:
        return None, [
            invalid(
                path,
                _shown(limits[_CORE]),
                f"must be a multiple of {PERCENT_STEP} from {PERCENT_MIN} to {PERCENT_MAX}"
                " (percent of one GPU's compute), e.g. 30",
            )
        ]
    return value, []


def _whole(value: Any) -> int | None:
    """A plain integer quantity (``2`` or ``"2"``); anything else (suffixes, fractions): None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if text.isdigit() and text.isascii() else None


def _shown(value: Any) -> object:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else str(value)


def _indexed(spec: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    out = []
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or []):
            if isinstance(container, Mapping):
                out.append((kind, index, container))
    return out


def _all_containers(spec: Mapping[str, Any], path: str) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"{path}.{kind}[{i}]", c) for kind, i, c in _indexed(spec)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Placed:
    """Where a pod's share lives: a node, one GPU of it (index and UUID), and the share."""

    node: str
    gpu: int
    uuid: str
    share: Share
    claim: str = ""
    """The ledger's key for the holder: fixed when the share was placed, before the pod had a
    name (pods of controllers get theirs after admission)."""

    def dumps(self) -> str:
        """The ``mpijob.io/gpu-share`` annotation value."""
        return json.dumps(
            {
                "v": 1,
                "node": self.node,
                "gpu": self.gpu,
                "uuid": self.uuid,
                "mem": self.share.memory_gib,
                "core": self.share.percentage,
                "clients": self.share.clients,
                "claim": self.claim,
            },
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str | None) -> Placed | None:
        """The record in an annotation value; None for a missing or malformed one."""
        try:
            data = json.loads(text or "")
            core = data.get("core")
            placed = cls(
                node=str(data["node"]),
                gpu=int(data["gpu"]),
                uuid=str(data.get("uuid") or ""),
                share=Share(
                    memory_gib=int(data["mem"]),
                    percentage=None if core is None else int(core),
                    clients=int(data.get("clients", 1)),
                ),
                claim=str(data.get("claim") or ""),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if data.get("v") != 1 or placed.gpu < 0 or placed.share.memory_gib < 1:
            return None
        return placed
