"""GPUs held by someone else: pods bound straight to a node, as another workload would be."""

from __future__ import annotations

from kubernetes import client

from mpijob import keys
from support.kube import Cluster


def hold(cluster: Cluster, namespace: str, node: str, gpu_ids: str = "0,1,2,3,4,5,6,7") -> str:
    """Create a pod on ``node`` holding ``gpu_ids`` (annotated as placed GPUs); its name."""
    name = f"holder-{node}"
    count = len(gpu_ids.split(","))
    cluster.core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, annotations={keys.GPU_IDS: gpu_ids}),
            spec=client.V1PodSpec(
                node_name=node,
                containers=[
                    client.V1Container(
                        name="main",
                        image="busybox",
                        resources=client.V1ResourceRequirements(
                            limits={keys.GPU_RESOURCE: str(count)}
                        ),
                    )
                ],
            ),
        ),
    )
    return name
