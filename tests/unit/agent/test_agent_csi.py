"""The CSI node service ``mps.mpijob.io`` over its real gRPC sockets, as the kubelet calls it:
registration, then publish and unpublish with the mounts and the API server's pods injected."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from mpijob import keys
from mpijob.agent.csi import POD_NAME, POD_NAMESPACE, POD_UID, NodeService
from mpijob.agent.csi_server import LinuxMounter, _unescape, serve, sockets
from mpijob.agent.csi_v1 import csi_pb2, csi_pb2_grpc
from mpijob.agent.pluginregistration_v1 import api_pb2, api_pb2_grpc
from mpijob.shares.request import Placed, Share

NODE = "share-node-0"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-2222-3333-4444-555555555555"
UID = "0b6a2c1e-1111-2222-3333-444455556666"


def share_pod(node: str = NODE, uuid: str = UUID) -> dict[str, Any]:
    """A share pod as the operator placed it: 2 GiB and 30% of ``uuid`` on ``node``."""
    record = Placed(node=node, gpu=1, uuid=uuid, share=Share(memory_gib=2, percentage=30))
    return {
        "metadata": {
            "name": "worker",
            "namespace": "tenant",
            "uid": UID,
            "annotations": {keys.GPU_SHARE: record.dumps(), keys.GPU_SHARE_UUID: uuid},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {keys.GPU_MEM_RESOURCE: 2, keys.GPU_CORE_PERCENTAGE_RESOURCE: 30}
                    },
                }
            ],
        },
    }


class Pods:
    """The API server, as the agent reads it: pods by namespace and name, bound to a node."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: list[tuple[str, str, str]] = []

    def __call__(self, namespace: str, name: str, node: str) -> Mapping[str, Any] | None:
        self.reads.append((namespace, name, node))
        pod = self.pods.get((namespace, name))
        if pod is None or pod["spec"].get("nodeName") != node:
            return None
        return pod


class Mounts:
    """Records the mount calls instead of mounting."""

    def __init__(self) -> None:
        self.mounted: dict[str, tuple[str, str]] = {}
        self.calls: list[tuple[str, ...]] = []

    def publish(self, pipe: str, target: str, uuid: str) -> None:
        self.calls.append(("publish", pipe, target, uuid))
        self.mounted[target] = (pipe, uuid)

    def unpublish(self, target: str) -> None:
        self.calls.append(("unpublish", target))
        self.mounted.pop(target, None)

    def published(self, target: str) -> bool:
        return target in self.mounted


class Driver:
    def __init__(self, kubelet: Path, mps: Path) -> None:
        self.kubelet, self.mps = kubelet, mps
        self.pods = Pods()
        self.mounts = Mounts()
        for uuid in (UUID, OTHER):
            (mps / uuid / "pipe").mkdir(parents=True)
        self.service = NodeService(
            node=NODE,
            read_pod=self.pods,
            mounter=self.mounts,
            root=str(mps),
            kubelet_dir=str(kubelet),
        )
        self.server, self.registration = serve(self.service, str(kubelet))
        csi_socket, registration_socket = sockets(str(kubelet))
        self.channel = grpc.insecure_channel(f"unix://{csi_socket}")
        self.registry = grpc.insecure_channel(f"unix://{registration_socket}")
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)

    def target(self, uid: str = UID) -> str:
        return f"{self.kubelet}/pods/{uid}/volumes/kubernetes.io~csi/mpijob-mps/mount"

    def publish(self, context: Mapping[str, str] | None = None, target: str = "") -> Any:
        if context is None:
            context = {POD_NAME: "worker", POD_NAMESPACE: "tenant", POD_UID: UID}
        return self.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id="csi-0123",
                target_path=target or self.target(),
                readonly=True,
                volume_capability=csi_pb2.VolumeCapability(
                    mount=csi_pb2.VolumeCapability.MountVolume(),
                    access_mode=csi_pb2.VolumeCapability.AccessMode(
                        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
                    ),
                ),
                volume_context={
                    **context,
                    "csi.storage.k8s.io/ephemeral": "true",
                },
            ),
            timeout=5,
        )

    def refused(self, context: Mapping[str, str] | None = None, target: str = "") -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            self.publish(context, target)
        assert not self.mounts.calls
        return caught.value

    def close(self) -> None:
        self.channel.close()
        self.registry.close()
        self.server.stop(grace=None)


