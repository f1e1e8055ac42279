"""A fake kubelet for the agent's tests: a real gRPC server of ``v1.PodResourcesLister``.

It answers ``List`` with canned pods on a unix socket; the agent's client runs unchanged
against it. Also the pod bodies both sides describe: what the kubelet lists and what the API
server returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from mpijob.agent.podresources_v1 import api_pb2, api_pb2_grpc

UUIDS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(8)]
NODE = "gpu-node-0"


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.status: grpc.StatusCode | None = None
        self.calls = 0

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.status is not None:
            context.abort(self.status, "pod resources API is disabled")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


@contextmanager
def serving(path: str) -> Iterator[FakeKubelet]:
    """A fake kubelet listening on the unix socket ``path`` while the block runs."""
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield fake
    finally:
        server.stop(grace=None)


def plugin_pod(name: str, ids: list[str], namespace: str = "team") -> api_pb2.PodResources:
    devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)
    container = api_pb2.ContainerResources(name="worker", devices=[devices], cpu_ids=[2, 3])
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])


def dra_pod(name: str, devices: list[str], namespace: str = "team") -> api_pb2.PodResources:
    resources = [
        api_pb2.ClaimResource(
            driver_name="gpu.nvidia.com",
            pool_name=NODE,
            device_name=device,
            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.gpu.nvidia.com/device={device}")],
        )
        for device in devices
    ]
    dynamic = api_pb2.DynamicResource(
        claim_name=f"{name}-gpus", claim_namespace=namespace, claim_resources=resources
    )
    container = api_pb2.ContainerResources(name="worker", dynamic_resources=[dynamic])
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])


def api_pod(name: str, uuids: list[str], phase: str = "Running", namespace: str = "team") -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"mpijob.io/gpu-uuids": ",".join(uuids)},
        },
        "status": {"phase": phase},
    }
