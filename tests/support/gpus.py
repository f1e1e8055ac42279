"""GPUs held by someone else: pods bound straight to a node, as another workload would be."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from mpijob import keys
from mpijob.desired import claims
from mpijob.placement import codec
from support.kube import Cluster
from support.wait import wait_until


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


def hold_by_claim(cluster: Cluster, namespace: str, name: str, node: str, gpus: list[int]) -> None:
    """Someone else's pod holding ``gpus`` of ``node`` through its own ResourceClaim (pinned by
    UUID, no annotation of ours); returns once the scheduler allocated them."""
    text = cluster.core.read_node(node).metadata.annotations[keys.GPU_TOPOLOGY]
    uuids = codec.loads(text).uuids_of(gpus)
    assert uuids is not None
    claim = {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": keys.NVIDIA_GPU_DRIVER,
                            "count": len(gpus),
                            "selectors": [{"cel": {"expression": claims.uuid_selector(uuids)}}],
                        },
                    }
                ]
            }
        },
    }
    cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").create(body=claim, namespace=namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}
            ],
        },
    }
    cluster.resource("v1", "Pod").create(body=pod, namespace=namespace)
    wait_until(
        lambda: claims.allocated_devices(_claim(cluster, namespace, name)),
        what=f"{name}'s claim allocated",
    )


def _claim(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found = cluster.resource(keys.DRA_API_VERSION, "ResourceClaim").get(namespace=namespace)
    return next((c.to_dict() for c in found.items if c.metadata.name == name), {})