@pytest.fixture
def driver() -> Iterator[Driver]:
    # Short: a unix socket's path has at most 107 characters, pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="csi") as short:
        found = Driver(Path(short) / "kubelet", Path(short) / "mps")
        try:
            yield found
        finally:
            found.close()


def test_the_kubelet_registers_it_and_reads_its_node(driver: Driver) -> None:
    registration = api_pb2_grpc.RegistrationStub(driver.registry)
    info = registration.GetInfo(api_pb2.InfoRequest(), timeout=5)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "CSIPlugin",
        keys.MPS_CSI_DRIVER,
        ["1.0.0"],
    )
    assert info.endpoint == sockets(str(driver.kubelet))[0]
    registration.NotifyRegistrationStatus(api_pb2.RegistrationStatus(plugin_registered=True))
    assert driver.registration.registered.is_set()
    assert driver.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == NODE
    assert not driver.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest()).capabilities
    plugin = driver.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert plugin.name == keys.MPS_CSI_DRIVER
    assert not driver.identity.GetPluginCapabilities(
        csi_pb2.GetPluginCapabilitiesRequest()
    ).capabilities


def test_a_placed_pod_gets_its_own_gpus_pipe_directory(driver: Driver) -> None:
    driver.pods.pods["tenant", "worker"] = share_pod()
    driver.publish()
    pipe = str(driver.mps / UUID / "pipe")
    assert driver.mounts.calls == [("publish", pipe, driver.target(), UUID)]
    # Read from the API server, bound to this node.
    assert driver.pods.reads == [("tenant", "worker", NODE)]
    # Again (the kubelet retries after a restart): already mounted, nothing mounted twice.
    driver.publish()
    assert len(driver.mounts.calls) == 1


def test_the_volumes_own_attributes_name_no_gpu(driver: Driver) -> None:
    """Whatever the tenant wrote in volumeAttributes, the record decides."""
    driver.pods.pods["tenant", "worker"] = share_pod()
    driver.publish({POD_NAME: "worker", POD_NAMESPACE: "tenant", POD_UID: UID, "uuid": OTHER})
    assert driver.mounts.calls[0][1:] == (str(driver.mps / UUID / "pipe"), driver.target(), UUID)


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("no pod info", grpc.StatusCode.INVALID_ARGUMENT, "podInfoOnMount: true"),
        ("unknown pod", grpc.StatusCode.NOT_FOUND, "is not bound to node share-node-0"),
        ("another node's pod", grpc.StatusCode.NOT_FOUND, "is not bound to node"),
        ("same name, another uid", grpc.StatusCode.NOT_FOUND, "is not bound to node"),
        ("unplaced (gated) pod", grpc.StatusCode.FAILED_PRECONDITION, "holds no GPU share"),
        ("plain pod, hand-written record", grpc.StatusCode.FAILED_PRECONDITION, "no GPU share"),
        ("record of another node", grpc.StatusCode.FAILED_PRECONDITION, "is on node other"),
        ("uuid annotation edited", grpc.StatusCode.FAILED_PRECONDITION, "does not name the GPU"),
        ("uuid with a path", grpc.StatusCode.FAILED_PRECONDITION, "does not name the GPU"),
        ("gpu without a daemon", grpc.StatusCode.UNAVAILABLE, "has no MPS daemon"),
        ("another pod's target", grpc.StatusCode.INVALID_ARGUMENT, "not a volume directory"),
    ],
)
def test_publish_refuses(driver: Driver, case: str, code: grpc.StatusCode, message: str) -> None:
    pod = share_pod()
    context = {POD_NAME: "worker", POD_NAMESPACE: "tenant", POD_UID: UID}
    target = ""
    annotations = pod["metadata"]["annotations"]
    match case:
        case "no pod info":
            context = {}
        case "unknown pod":
            pod["metadata"]["name"] = "someone-else"
        case "another node's pod":
            pod["spec"]["nodeName"] = "other"
        case "same name, another uid":
            pod["metadata"]["uid"] = "another-uid"
        case "unplaced (gated) pod":
            annotations.clear()
        case "plain pod, hand-written record":
            pod["spec"]["containers"][0]["resources"] = {}
        case "record of another node":
            annotations.update(share_pod(node="other")["metadata"]["annotations"])
        case "uuid annotation edited":
            annotations[keys.GPU_SHARE_UUID] = OTHER
        case "uuid with a path":
            bad = "../" + UUID
            annotations.update(share_pod(uuid=bad)["metadata"]["annotations"])
        case "gpu without a daemon":
            gone = "GPU-00000000-0000-0000-0000-000000000000"
            annotations.update(share_pod(uuid=gone)["metadata"]["annotations"])
        case "another pod's target":
            target = driver.target("another-uid")
    driver.pods.pods["tenant", pod["metadata"]["name"]] = copy.deepcopy(pod)
    error = driver.refused(context, target)
    assert error.code() == code, error.details()
    assert message in (error.details() or ""), error.details()


