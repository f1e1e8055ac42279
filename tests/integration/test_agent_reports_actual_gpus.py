"""The node agent's report of a placement not honoured, against the real API server.

A worker pinned by a real DRA claim runs on a kwok node; the kwok node has no kubelet, so a fake
one (a real gRPC server of ``v1.PodResourcesLister`` on a unix socket) says what the pod's
container holds. The agent's check then runs with its real API client: it names the devices by
the simulated driver's ResourceSlice, patches the pod, and posts the Event on the MPIJob.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from test_dra import allocated, bound_workers, create, uuids_of

from mpijob import keys
from mpijob.agent.gpu_actual import GpuActual
from mpijob.agent.podresources import Verdict
from mpijob.agent.podresources_v1 import api_pb2, api_pb2_grpc
from mpijob.agent.publish import AgentKube
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = pytest.mark.integration

NODE = "gpu-node-3"


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, str]]:
    path = str(tmp_path / "kubelet.sock")
    fake = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield fake, path
    server.stop(grace=None)


def holding(pod: str, namespace: str, devices: list[str]) -> api_pb2.PodResources:
    claimed = api_pb2.DynamicResource(
        claim_name=f"{pod}-gpus",
        claim_namespace=namespace,
        claim_resources=[
            api_pb2.ClaimResource(driver_name=keys.NVIDIA_GPU_DRIVER, pool_name=NODE, device_name=d)
            for d in devices
        ],
    )
    container = api_pb2.ContainerResources(name="worker", dynamic_resources=[claimed])
    return api_pb2.PodResources(name=pod, namespace=namespace, containers=[container])


def test_a_pod_holding_other_devices_than_its_claim_is_reported_once(
    crds: Cluster,
    namespace: str,
    mpijobs: MPIJobs,
    kubelet: tuple[Kubelet, str],
) -> None:
    (worker,) = bound_workers(mpijobs, crds, "honoured", [(NODE, (0, 1))])
    create(crds, namespace, worker)
    pod = worker.pod["metadata"]["name"]
    assert sorted(allocated(crds, namespace, f"{pod}-gpus")) == [(NODE, "gpu-0"), (NODE, "gpu-1")]
    wait_until(
        lambda: crds.core.read_namespaced_pod(pod, namespace).spec.node_name,
        timeout=60,
        what=f"{pod} bound",
    )
    fake, socket = kubelet
    check = GpuActual(AgentKube(NODE, str(crds.kubeconfig)), NODE, socket=socket)
    # Only this test's pod is on the fake kubelet: others on the node are "not found", untouched.
    fake.pods = [holding(pod, namespace, ["gpu-0", "gpu-5"])]

    def ours() -> list[Verdict]:
        return [c.verdict for c in check.step() if c.namespace == namespace]

    assert ours() == [Verdict.MISMATCH]
    assert ours() == [Verdict.MISMATCH]  # a second turn reports nothing new
    held = ",".join(uuids_of(crds, NODE, (0, 5)))
    annotations = crds.core.read_namespaced_pod(pod, namespace).metadata.annotations
    assert annotations[keys.GPU_ACTUAL] == held
    events = crds.core.list_namespaced_event(
        namespace, field_selector=f"reason={keys.REASON_PLACEMENT_NOT_HONOURED}"
    ).items
    assert len(events) == 1
    (event,) = events
    assert (event.type, event.involved_object.kind, event.involved_object.name) == (
        "Warning",
        keys.KIND,
        "honoured",
    )
    assert pod in event.message
    assert held in event.message
    # The kubelet reports the claimed devices again: the stale annotation goes.
    fake.pods = [holding(pod, namespace, ["gpu-1", "gpu-0"])]
    assert ours() == [Verdict.MATCH]
    annotations = crds.core.read_namespaced_pod(pod, namespace).metadata.annotations
    assert keys.GPU_ACTUAL not in annotations
    mpijobs.delete("honoured")
