"""One active replica: two operators on one cluster never both reconcile; the standby takes over
when the leader dies (a Lease, as upstream's leader election)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.wait import stays, wait_until

pytestmark = pytest.mark.integration


def test_only_the_leader_reconciles_and_the_standby_takes_over(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    flags = ("--leader-elect", "--lock-namespace", namespace)
    first = start_operator(*flags)
    wait_until(
        lambda: first.metric("mpi_operator_is_leader") == 1,
        timeout=30,
        what="the first operator leading",
    )
    second = start_operator(*flags)
    stays(
        lambda: second.metric("mpi_operator_is_leader") == 0,
        duration=3,
        what="the second operator standing by",
    )

    mpijobs.create(mpijob("one", workers=1))
    mpijobs.wait_condition("one", "Created")
    assert first.metric("mpi_operator_jobs_created_total") == 1
    assert second.metric("mpi_operator_jobs_created_total") == 0
    lease = (
        crds.resource("coordination.k8s.io/v1", "Lease")
        .get(name="mpijob-operator", namespace=namespace)
        .to_dict()
    )
    holder = lease["spec"]["holderIdentity"]

    first.kill(signal.SIGKILL)
    # Within one lease duration (15 s) plus a retry period.
    wait_until(
        lambda: second.metric("mpi_operator_is_leader") == 1,
        timeout=45,
        what="the standby taking over",
    )
    mpijobs.create(mpijob("two", workers=1))
    mpijobs.wait_condition("two", "Created", timeout=30)
    assert second.metric("mpi_operator_jobs_created_total") == 1
    lease = (
        crds.resource("coordination.k8s.io/v1", "Lease")
        .get(name="mpijob-operator", namespace=namespace)
        .to_dict()
    )
    assert lease["spec"]["holderIdentity"] != holder
