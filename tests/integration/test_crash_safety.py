"""Killing the operator mid-reconcile loses nothing and duplicates nothing."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = pytest.mark.integration

WORKERS = 40


def test_sigkill_mid_reconcile_then_restart_yields_exactly_the_children(
    crds: Cluster, namespace: str, start_operator, mpijobs: MPIJobs
) -> None:
    # A slow client (5 requests/s) so the kill lands while workers are being created.
    first: OperatorProcess = start_operator("--kube-api-qps", "5", "--kube-api-burst", "1")
    mpijobs.create(
        mpijob("crash", workers=WORKERS, launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"})
    )

    def worker_names() -> list[str]:
        return [
            p.metadata.name
            for p in crds.core.list_namespaced_pod(
                namespace, label_selector=f"{keys.LABEL_JOB_ROLE}=worker"
            ).items
        ]

    wait_until(
        lambda: 3 <= len(worker_names()) < WORKERS,
        timeout=60,
        interval=0.05,
        what="some but not all workers created",
    )
    first.kill(signal.SIGKILL)
    partial = len(worker_names())
    assert partial < WORKERS

    start_operator()
    wait_until(lambda: len(worker_names()) == WORKERS, timeout=120, what="all workers")
    mpijobs.wait_condition("crash", "Succeeded", timeout=120)

    names = worker_names()
    assert sorted(names) == sorted(f"crash-worker-{i}" for i in range(WORKERS))
    assert not [n for n, c in Counter(names).items() if c > 1]
    assert [j.metadata.name for j in crds.batch.list_namespaced_job(namespace).items] == [
        "crash-launcher"
    ]
    launcher_pods = crds.core.list_namespaced_pod(
        namespace, label_selector=f"{keys.LABEL_JOB_ROLE}=launcher"
    ).items
    assert len(launcher_pods) == 1
    assert [s.metadata.name for s in crds.core.list_namespaced_service(namespace).items] == [
        "crash"
    ]
    assert sorted(
        c.metadata.name
        for c in crds.core.list_namespaced_config_map(namespace).items
        if c.metadata.name.startswith("crash")
    ) == ["crash-config"]
    assert [
        s.metadata.name
        for s in crds.core.list_namespaced_secret(namespace).items
        if s.metadata.name.startswith("crash")
    ] == ["crash-ssh"]
    created = [e for e in mpijobs.events("crash") if e["reason"] == "MPIJobCreated"]
    assert len(created) == 1
    assert created[0]["count"] == 1
