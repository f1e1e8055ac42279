"""The agent's CSI node service ``mps.mpijob.io``: a share pod's view of its GPU's MPS daemon.

A share pod gets, from the webhook, an inline ephemeral CSI volume of this driver mounted
read-only at ``/run/mpijob/mps`` (:func:`mpijob.shares.pod_edits.share_edits`) instead of a
hostPath, which a Pod Security ``baseline`` namespace refuses. When the kubelet sets the volume
up it calls :meth:`NodeService.NodePublishVolume` here, naming the pod (the CSIDriver object has
``podInfoOnMount: true``; the kubelet's pod name, namespace and uid replace any the pod's own
``volumeAttributes`` carry). What is mounted comes from the API server alone:

* the pod is read back by namespace and name, bound to this node (a list with the field
  selectors ``metadata.name`` and ``spec.nodeName``, the one way the agent reads pods), and its
  uid must be the one the kubelet named;
* its ``mpijob.io/gpu-share`` record, believed by the ledger's rule
  (:func:`mpijob.shares.ledger.believed`: written by the operator, naming the share the
  pod's containers request), must name this node, and ``mpijob.io/gpu-share-uuid`` (what the
  containers' ``NVIDIA_VISIBLE_DEVICES`` is read from) the same GPU;
* that GPU's pipe directory must be one this agent made (``<root>/<uuid>/pipe`` exists).

Then the target gets a small read-only tmpfs holding ``<uuid>/pipe``, onto which that one pipe
directory is bind-mounted read-only, so the container's ``CUDA_MPS_PIPE_DIRECTORY``
(``/run/mpijob/mps/$(NVIDIA_VISIBLE_DEVICES)/pipe``) is its daemon's and no other daemon, log
directory or file of the host is in view. The volume's own attributes are ignored. Anything
else is refused with a message the kubelet shows in the pod's ``FailedMount`` Event, and the
pod's container does not start. :meth:`NodeService.NodeUnpublishVolume` unmounts whatever is
mounted at or under the target.

The mounts go through a :class:`Mounter` (the Linux one in :mod:`mpijob.agent.csi_server`), and
the pod through a :class:`PodReader`, so tests inject both. Served over gRPC, with the kubelet's
plugin registration, by :mod:`mpijob.agent.csi_server`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Protocol

import grpc

from mpijob import keys
from mpijob.agent.csi_v1 import csi_pb2, csi_pb2_grpc
from mpijob.shares.ledger import believed
from mpijob.shares.pod_edits import mps_directories

logger = logging.getLogger("mpijob.agent.csi")

#: What the kubelet adds to a volume's context when the CSIDriver asks for pod info.
POD_NAME: Final = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE: Final = "csi.storage.k8s.io/pod.namespace"
POD_UID: Final = "csi.storage.k8s.io/pod.uid"
VENDOR_VERSION: Final = "0.1.0"
#: A GPU UUID as NVML writes it (``GPU-<hex groups>``, ``MIG-...``): one path component.
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")

JSON = Mapping[str, Any]


class PodReader(Protocol):
    def __call__(self, namespace: str, name: str, node: str) -> JSON | None:
        """The pod ``namespace/name`` if it is bound to ``node``, else None."""
        ...


class Mounter(Protocol):
    """The mount calls of the node service."""

    def publish(self, pipe: str, target: str, uuid: str) -> None:
        """Make ``target`` show ``<uuid>/pipe``, bind-mounted from ``pipe``, read-only."""
        ...

    def unpublish(self, target: str) -> None:
        """Unmount everything at and under ``target`` (nothing mounted: nothing to do)."""
        ...

    def published(self, target: str) -> bool:
        """Whether ``target`` is a mount point."""
        ...


class Refused(Exception):
    """A publish that must not happen; the message says why, for the pod's Event."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Publish:
    """What one NodePublishVolume mounts."""

    uuid: str
    pipe: str
    """The host's pipe directory of that GPU's daemon."""


