"""One active replica: Lease-based leader election with client-go's timing and rules.

A replica campaigns for a ``coordination.k8s.io/v1`` Lease only once its start-up has finished
(:mod:`mpijob.platform.manager` starts :meth:`LeaderElector.run`), through a client of its own
(as upstream's leader election has its own client), so a renewal never waits behind the
operator's other requests. Timing follows client-go: lease 15 s, renew deadline 10 s, retry
2 s, and every Lease request is abandoned after :data:`REQUEST_TIMEOUT_SECONDS` (4 s), shorter
than the renew deadline, so one hung request cannot use up the deadline unnoticed.

The transitions, each a unit test on a virtual clock:

- **standby -> leading**: the Lease is absent, released (no holder), ours, or held by another
  replica whose Lease has not changed for its whole duration on *this* replica's clock (no trust
  in other clocks). ``leading`` is set. A replica's first sight of a held Lease counts as a
  change one retry period later: a standby that watched the holder renew saw its last renewal
  at most a retry period late, while a replica that has just started cannot tell how long ago
  it was. So when a leader dies, the standby whose watches are warm takes over, not the pod
  started to replace the dead one, which would have to list everything first.
- **leading -> leading**: a renewal every retry period; a failed or refused one is tried again
  every retry period until the renew deadline.
- **leading -> lost**: no renewal succeeded within the renew deadline of the last one, or the
  Lease is seen held by another replica. :meth:`LeaderElector.run` returns why. Nothing goes
  back to standby: the process exits (:mod:`mpijob.platform.manager`).
- **leading -> released** (graceful stop, client-go's ``ReleaseOnCancel``): the Lease is written
  with no holder and a 1 s duration, so a standby takes over at its next retry.

:meth:`LeaderElector.write_deadline` is the fence every write of the operator passes
(:class:`mpijob.platform.kube.Fence`): a write may start only while the last successful
renewal, counted from when it was *sent*, is younger than the renew deadline, and must be done
before a standby could take the Lease over (the lease duration after that send, less a second
of margin). A standby waits a whole lease duration from the last change it saw, which came
after that send, so no write of a former leader can arrive after the new leader's first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import Any

from mpijob import metrics
from mpijob.api.models import format_micro_time
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import ApiError, transient
from mpijob.platform.kube_api import KubeApi

log = logging.getLogger(__name__)

LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2
#: Each Lease request's own limit: shorter than the renew deadline, so a renewal that hangs
#: (a partition) is abandoned and tried again while the deadline still allows.
REQUEST_TIMEOUT_SECONDS = 4
#: A write must be done this long before a standby could take the Lease (clock rates differ a
#: little between hosts; client-go's ``ClockSkew`` tolerance is of this order).
MARGIN_SECONDS = 1
LEASE_API_VERSION = "coordination.k8s.io/v1"


def identity() -> str:
    """``<pod or host>_<uuid>``: unique per process, so a restarted pod never inherits a Lease
    it did not renew."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    """Campaigns from :meth:`run`; see the module for its transitions."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        kube: KubeApi,
        identity: str,
        clock: Clock = SYSTEM,
    ) -> None:
        self.identity = identity
        self.leading = asyncio.Event()
        """Set from becoming the leader until the Lease is lost or released."""
        self._namespace = namespace
        self._name = name
        self._kube = kube
        self._clock = clock
        """What the Lease's deadlines are counted on (its monotonic seconds: the event loop's,
        on which :meth:`write_deadline` is kept) and its times written from (its wall clock)."""
        self._lease: dict[str, Any] | None = None
        """The Lease as last read or written."""
        self._observed: tuple[Any, float] = (None, 0.0)
        """(the holder's spec as last seen, when it last changed on our monotonic clock; for
        the first sight, a retry period later)."""
        self._renewed = float("-inf")
        """When the last successful acquisition or renewal was sent (our monotonic clock)."""

    # --- the fence ------------------------------------------------------------------------------

    def holds(self) -> bool:
        """This replica leads and its last renewal is within the renew deadline."""
        return (
            self.leading.is_set()
            and self._clock.monotonic() < self._renewed + RENEW_DEADLINE_SECONDS
        )

    def write_deadline(self) -> float | None:
        """When a write starting now must be done (loop clock), or None: it must not start."""
        if not self.holds():
            return None
        return self._renewed + LEASE_SECONDS - MARGIN_SECONDS

    # --- the campaign -------------------------------------------------------------------------

    def _now(self) -> str:
        """The wall clock as a Lease's ``MicroTime``."""
        return format_micro_time(self._clock.now())

    async def run(self) -> str:
        """Campaign until this replica leads (``leading`` set), then renew until the Lease is
        lost: returns why. Cancelled (a stop), it returns nothing and keeps the Lease for
        :meth:`release`."""
        await self._wait_for_namespace()
        while True:
            if await self._attempt(acquiring=True):
                break
            await asyncio.sleep(RETRY_SECONDS)
        self._set_leading()
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            if (why := await self._renew()) is not None:
                return why

    async def _renew(self) -> str | None:
        """Renew within the deadline, retrying every retry period; why not, once lost."""
        while True:
            if await self._attempt(acquiring=False):
                return None
            left = self._renewed + RENEW_DEADLINE_SECONDS - self._clock.monotonic()
            taken = self._holder() not in (None, "", self.identity)
            if taken or left <= 0:
                why = (
                    f"the Lease is held by {self._holder()}"
                    if taken
                    else f"no renewal succeeded within the renew deadline "
                    f"({RENEW_DEADLINE_SECONDS} s)"
                )
                self._lose()
                return why
            await asyncio.sleep(min(RETRY_SECONDS, left))

    async def _attempt(self, *, acquiring: bool) -> bool:
        """One try, bounded by :data:`REQUEST_TIMEOUT_SECONDS` (and, when renewing, by the
        renew deadline); an error or a timeout is a failed try."""
        limit = float(REQUEST_TIMEOUT_SECONDS)
        if not acquiring:
            limit = min(limit, self._renewed + RENEW_DEADLINE_SECONDS - self._clock.monotonic())
            if limit <= 0:
                return False
        sent = self._clock.monotonic()
        try:
            async with asyncio.timeout(limit):
                got = await self._try_acquire_or_renew()
        except TimeoutError:
            log.warning("Leader election: no answer from the API server within %.1f s", limit)
            return False
        except Exception as e:
            # Refused or unanswered alike, a failed try: the campaign tries again on its own
            # clock, as client-go's does (a Lease or a right restored ends it); a bug is raised.
            if not transient(e, refusals=True):
                raise
            log.warning("Leader election: %s", e)
            return False
        if got:
            self._renewed = sent
        return got

    def _holder(self) -> str | None:
        return ((self._lease or {}).get("spec") or {}).get("holderIdentity")

    async def _wait_for_namespace(self) -> None:
        """The Lease needs its namespace; say so plainly instead of failing quietly forever."""
        warned = False
        while True:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                    found = await self._kube.get(
                        "v1", "Namespace", None, self._namespace, retry=False
                    )
                if found:
                    return
            except Exception as e:
                if not transient(e, refusals=True):
                    raise
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
        now = self._now()
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
            first_sight = self._observed[0] is None  # see the module: standbys go first
            self._observed = (spec, self._clock.monotonic() + (RETRY_SECONDS if first_sight else 0))
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            duration = int(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
            if self.leading.is_set() or self._clock.monotonic() - self._observed[1] < duration:
                return False  # held by another (a leader never takes it back: it is lost)
        if holder == self.identity and not self.leading.is_set():
            # Ours but not from this run of the campaign (identities are per process, so only
            # after a release we made ourselves): take it over as any standby would.
            holder = None
        self._lease = await self._write(lease, now, renew=holder == self.identity)
        return True

    async def _write(self, lease: dict[str, Any], now: str, *, renew: bool) -> dict[str, Any]:
        spec = dict(lease.get("spec") or {})
        if not renew:  # taking over
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=LEASE_SECONDS, renewTime=now)
        # Not retried by the adapter: the campaign tries again on its own clock (RETRY_SECONDS),
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

    def _set_leading(self) -> None:
        metrics.IS_LEADER.set(1)
        log.info("Became the leader", extra={"identity": self.identity})
        self.leading.set()

    def _lose(self) -> None:
        self.leading.clear()
        metrics.IS_LEADER.set(0)

    async def release(self) -> None:
        """Give the Lease up (a graceful stop, after every write has stopped): no holder and a
        1 s duration, so a standby takes over at its next retry rather than a lease later.
        Only a Lease still held is released; failing that, it simply expires."""
        if not self.holds() or self._lease is None:
            return
        self._lose()
        spec = dict(self._lease.get("spec") or {})
        spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=self._now())
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                await self._kube.replace({**self._lease, "spec": spec}, retry=False)
        except Exception as e:
            if not transient(e, refusals=True):
                raise
            log.warning("Could not release the Lease (it expires by itself): %s", e)
            return
        log.info("Released the Lease", extra={"identity": self.identity})
