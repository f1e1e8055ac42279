"""Children deleted by hand come back: every sync ensures every child, as upstream's does."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from kubernetes import client

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = pytest.mark.integration

CHILDREN = ("Service/heal", "ConfigMap/heal-config", "Secret/heal-ssh", "Pod/heal-worker-1")


def uids(cluster: Cluster, namespace: str) -> dict[str, str | None]:
    """The UID of each child, None when it does not exist."""
    core = cluster.core
    read = {
        "Service": core.read_namespaced_service,
        "ConfigMap": core.read_namespaced_config_map,
        "Secret": core.read_namespaced_secret,
        "Pod": core.read_namespaced_pod,
    }
    out: dict[str, str | None] = {}
    for child in CHILDREN:
        kind, name = child.split("/")
        try:
            obj = read[kind](name, namespace)
        except client.ApiException as e:
            if e.status != 404:
                raise
            out[child] = None
        else:
            out[child] = None if obj.metadata.deletion_timestamp else obj.metadata.uid
    return out


def delete_children(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    core.delete_namespaced_service("heal", namespace)
    core.delete_namespaced_config_map("heal-config", namespace)
    core.delete_namespaced_secret("heal-ssh", namespace)
    core.delete_namespaced_pod("heal-worker-1", namespace, grace_period_seconds=0)


@pytest.mark.parametrize("restart", [False, True], ids=["operator-running", "operator-restarted"])
def test_children_deleted_by_hand_come_back_and_the_job_succeeds(
    crds: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
    restart: bool,
) -> None:
    operator = start_operator()
    mpijobs.create(mpijob("heal", workers=2, launcher_annotations={keys.SIM_SUCCEED_AFTER: "30s"}))
    mpijobs.wait_condition("heal", "Running", timeout=60)
    before = uids(crds, namespace)
    assert None not in before.values()

    if restart:
        operator.kill(signal.SIGKILL)
    delete_children(crds, namespace)
    if restart:
        start_operator()

    def restored() -> bool:
        now = uids(crds, namespace)
        return all(now[c] is not None and now[c] != before[c] for c in CHILDREN)

    wait_until(restored, timeout=30, interval=0.5, what=f"{', '.join(CHILDREN)} recreated")
    hostfile = crds.core.read_namespaced_config_map("heal-config", namespace).data["hostfile"]
    assert "heal-worker-0" in hostfile
    assert "heal-worker-1" in hostfile
    secret = crds.core.read_namespaced_secret("heal-ssh", namespace)
    assert set(secret.data) == {"ssh-privatekey", "ssh-publickey"}
    mpijobs.wait_condition("heal", "Succeeded", timeout=120)
