"""One active replica: Lease-based leader election through the official client's elector.

The elector (``kubernetes.leaderelection``, a ``coordination.k8s.io`` Lease) runs in its own
thread and flips an ``asyncio.Event`` in the operator's loop. Watches and indices keep running on
every replica, so a standby holds a warm cache and takes over within one lease duration; only
the reconcile workers wait for leadership. Timing follows upstream: lease 15 s, renew deadline
10 s, retry 2 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from mpijob import metrics
from mpijob.handlers.kube import configuration

log = logging.getLogger(__name__)

LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_SECONDS = 2


def identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


class LeaderElector:
    """Runs the Lease elector in a daemon thread; ``leading`` is set while this replica leads."""

    def __init__(self, *, namespace: str, name: str, kubeconfig: str | None) -> None:
        self.leading = asyncio.Event()
        self.identity = identity()
        self._namespace = namespace
        self._name = name
        self._kubeconfig = kubeconfig
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="leader-election", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _wait_for_namespace(self, core: client.CoreV1Api) -> None:
        """The Lease needs its namespace; say so plainly instead of failing quietly forever."""
        warned = False
        while not self._stop.is_set():
            try:
                core.read_namespace(self._namespace)
                return
            except client.ApiException as e:
                if e.status != 404:
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
            self._stop.wait(10)

    def _set(self, leading: bool) -> None:
        metrics.IS_LEADER.set(1 if leading else 0)
        if leading:
            log.info("Became the leader", extra={"identity": self.identity})
            self._loop.call_soon_threadsafe(self.leading.set)
        else:
            log.warning("Lost leadership; pausing reconciles", extra={"identity": self.identity})
            self._loop.call_soon_threadsafe(self.leading.clear)

    def _run(self) -> None:
        api = client.ApiClient(configuration(self._kubeconfig))
        lock = LeaseLock(self._name, self._namespace, self.identity)
        # The lock builds its client from the global default; give it ours instead of
        # changing the default for the whole process.
        lock.api_instance = client.CoordinationV1Api(api)
        self._wait_for_namespace(client.CoreV1Api(api))
        while not self._stop.is_set():
            election = electionconfig.Config(
                lock,
                LEASE_SECONDS,
                RENEW_DEADLINE_SECONDS,
                RETRY_SECONDS,
                onstarted_leading=lambda: self._set(True),
                onstopped_leading=lambda: self._set(False),
            )
            try:
                leaderelection.LeaderElection(election).run()
            except Exception:  # the API may be briefly unreachable; keep campaigning
                log.exception("Leader election failed; retrying")
            self._stop.wait(RETRY_SECONDS)