def decide(
    context: Mapping[str, str],
    *,
    node: str,
    read_pod: PodReader,
    root: str = keys.MPS_ROOT,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> Publish:
    """The pipe directory a volume with the kubelet's ``context`` may show, or :class:`Refused`.

    Only the kubelet's pod keys of ``context`` are read; the pod, its record and its node come
    from the API server (``read_pod``).
    """
    namespace, name, uid = (context.get(k, "") for k in (POD_NAMESPACE, POD_NAME, POD_UID))
    if not (namespace and name and uid):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the kubelet named no pod: the CSIDriver {keys.MPS_CSI_DRIVER} must have "
            "podInfoOnMount: true",
        )
    who = f"pod {namespace}/{name}"
    pod = read_pod(namespace, name, node)
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != uid:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"{who} (uid {uid}) is not bound to node {node}")
    record = believed(pod)
    if record is None:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{who} holds no GPU share: only pods the operator placed "
            f"({keys.GPU_SHARE}) may mount {keys.MPS_CSI_DRIVER}",
        )
    if record.node != node:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{who}'s GPU share is on node {record.node}, not on {node}",
        )
    uuid = record.uuid
    # The containers' NVIDIA_VISIBLE_DEVICES is read from this annotation: the pipe directory
    # shown must be that GPU's, and the UUID one path component.
    annotated = (meta.get("annotations") or {}).get(keys.GPU_SHARE_UUID)
    if annotated != uuid or not _UUID.fullmatch(uuid):
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{who}'s {keys.GPU_SHARE_UUID} does not name the GPU of its share",
        )
    pipe = mps_directories(uuid, root).pipe
    if not is_dir(pipe):
        raise Refused(
            grpc.StatusCode.UNAVAILABLE,
            f"GPU {uuid} of {who}'s share has no MPS daemon on node {node} (no {pipe})",
        )
    return Publish(uuid=uuid, pipe=pipe)


def pod_target(target: str, kubelet_dir: str, uid: str) -> bool:
    """Whether ``target`` is a CSI volume directory of pod ``uid`` under the kubelet's root."""
    if not uid:
        return False
    base = os.path.join(os.path.normpath(kubelet_dir), "pods", uid, "volumes", "kubernetes.io~csi")
    path = os.path.normpath(target)
    return path.startswith(base + os.sep) and ".." not in target.split(os.sep)


def target_uid(target: str, kubelet_dir: str) -> str:
    """The pod uid in a target path under ``<kubelet_dir>/pods/``; empty when there is none."""
    pods = os.path.join(os.path.normpath(kubelet_dir), "pods") + os.sep
    path = os.path.normpath(target)
    return path[len(pods) :].split(os.sep, 1)[0] if path.startswith(pods) else ""


class IdentityService(csi_pb2_grpc.IdentityServicer):
    """Name, no controller, always ready (the node service needs nothing more to start)."""

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.GetPluginInfoResponse(
            name=keys.MPS_CSI_DRIVER, vendor_version=VENDOR_VERSION
        )

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(self, request: Any, context: Any) -> Any:
        return csi_pb2.ProbeResponse()


class NodeService(csi_pb2_grpc.NodeServicer):
    """Publish and unpublish; no staging, no stats. Methods not overridden answer UNIMPLEMENTED."""

    def __init__(
        self,
        *,
        node: str,
        read_pod: PodReader,
        mounter: Mounter,
        root: str = keys.MPS_ROOT,
        kubelet_dir: str = "/var/lib/kubelet",
        is_dir: Callable[[str], bool] = os.path.isdir,
    ) -> None:
        self.node = node
        self.read_pod = read_pod
        self.mounter = mounter
        self.root = root
        self.kubelet_dir = kubelet_dir
        self.is_dir = is_dir

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node)

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodeGetCapabilitiesResponse()

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        target = request.target_path
        uid = request.volume_context.get(POD_UID, "")
        try:
            if not target or not request.volume_id:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "no volume id or target path")
            publish = decide(
                request.volume_context,
                node=self.node,
                read_pod=self.read_pod,
                root=self.root,
                is_dir=self.is_dir,
            )
            if not pod_target(target, self.kubelet_dir, uid):
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"target {target} is not a volume directory of pod uid {uid}",
                )
            if self.mounter.published(target):
                return csi_pb2.NodePublishVolumeResponse()
            self.mounter.publish(publish.pipe, target, publish.uuid)
        except Refused as refused:
            logger.warning("Refused to publish %s: %s", target, refused)
            _abort(context, refused.code, str(refused))
        except OSError as error:
            logger.exception("Failed to publish %s", target)
            _abort(context, grpc.StatusCode.INTERNAL, f"mounting {target}: {error}")
        logger.info("Published GPU %s's pipe directory at %s", publish.uuid, target)
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        target = request.target_path
        if not target or not request.volume_id:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "no volume id or target path")
        # Only the kubelet reaches this socket; still, nothing outside its pods' CSI volume
        # directories is ever unmounted.
        if not pod_target(target, self.kubelet_dir, target_uid(target, self.kubelet_dir)):
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"target {target} is not a pod's CSI volume directory",
            )
        try:
            self.mounter.unpublish(target)
        except OSError as error:
            logger.exception("Failed to unpublish %s", target)
            _abort(context, grpc.StatusCode.INTERNAL, f"unmounting {target}: {error}")
        logger.info("Unpublished %s", target)
        return csi_pb2.NodeUnpublishVolumeResponse()


def _abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # grpc raises; a fake context must too
