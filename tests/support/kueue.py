"""Kueue for the integration tests: started beside the local cluster, and its objects.

Locally ``hack/kueue.py`` runs the real Kueue manager (``up`` when the module's tests begin,
``down`` after them, so later tests see a cluster without its webhooks). Against a cluster named
by MPIJOB_TEST_KUBECONFIG, Kueue must already be installed, with ``kubeflow.org/mpijob`` among
its frameworks.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Any

from kubernetes.dynamic.exceptions import NotFoundError

from mpijob import keys
from support.kube import ROOT, Cluster
from support.wait import wait_until

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MODEL_LABEL = "mpijob.io/gpu-model"


def start_kueue(cluster: Cluster) -> None:
    if cluster.local:
        up = [sys.executable, "-m", "hack.kueue", "up"]
        result = subprocess.run(up, cwd=ROOT, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                "Kueue did not start beside the local cluster (see the [kueue]/[cluster] lines "
                "above and .cluster/logs/kueue.log)"
            )
        return
    out = cluster.kubectl("get", "crd", "clusterqueues.kueue.x-k8s.io", check=False)
    if "NotFound" in out:
        raise RuntimeError(
            "the Kueue tests need Kueue installed in MPIJOB_TEST_KUBECONFIG's cluster"
        )


def stop_kueue(cluster: Cluster) -> None:
    if cluster.local:
        subprocess.run([sys.executable, "-m", "hack.kueue", "down"], cwd=ROOT, check=True)


class Kueue:
    """Kueue's objects, through the dynamic client."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def api(self, kind: str) -> Any:
        return self.cluster.resource(KUEUE_API, kind)

    def create(self, body: dict[str, Any]) -> None:
        kind = body["kind"]
        meta = body["metadata"]
        self.api(kind).create(
            body={"apiVersion": KUEUE_API, **body}, namespace=meta.get("namespace")
        )

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        with contextlib.suppress(NotFoundError):
            self.api(kind).delete(name=name, namespace=namespace)

    def flavor(self, name: str, node_labels: dict[str, str]) -> None:
        self.create(
            {
                "kind": "ResourceFlavor",
                "metadata": {"name": name},
                "spec": {"nodeLabels": node_labels},
            }
        )

    def cluster_queue(self, name: str, flavor: str, gpus: int, preempt: bool = False) -> None:
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", keys.GPU_RESOURCE],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": keys.GPU_RESOURCE, "nominalQuota": str(gpus)},
                            ],
                        }
                    ],
                }
            ],
        }
        if preempt:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self.create({"kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec})

    def local_queue(self, namespace: str, name: str, cluster_queue: str) -> None:
        self.create(
            {
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            }
        )

        def active() -> bool:
            lq = self.api("LocalQueue").get(name=name, namespace=namespace).to_dict()
            return any(
                c["type"] == "Active" and c["status"] == "True"
                for c in (lq.get("status") or {}).get("conditions") or []
            )

        wait_until(active, timeout=30, what=f"LocalQueue {namespace}/{name} Active")

    def priority_class(self, name: str, value: int) -> None:
        self.create({"kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})

    def workload_of(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        for w in self.api("Workload").get(namespace=namespace).to_dict()["items"]:
            owners = w["metadata"].get("ownerReferences") or []
            if any(o["uid"] == job_uid for o in owners):
                return dict(w)
        return None

    def workload(self, namespace: str, job_uid: str) -> dict[str, Any]:
        return wait_until(
            lambda: self.workload_of(namespace, job_uid), timeout=30, what="the job's Workload"
        )


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return None
