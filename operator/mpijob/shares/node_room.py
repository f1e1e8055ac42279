"""What each node has left of its allocatable resources for one more pod: cpu, memory, pods and
anything else a pod requests.

A GPU share pins its pod to one node before the scheduler sees it, so the node must also have
room for the pod's other requests: a pinned pod that does not fit them would stay Pending on
its node, holding its share, while another node had room. :class:`NodeRoom` counts what the
scheduler counts (NodeResourcesFit): per node, its ``status.allocatable`` against the requests of
the pods bound to it or pinned there by a share, and one pod each.

A pod's requests are read as the scheduler reads them
(:func:`mpijob.pods.predicates.pod_requests`): init containers, sidecars and the pod overhead
included. Quantities are exact (:mod:`mpijob.pods.quantity`).

Pure; the I/O shell (:mod:`mpijob.shares.service`) feeds it nodes and pods under the same
lock as the share ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from mpijob.pods.predicates import amounts

Requests = dict[str, Decimal]


def _add(total: Requests, more: Mapping[str, Decimal]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Decimal(0)) + amount


class NodeRoom:
    """Allocatable and in-use amounts per node; callers serialise calls (one lock)."""

    def __init__(self) -> None:
        self._allocatable: dict[str, Requests] = {}
        self._used: dict[str, Requests] = {}
        self._holders: dict[str, tuple[str, Requests]] = {}

    def set_node(self, name: str, allocatable: Mapping[str, Any] | None) -> None:
        """A node's ``status.allocatable`` (what the scheduler fits pods into)."""
        self._allocatable[name] = amounts(allocatable)

    def remove_node(self, name: str) -> None:
        self._allocatable.pop(name, None)

    def add(self, key: str, node: str, requests: Mapping[str, Decimal]) -> None:
        """``key`` (a pod, or a share's claim) takes ``requests`` on ``node``; replaces its last."""
        self.remove(key)
        self._holders[key] = (node, dict(requests))
        _add(self._used.setdefault(node, {}), requests)

    def remove(self, key: str) -> bool:
        """``key`` ends: its requests are freed; whether it held any."""
        held = self._holders.pop(key, None)
        if held is None:
            return False
        node, requests = held
        used = self._used[node]
        for name, amount in requests.items():
            used[name] -= amount
        return True

    def holds(self, key: str) -> bool:
        return key in self._holders

    def fits(self, node: str, requests: Mapping[str, Decimal], count: int = 1) -> bool:
        """Whether ``count`` more pods of ``requests`` fit ``node`` (unknown nodes: no)."""
        allocatable = self._allocatable.get(node)
        if allocatable is None:
            return False
        used = self._used.get(node, {})
        return all(
            used.get(name, Decimal(0)) + amount * count <= allocatable.get(name, Decimal(0))
            for name, amount in requests.items()
            if amount > 0
        )
