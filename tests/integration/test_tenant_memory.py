"""What a tenant writes on its own objects costs the operator nothing to hold.

A tenant (``edit`` and the MPIJob role in its namespace, impersonated) puts the operator's
labels and its own job's controller reference on pods and ConfigMaps, then fills them with
annotations and data: 40 MiB in all. The operator's caches keep only what a reader reads
(:func:`mpijob.handlers.watches.kept_metadata`, the ConfigMap's data as digests), so its
resident memory grows by less than 5 MiB, both while it watches them arrive and when a new
process lists them all at its start.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from kubernetes import client

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.operator import OperatorProcess
from support.tenants import TenantJobs, bind_tenant
from support.wait import wait_until

pytestmark = pytest.mark.integration

TENANT = "hoarder@example.com"
OBJECTS = 40
#: A pod's annotations may total 256 KiB; a ConfigMap's data 1 MiB.
POD_ANNOTATION_BYTES = 250 * 1024
CONFIG_MAP_BYTES = 768 * 1024
MiB = 1024 * 1024


def rss(op: OperatorProcess) -> float:
    """The operator process's resident memory (MiB), the median of three reads a second apart
    (what the kernel accounts, as the container's memory limit does)."""
    assert op.proc is not None
    status = Path(f"/proc/{op.proc.pid}/status")

    def once() -> float:
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    reads = []
    for _ in range(3):
        reads.append(once())
        time.sleep(1)
    return median(reads)


def owner(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def bloat(tenant: TenantJobs, job: dict[str, Any]) -> None:
    """40 pods and 40 ConfigMaps that look like the job's, carrying 40 MiB between them."""
    name = job["metadata"]["name"]
    labels = {keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME, keys.LABEL_JOB_NAME: name}
    for i in range(OBJECTS):
        pod = {
            "metadata": {
                "name": f"hoard-{i}",
                "labels": labels,
                "annotations": {f"{keys.PREFIX}hoard": "p" * POD_ANNOTATION_BYTES},
                "ownerReferences": [owner(job)],
            },
            # Never scheduled: no scheduler of that name runs.
            "spec": {
                "schedulerName": "nobody",
                "containers": [{"name": "c", "image": "mpijob.local/pause:1"}],
            },
        }
        tenant.create_pod(pod)
        config_map = {
            "metadata": {"name": f"{name}-config-{i}", "ownerReferences": [owner(job)]},
            "data": {"hostfile": "c" * CONFIG_MAP_BYTES},
        }
        tenant.core.create_namespaced_config_map(tenant.namespace, config_map)


def stuff_the_job_s_config_map(tenant: TenantJobs, name: str) -> None:
    """The operator's own ConfigMap, with a MiB-sized key of the tenant's beside its own."""
    tenant.core.patch_namespaced_config_map(
        f"{name}-config", tenant.namespace, {"data": {"hoard": "h" * CONFIG_MAP_BYTES}}
    )


def config_map_restored(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    data = core.read_namespaced_config_map(f"{name}-config", namespace).data or {}
    return "hoard" not in data and "hostfile" in data


def test_tenant_objects_carrying_40_mib_grow_the_operator_by_less_than_5_mib(
    crds: Cluster, namespace: str, start_operator: Any
) -> None:
    bind_tenant(crds, namespace, TENANT)
    tenant = TenantJobs(crds, namespace, TENANT)
    job = tenant.create(mpijob("hoard", workers=1, run_policy={"suspend": True}))
    name = job["metadata"]["name"]
    op = start_operator()
    wait_until(lambda: config_map_restored(crds.core, namespace, name), what="the job's ConfigMap")
    before = rss(op)

    bloat(tenant, job)
    # The operator has seen the ConfigMaps once it replaced the data of its own: the tenant's
    # key is gone, its own are back (the cache held digests, not the MiB).
    stuff_the_job_s_config_map(tenant, name)
    wait_until(
        lambda: config_map_restored(crds.core, namespace, name),
        what="the operator to replace its ConfigMap's data",
    )
    watched = rss(op)
    print(f"RSS: {before:.1f} MiB before, {watched:.1f} after watching")

    # A new process lists all of it at its start, a page at a time.
    op.stop()
    stuff_the_job_s_config_map(tenant, name)
    fresh = start_operator()
    wait_until(
        lambda: config_map_restored(crds.core, namespace, name),
        what="the new operator to replace its ConfigMap's data",
    )
    listed = rss(fresh)

    print(f"RSS: {before:.1f} MiB before, {watched:.1f} after watching, {listed:.1f} after listing")
    assert watched - before < 5, (
        f"watching 40 MiB of tenant objects took {watched - before:.1f} MiB"
    )
    assert listed - before < 5, f"listing 40 MiB of tenant objects took {listed - before:.1f} MiB"
