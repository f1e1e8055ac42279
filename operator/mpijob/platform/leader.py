"""One active replica: Lease-based leader election, as client-go's leader elector does it.

A task on the operator's loop campaigns for a ``coordination.k8s.io/v1`` Lease through the
operator's API adapter and sets ``leading`` while this replica holds it. Watches and indices
keep running on every replica, so a standby holds a warm cache and takes over within one lease
duration; only the reconcile workers wait for leadership. Timing and rules follow upstream
(client-go): lease 15 s, renew deadline 10 s, retry 2 s; a Lease held by another replica counts
as expired only once it has not changed for a lease duration on this replica's own clock (no
trust in other clocks); the leader renews with the Lease it last wrote, without a read first,
and reads only when that write is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mpijob import metrics
from mpijob.platform.kube import ApiError
from mpijob.platform.kube_api import KubeApi

log = logging.getLogger(__name__)

LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2
LEASE_API_VERSION = "coordination.k8s.io/v1"


def identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns in a task of the running loop; ``leading`` is set while this replica leads."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        kube: KubeApi,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.leading = asyncio.Event()
        self.identity = identity()
        self._clock = clock
        """Monotonic seconds; the running loop's clock when None."""
        self._namespace = namespace
        self._name = name
        self._kube = kube
        self._task: asyncio.Task[None] | None = None
        self._lease: dict[str, Any] | None = None
        """The Lease as last read or written."""
        self._observed: tuple[Any, float] = (None, 0.0)
        """(the holder's spec as last seen, when it last changed on our monotonic clock)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="leader-election")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _monotonic(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def _run(self) -> None:
        await self._wait_for_namespace()
        renewed = 0.0
        while True:
            try:
                acquired = await self._try_acquire_or_renew()
            except (ApiError, OSError) as e:  # the API may be briefly unreachable
                log.warning("Leader election: %s", e)
                acquired = False
            if acquired:
                renewed = self._monotonic()
                if not self.leading.is_set():
                    self._set(True)
            elif self.leading.is_set() and self._monotonic() - renewed > RENEW_DEADLINE_SECONDS:
                self._set(False)
            await asyncio.sleep(RETRY_SECONDS)

    async def _wait_for_namespace(self) -> None:
        """The Lease needs its namespace; say so plainly instead of failing quietly forever."""
        warned = False
        while True:
            try:
                if await self._kube.get("v1", "Namespace", None, self._namespace, retry=False):
                    return
            except (ApiError, OSError):
                return  # no right to read namespaces, or a passing error: just campaign
            if not warned:
                log.error(
                    "Leader election needs namespace %r for its Lease, and it does not exist: "
                    "create it (kubectl create namespace %s), pass --lock-namespace, or run a "
                    "single process with --no-leader-elect. Reconciling waits until then.",
                    self._namespace,
                    self._namespace,
                )
                warned = True
            await asyncio.sleep(10)

    async def _try_acquire_or_renew(self) -> bool:
        now = _now()
        if self.leading.is_set() and self._lease is not None:
            # Fast path: renew the Lease we last wrote; a refusal means someone else wrote it.
            with contextlib.suppress(ApiError):
                self._lease = await self._write(self._lease, now, renew=True)
                return True
        lease = await self._kube.get(
            LEASE_API_VERSION, "Lease", self._namespace, self._name, retry=False
        )
        if lease is None:
            self._lease = await self._kube.create(self._body(now), retry=False)
            return True
        self._lease = lease
        spec = lease.get("spec") or {}
        if spec != self._observed[0]:
            self._observed = (spec, self._monotonic())
        holder = spec.get("holderIdentity")
        duration = int(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
        if holder and holder != self.identity and self._monotonic() - self._observed[1] < duration:
            return False
        self._lease = await self._write(lease, now, renew=holder == self.identity)
        return True

    async def _write(self, lease: dict[str, Any], now: str, *, renew: bool) -> dict[str, Any]:
        spec = dict(lease.get("spec") or {})
        if not renew:  # taking over
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=LEASE_SECONDS, renewTime=now)
        # Not retried here: the campaign's loop tries again on its own clock (RETRY_SECONDS),
        # and a renewal must not outlive its deadline waiting on a busy API server.
        return await self._kube.replace({**lease, "spec": spec}, retry=False)

    def _body(self, now: str) -> dict[str, Any]:
        return {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }

    def _set(self, leading: bool) -> None:
        metrics.IS_LEADER.set(1 if leading else 0)
        if leading:
            log.info("Became the leader", extra={"identity": self.identity})
            self.leading.set()
        else:
            self._lease = None
            log.warning("Lost leadership; pausing reconciles", extra={"identity": self.identity})
            self.leading.clear()
