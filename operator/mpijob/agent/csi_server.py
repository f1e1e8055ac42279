"""``mpijob-agent-csi``: serves the CSI driver ``mps.mpijob.io`` (:mod:`mpijob.agent.csi`) to the
kubelet of its node.

Two unix sockets, as a CSI node plugin with the kubelet's plugin watcher:

* ``<kubelet-dir>/plugins/mps.mpijob.io/csi.sock``: CSI Identity and Node;
* ``<kubelet-dir>/plugins_registry/mps.mpijob.io-reg.sock``: the kubelet's plugin registration
  (``pluginregistration.Registration``): the watcher finds the socket, asks ``GetInfo`` (a
  ``CSIPlugin`` of that name, at the CSI socket, spec ``1.0.0``), calls ``NodeGetInfo`` on the
  CSI socket and reports the outcome, which is logged.

Without a separate registrar container (node-driver-registrar): the registration API is four
fields, and one process means one thing to keep alive on the node. Runs in the agent's
DaemonSet pod on ``core_mem`` nodes, in a privileged container (mounting into pods' volume
directories needs ``CAP_SYS_ADMIN`` and ``mountPropagation: Bidirectional``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import threading
from concurrent import futures
from typing import Any, Final

import click
import grpc

from mpijob import keys
from mpijob.agent.csi import IdentityService, NodeService, PodReader
from mpijob.agent.csi_v1 import csi_pb2_grpc
from mpijob.agent.pluginregistration_v1 import api_pb2, api_pb2_grpc

logger = logging.getLogger("mpijob.agent.csi")

KUBELET_DIR: Final = "/var/lib/kubelet"
#: The CSI versions the kubelet accepts from a registering plugin.
CSI_VERSIONS: Final = ("1.0.0",)

MS_RDONLY: Final = 0x1
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_REMOUNT: Final = 0x20
MS_BIND: Final = 0x1000
MNT_DETACH: Final = 0x2
_SAFE = MS_NOSUID | MS_NODEV | MS_NOEXEC
#: The tmpfs holding ``<uuid>/pipe``: one directory, a few bytes.
_TMPFS_OPTIONS: Final = "size=64k,mode=0755"


class LinuxMounter:
    """:class:`mpijob.agent.csi.Mounter` through mount(2) and umount2(2)."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._mountinfo = mountinfo

    def _mount(
        self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
    ) -> None:
        enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
        if self._libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mount {source} on {target}: {os.strerror(code)}")

    def publish(self, pipe: str, target: str, uuid: str) -> None:
        os.makedirs(target, mode=0o750, exist_ok=True)
        self._mount("tmpfs", target, "tmpfs", _SAFE, _TMPFS_OPTIONS)
        try:
            inner = os.path.join(target, uuid, "pipe")
            os.makedirs(inner, mode=0o755)
            self._mount(pipe, inner, None, MS_BIND, None)
            self._mount(None, inner, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _SAFE, None)
            self._mount(None, target, None, MS_REMOUNT | MS_RDONLY | _SAFE, _TMPFS_OPTIONS)
        except OSError:
            self.unpublish(target)
            raise

    def published(self, target: str) -> bool:
        return os.path.ismount(target)

    def unpublish(self, target: str) -> None:
        # Deepest first: the pipe's bind mount, then the tmpfs it lives on.
        for point in sorted(self._under(target), key=len, reverse=True):
            if self._libc.umount2(point.encode(), 0) != 0:
                code = ctypes.get_errno()
                if code == errno.EINVAL:  # gone meanwhile
                    continue
                if self._libc.umount2(point.encode(), MNT_DETACH) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"umount {point}: {os.strerror(code)}")

    def _under(self, target: str) -> list[str]:
        base = os.path.normpath(target)
        points = []
        with open(self._mountinfo) as lines:
            for line in lines:
                point = _unescape(line.split()[4])
                if point == base or point.startswith(base + os.sep):
                    points.append(point)
        return points


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class Registration(api_pb2_grpc.RegistrationServicer):
    """The kubelet plugin watcher's view of the driver."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()

    def GetInfo(self, request: Any, context: Any) -> Any:
        return api_pb2.PluginInfo(
            type="CSIPlugin",
            name=keys.MPS_CSI_DRIVER,
            endpoint=self.endpoint,
            supported_versions=list(CSI_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            logger.info("Registered %s with the kubelet", keys.MPS_CSI_DRIVER)
            self.registered.set()
        else:
            logger.error("The kubelet refused %s: %s", keys.MPS_CSI_DRIVER, request.error)
        return api_pb2.RegistrationStatusResponse()


def sockets(kubelet_dir: str) -> tuple[str, str]:
    """The CSI socket and the registration socket under ``kubelet_dir``."""
    driver = keys.MPS_CSI_DRIVER
    return (
        os.path.join(kubelet_dir, "plugins", driver, "csi.sock"),
        os.path.join(kubelet_dir, "plugins_registry", f"{driver}-reg.sock"),
    )


def serve(node_service: NodeService, kubelet_dir: str) -> tuple[grpc.Server, Registration]:
    """Start both servers (one thread pool: the kubelet's calls are few and short)."""
    csi_socket, registration_socket = sockets(kubelet_dir)
    registration = Registration(csi_socket)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityService(), server)  # type: ignore[no-untyped-call]
    csi_pb2_grpc.add_NodeServicer_to_server(node_service, server)  # type: ignore[no-untyped-call]
    api_pb2_grpc.add_RegistrationServicer_to_server(registration, server)  # type: ignore[no-untyped-call]
    for path in (csi_socket, registration_socket):
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        # A socket left by a previous run would refuse the bind.
        if os.path.exists(path):
            os.unlink(path)
    # The CSI socket first: the watcher calls NodeGetInfo as soon as it sees the other one.
    server.add_insecure_port(f"unix://{csi_socket}")
    server.add_insecure_port(f"unix://{registration_socket}")
    server.start()
    return server, registration


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node-name", envvar="NODE_NAME", required=True, help="This node ($NODE_NAME).")
@click.option(
    "--kubelet-dir",
    default=KUBELET_DIR,
    show_default=True,
    help="The kubelet's --root-dir (its plugins, plugins_registry and pods folders).",
)
@click.option(
    "--mps-root",
    default=keys.MPS_ROOT,
    show_default=True,
    help="Host directory of the MPS daemons' folders (as mpijob-agent --mps-root).",
)
def main(node_name: str, kubelet_dir: str, mps_root: str) -> None:
    """Serve the CSI driver mps.mpijob.io: each share pod sees its own GPU's MPS pipe folder."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from mpijob.agent.publish import NodePods  # keeps --help client-free

    read_pod: PodReader = NodePods()
    service = NodeService(
        node=node_name,
        read_pod=read_pod,
        mounter=LinuxMounter(),
        root=mps_root,
        kubelet_dir=kubelet_dir,
    )
    server, _ = serve(service, kubelet_dir)
    logger.info("Serving %s node=%s kubelet=%s", keys.MPS_CSI_DRIVER, node_name, kubelet_dir)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()
    # Gone from the registry: the watcher deregisters the driver.
    for path in sockets(kubelet_dir):
        if os.path.exists(path):
            os.unlink(path)