def test_a_failed_mount_is_an_internal_error_naming_it(driver: Driver) -> None:
    def fail(pipe: str, target: str, uuid: str) -> None:
        raise OSError(1, "Operation not permitted")

    driver.pods.pods["tenant", "worker"] = share_pod()
    driver.mounts.publish = fail  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError) as caught:
        driver.publish()
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "Operation not permitted" in (caught.value.details() or "")


def test_unpublish_unmounts_and_is_idempotent(driver: Driver) -> None:
    driver.pods.pods["tenant", "worker"] = share_pod()
    driver.publish()
    request = csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-0123", target_path=driver.target())
    driver.node.NodeUnpublishVolume(request, timeout=5)
    assert driver.mounts.calls[-1] == ("unpublish", driver.target())
    assert not driver.mounts.mounted
    driver.node.NodeUnpublishVolume(request, timeout=5)
    with pytest.raises(grpc.RpcError) as caught:
        driver.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-0123", target_path="/etc"), timeout=5
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert driver.mounts.calls[-1] == ("unpublish", driver.target())


def test_unmounts_read_from_mountinfo_deepest_first(tmp_path: Path) -> None:
    target = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/mpijob-mps/mount"
    info = tmp_path / "mountinfo"
    info.write_text(
        f"30 25 0:40 / {target} rw - tmpfs tmpfs rw\n"
        f"31 30 0:41 /{UUID}/pipe {target}/{UUID}/pipe ro - tmpfs tmpfs rw\n"
        f"32 25 0:42 / {target}-other rw - tmpfs tmpfs rw\n"
        "33 25 0:43 / /with\\040space rw - tmpfs tmpfs rw\n"
    )
    mounter = LinuxMounter(str(info))
    assert mounter._under(target) == [target, f"{target}/{UUID}/pipe"]
    assert _unescape("/with\\040space") == "/with space"


def test_the_linux_mounter_shows_one_pipe_directory_read_only(tmp_path: Path) -> None:
    """Real mounts (root with CAP_SYS_ADMIN only): the target shows ``<uuid>/pipe`` and nothing
    else of the MPS root, read-only, and unpublish leaves no mount behind."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    root = tmp_path / "mps"
    (root / UUID / "pipe").mkdir(parents=True)
    (root / UUID / "log").mkdir()
    (root / UUID / "pipe" / "control").write_text("")
    target = tmp_path / "pods" / "mount"
    mounter = LinuxMounter()
    try:
        mounter.publish(str(root / UUID / "pipe"), str(target), UUID)
    except OSError as error:
        pytest.skip(f"cannot mount here: {error}")
    try:
        assert mounter.published(str(target))
        assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
            UUID,
            f"{UUID}/pipe",
            f"{UUID}/pipe/control",
        ]
        for path in (target / "x", target / UUID / "pipe" / "x"):
            with pytest.raises(OSError, match="Read-only"):
                path.write_text("")
    finally:
        mounter.unpublish(str(target))
    assert not mounter.published(str(target))
    assert not list(target.iterdir())
