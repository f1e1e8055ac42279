"""Real nodes of the local cluster: a kubelet, containerd and runc running real containers.

Beside the kwok GPU nodes, ``python -m hack.cluster up --real-nodes N`` (env ``REAL_NODES``,
default 2, 0 for none) starts N nodes ``real-node-<i>``, each a kubelet (the control plane's
Kubernetes version, built by hack/build-bins.sh) over its own containerd (Debian's 1.6 package,
which serves the CRI v1 API kubelet 1.34 speaks) and runc, with these pieces shared by all of them:

- a Linux bridge ``mpjb<id>`` with a /24 of its own; each node's pods get addresses from their
  slice of it (CNI bridge + host-local + loopback, Debian's containernetworking-plugins). The
  bridge's first address is the kubelets' node IP and the cluster DNS server. No iptables rule,
  no IP forwarding: pods only talk to each other and to that address.
- CoreDNS on that address, serving ``cluster.local`` from the API (so a headless Service's
  ``<pod>.<subdomain>.<ns>.svc`` names resolve), built from the Go module proxy.
- a TCP relay (hack/relay.py) from port 443 of that address to the API server, which listens on
  loopback only: pods that talk to the API (the operator installed as users install it, see
  hack/incluster.py) map ``kubernetes.default.svc`` to the bridge's address with a host alias.
  The API server's own certificate names ``kubernetes.default.svc``, so TLS verifies unchanged.
- one private mount namespace (``unshare``) holding containerd, the kubelet and every mount they
  make, with tmpfs over the host paths they would otherwise write (/run/netns, /run/containerd,
  /var/lib/cni, /var/log/containers) and the kernel settings the kubelet insists on setting
  (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) shadowed by files of our own, so the
  shared machine's values never change. When its last process exits, its mounts and the pods'
  network namespaces (and so their veths) go with it.
- per node, a cgroup ``/mpijob-<id>-<i>`` as the kubelet's cgroupRoot (``cgroupfs`` driver),
  removed on ``down``: on a cgroup v1 host one in every hierarchy, on a cgroup v2 host one in the
  unified hierarchy with the controllers the kubelet needs (cgroup_mode).

The nodes are labelled and tainted ``mpijob.io/real-node=true`` (NoSchedule): only pods that
select and tolerate them land there; kwok never manages them (they lack its annotation) and the
operator's placement ignores them (they lack the GPU opt-in label). Images come from
hack/images.py (no registry). State lives in ``<cluster>/realnode/``; containerd's image store
stays between runs so a warm start imports nothing.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack import images
from hack.common import free_port, spawn

HACK = Path(__file__).resolve().parent
NODE_PREFIX = "real-node-"
ROLE = "mpijob.io/real-node"
TAINT = {"key": ROLE, "value": "true", "effect": "NoSchedule"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Controllers the kubelet's cgroupfs manager refuses to start without (cpu, cpuset, memory, pids)
# and those it uses where present; on cgroup v2 each must be enabled in the parent's subtree.
CGROUP_V2_CONTROLLERS = ("cpu", "cpuset", "memory", "pids", "hugetlb", "io")
CNI_BIN = Path("/usr/lib/cni")
# Host paths containerd 1.6, the CNI plugins and the kubelet write whatever their configuration
# says; inside the node's mount namespace each is a tmpfs of its own.
PRIVATE_DIRS = ("/run/netns", "/run/containerd", "/var/lib/cni", "/var/log/containers")
# What the kubelet sets when they differ (protectKernelDefaults=false) or refuses to start over.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
HOST_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
}
INSTALL_HINT = (
    "install them with: apt-get install -y containerd runc containernetworking-plugins "
    "mmdebstrap (hack/test-deps.sh does this as root), or run without real nodes: REAL_NODES=0"
)
Kubectl = Callable[..., str]
FAILED = 3
APISERVER_PORT = 443
"""Where pods reach the API server on the bridge's address (the port of https://kubernetes.default.svc)."""
"""``cluster.py up``'s exit status when the control plane is up but a real node is not."""


def say(msg: str) -> None:
    print(f"[realnode] {msg}", file=sys.stderr, flush=True)


class NodeError(SystemExit):
    def __init__(self, msg: str) -> None:
        super().__init__(f"[realnode] error: {msg}")


@dataclass
class NodeState:
    """What ``down`` needs to undo, saved as soon as each piece exists."""

    count: int = 0
    id: str = ""
    bridge: str = ""
    subnet: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    created_dirs: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path) -> NodeState | None:
        path = root / "realnode" / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, root: Path) -> None:
        (root / "realnode").mkdir(parents=True, exist_ok=True)
        (root / "realnode" / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))


def node_name(i: int) -> str:
    return f"{NODE_PREFIX}{i}"


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def run(*argv: str, check: bool = True, input: str | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False, input=input)
    if check and out.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {(out.stderr or out.stdout).strip()}")
    return out.stdout


def place_on_real_node(body: dict[str, Any], cpu: str = "200m") -> dict[str, Any]:
    """The MPIJob with every replica sent to a real node, its images taken from the node's store
    (there is no registry) and CPU limits lowered to ``cpu``: upstream's pi examples ask for a
    whole CPU per pod, and a real node here has this machine's 2 cores."""
    job = copy.deepcopy(body)
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        pod = spec["template"].setdefault("spec", {})
        pod.setdefault("nodeSelector", {})[ROLE] = "true"
        pod.setdefault("tolerations", []).append(
            {"key": ROLE, "operator": "Exists", "effect": "NoSchedule"}
        )
        for c in pod["containers"]:
            c["imagePullPolicy"] = "IfNotPresent"
            limits = c.setdefault("resources", {}).setdefault("limits", {})
            limits["cpu"] = cpu
            limits.setdefault("memory", "1Gi")
    return job


# --- preflight ----------------------------------------------------------------------------------


def preflight(bins: dict[str, Path]) -> None:
    """Everything a real node needs, each missing piece named with its fix."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "real nodes need root (containerd, runc, a bridge, cgroups); run as root or "
            "REAL_NODES=0"
        )
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if not shutil.which(tool)})
    if missing:
        problems.append(f"missing Debian packages {', '.join(missing)}: {INSTALL_HINT}")
    plugins = [p for p in ("bridge", "host-local", "loopback") if not (CNI_BIN / p).exists()]
    if plugins:
        problems.append(f"CNI plugins {', '.join(plugins)} missing from {CNI_BIN}: {INSTALL_HINT}")
    mode = cgroup_mode(CGROUP_ROOT)
    if mode is None:
        problems.append(
            f"{CGROUP_ROOT} is neither a cgroup v2 hierarchy (no cgroup.controllers) nor cgroup "
            "v1 (no memory/cgroup.procs): mount cgroups there, or run REAL_NODES=0"
        )
    elif mode == "v2":
        missing_ctl = sorted(set(CGROUP_V2_CONTROLLERS[:4]) - _v2_controllers(CGROUP_ROOT))
        if missing_ctl:
            problems.append(
                f"cgroup v2 controllers {', '.join(missing_ctl)} are not available at "
                f"{CGROUP_ROOT} (cgroup.controllers): the kubelet needs them; boot with them "
                "enabled, or run REAL_NODES=0"
            )
    for name in ("kubelet", "coredns"):
        if not bins[name].exists():
            problems.append(f"{bins[name]} missing: run hack/build-bins.sh kubelet coredns")
    if problems:
        raise NodeError("cannot start the real node(s):\n  - " + "\n  - ".join(problems))


# --- network ------------------------------------------------------------------------------------


def cluster_id(root: Path) -> str:
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:6]


def pick_subnet(cid: str) -> str:
    """A 10.88.x.0/24 no interface or route of this machine uses (x from the cluster's id)."""
    taken = []
    for line in run("ip", "-o", "-4", "route", "show", "table", "all").splitlines():
        dest = line.split()[0]
        if dest[0].isdigit():
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(dest, strict=False))
    for line in run("ip", "-o", "-4", "addr", "show").splitlines():
        taken.append(ipaddress.ip_interface(line.split()[3]).network)
    start = int(cid, 16) % 256
    for k in range(256):
        net = ipaddress.ip_network(f"10.88.{(start + k) % 256}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return str(net)
    raise NodeError("no free /24 in 10.88.0.0/16 for the real nodes' pods")


def node_range(st: NodeState, i: int) -> tuple[str, str]:
    """Node i's slice of the subnet for its pods: 50 addresses from .2 up."""
    base = ipaddress.ip_network(st.subnet).network_address
    return str(base + 2 + 50 * i), str(base + 51 + 50 * i)


def bridge_up(st: NodeState) -> None:
    if run("ip", "link", "show", st.bridge, check=False):
        run("ip", "link", "del", st.bridge, check=False)
    run("ip", "link", "add", st.bridge, "type", "bridge")
    prefix = ipaddress.ip_network(st.subnet).prefixlen
    run("ip", "addr", "add", f"{st.gateway}/{prefix}", "dev", st.bridge)
    run("ip", "link", "set", st.bridge, "up")


# --- configuration files ------------------------------------------------------------------------


def containerd_config(d: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d / "containerd/root"}"
state = "{d / "containerd/state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d / "containerd.sock"}"
[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "containerd/opt"}"
[{cri}]
  sandbox_image = "{images.PAUSE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  # Without CAP_SYS_RESOURCE (as here) no process may lower its OOM score below containerd's.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{shutil.which("runc") or "runc"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{d / "cni"}"
  max_conf_num = 1
"""


def cni_config(st: NodeState, i: int, d: Path) -> str:
    start, end = node_range(st, i)
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": f"mpijob-{st.id}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": st.bridge,
                    # The bridge already has its address; isGateway would also turn on the
                    # machine's IP forwarding, which these pods never need.
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(d / "cni-ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": st.subnet,
                                    "rangeStart": start,
                                    "rangeEnd": end,
                                    "gateway": st.gateway,
                                }
                            ]
                        ],
                    },
                }
            ],
        },
        indent=2,
    )


def kubelet_config(st: NodeState, i: int, d: Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": st.gateway,
            "port": st.ports[f"kubelet-{i}"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": st.ports[f"kubelet-healthz-{i}"],
            # Reached only by the API server over the node's own bridge; a test cluster.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{d / 'containerd.sock'}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/mpijob-{st.id}-{i}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDNS": [st.gateway],
            "clusterDomain": "cluster.local",
            "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(d / "pod-logs"),
            "registerWithTaints": [TAINT],
            "makeIPTablesUtilChains": False,
            "protectKernelDefaults": False,
            # Other engineers' work fills this machine's disk and memory: never evict test pods
            # for it, never collect the images no registry could bring back.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "mergeDefaultEvictionSettings": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # ConfigMap volumes (the hostfile, discover_hosts.sh) follow changes within seconds.
            "syncFrequency": "5s",
            "serializeImagePulls": False,
            "maxPods": 50,
            "kubeAPIQPS": 50,
            "kubeAPIBurst": 100,
            "nodeStatusUpdateFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
    )


def corefile(st: NodeState, kubeconfig: Path) -> str:
    # No cache: a worker's record appears the moment its pod is Ready, and a launcher waiting
    # for it must not be answered from a remembered NXDOMAIN.
    return f""".:53 {{
    bind {st.gateway}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    health 127.0.0.1:{st.ports["coredns-health"]}
}}
"""


# --- processes ----------------------------------------------------------------------------------


def start(root: Path, st: NodeState, name: str, argv: list[str]) -> int:
    st.pids[name] = spawn(argv, root / "logs" / f"{name}.log")
    st.save(root)
    return st.pids[name]


def log_tail(root: Path, name: str, lines: int = 20) -> str:
    path = root / "logs" / f"{name}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait(what: str, check: Callable[[], bool], timeout: float, root: Path, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise NodeError(
        f"{what} not ready after {timeout:.0f}s; last lines of {root / 'logs' / (log + '.log')}:"
        f"\n{log_tail(root, log)}"
    )


def holder_script(st: NodeState, d: Path) -> str:
    lines = ["set -e", "mount --make-rprivate /"]
    for path in PRIVATE_DIRS:
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {path}")
    for key, value in KUBELET_SYSCTLS.items():
        fake = d / "sysctl" / key.replace("/", ".")
        lines.append(f"echo {value} > {fake}")
        lines.append(f"mount --bind {fake} /proc/sys/{key}")
    lines.append("exec sleep infinity")
    return "\n".join(lines)


def in_node_ns(st: NodeState, argv: list[str]) -> list[str]:
    return ["nsenter", f"--mount=/proc/{st.pids['holder']}/ns/mnt", "--", *argv]


def ctr(d: Path, *args: str, check: bool = True) -> str:
    return run(
        "ctr", "--address", str(d / "containerd.sock"), "--namespace", "k8s.io", *args, check=check
    )


def import_images(d: Path, names: Sequence[str]) -> None:
    """Loads each image of ``names`` whose archive changed since this containerd last imported
    it."""
    marker = d / "containerd" / "imported.json"
    done: dict[str, str] = json.loads(marker.read_text()) if marker.exists() else {}
    present = set(ctr(d, "images", "ls", "-q").split())
    for name in names:
        archive = images.ensure(name)
        ref = images.reference(name)
        if done.get(ref) == archive.name and ref in present:
            continue
        t0 = time.monotonic()
        ctr(d, "images", "import", "--no-unpack=false", str(archive))
        done[ref] = archive.name
        marker.write_text(json.dumps(done, indent=2))
        say(f"imported {ref} into {d.name}'s containerd ({time.monotonic() - t0:.1f}s)")


def cgroup_mode(root: Path) -> str | None:
    """``"v2"`` on a unified hierarchy (every current distribution), ``"v1"`` where the
    controllers are separate hierarchies (``memory`` among them), None for neither."""
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "memory" / "cgroup.procs").exists():
        return "v1"
    return None


def _v2_controllers(path: Path, file: str = "cgroup.controllers") -> set[str]:
    try:
        return set((path / file).read_text().split())
    except OSError:
        return set()


def make_cgroups(st: NodeState, i: int, root: Path = CGROUP_ROOT) -> None:
    """The node's cgroupRoot, recorded in ``st.cgroups`` for ``down``."""
    name = f"mpijob-{st.id}-{i}"
    if cgroup_mode(root) == "v2":
        # A child sees only the controllers its parent enables for its subtree. systemd enables
        # them all at the root on the distributions tried; where one is off, enable it (adding a
        # controller to the root's subtree changes no limit of any existing cgroup).
        wanted = set(CGROUP_V2_CONTROLLERS) & _v2_controllers(root)
        off = sorted(wanted - _v2_controllers(root, "cgroup.subtree_control"))
        if off:
            (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in off))
        path = root / name
        path.mkdir(exist_ok=True)
        if str(path) not in st.cgroups:
            st.cgroups.append(str(path))
        return
    for hierarchy in sorted(root.iterdir()):
        if not (hierarchy / "cgroup.procs").exists():
            continue
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (path / f).write_text((hierarchy / f).read_text())
        if str(path) not in st.cgroups:
            st.cgroups.append(str(path))


def up(
    root: Path,
    count: int,
    bins: dict[str, Path],
    kubeconfig: Path,
    kubectl: Kubectl,
    node_images: Sequence[str] = images.ALL,
) -> None:
    """Starts ``count`` real nodes (none when 0), holding ``node_images`` (hack/images.py), and
    waits until each is Ready."""
    if count <= 0:
        return
    if count > 5:
        raise NodeError(f"REAL_NODES={count}: at most 5 real nodes share one /24")
    st = NodeState.load(root)
    if st and st.count == count and healthy(st) and nodes_ready(kubectl, count):
        # Running nodes get what they lack: `make demo` starts them with its images only, and
        # `make test` after it adds the rest without a restart.
        for i in range(count):
            import_images(root / "realnode" / f"node-{i}", node_images)
        return
    if st:
        down(root, kubectl)
    t0 = time.monotonic()
    try:
        preflight(bins)
        archives = [images.ensure(name) for name in node_images]
        check_disk(root, count, archives)
    except SystemExit as e:
        (root / "realnode").mkdir(parents=True, exist_ok=True)
        (root / "realnode" / "error.txt").write_text(str(e.code))
        if isinstance(e, NodeError):
            raise
        raise NodeError(str(e.code)) from e
    cid = cluster_id(root)
    st = NodeState(count=count, id=cid, bridge=f"mpjb{cid}")
    st.save(root)
    error = root / "realnode" / "error.txt"
    error.unlink(missing_ok=True)
    try:
        _up(root, st, bins, kubeconfig, kubectl, node_images)
    except BaseException as e:
        say("real node start failed; undoing it (logs stay in .cluster/logs)")
        down(root, kubectl)
        error.parent.mkdir(parents=True, exist_ok=True)
        error.write_text(str(e.code) if isinstance(e, SystemExit) else repr(e))
        raise
    say(f"{count} real node(s) Ready in {time.monotonic() - t0:.1f}s (pods in {st.subnet})")


# Room beyond the images for etcd, the logs and the containers' own writes.
DISK_MARGIN = 2 << 30


def check_disk(root: Path, count: int, archives: Sequence[Path]) -> None:
    """Refuses to start nodes whose images the disk cannot hold, naming the shortfall: a full
    disk otherwise fails later and everywhere at once (etcd, the kubelets, every test)."""
    # Each node's containerd keeps an image twice: its layers and their unpacked snapshot.
    per_node = 2 * sum(a.stat().st_size for a in archives)
    need = DISK_MARGIN
    for i in range(count):
        marker = root / "realnode" / f"node-{i}" / "containerd" / "imported.json"
        held = set(json.loads(marker.read_text()).values()) if marker.exists() else set()
        if not {a.name for a in archives} <= held:
            need += per_node
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < need:
        gib = 1 << 30
        raise NodeError(
            f"{count} real node(s) need about {need / gib:.1f} GiB free under {root} for their "
            f"images (each node holds them twice: layers and unpacked) and their work; "
            f"{free / gib:.1f} GiB is free. Free disk space (old clusters: `make cluster-down`, "
            f"then remove their .cluster/realnode), or start fewer nodes (REAL_NODES=1 or 0)."
        )


def _up(
    root: Path,
    st: NodeState,
    bins: dict[str, Path],
    kubeconfig: Path,
    kubectl: Kubectl,
    node_images: Sequence[str],
) -> None:
    base = root / "realnode"
    st.subnet = pick_subnet(st.id)
    st.ports = {"coredns-health": free_port()}
    for i in range(st.count):
        st.ports[f"kubelet-{i}"] = free_port()
        st.ports[f"kubelet-healthz-{i}"] = free_port()
    st.save(root)
    bridge_up(st)

    (base / "coredns").mkdir(parents=True, exist_ok=True)
    (base / "coredns" / "Corefile").write_text(corefile(st, kubeconfig))
    start(root, st, "coredns", [str(bins["coredns"]), "-conf", str(base / "coredns/Corefile")])
    api = urllib.parse.urlsplit(
        yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    )
    relay = [str(HACK / "relay.py"), st.gateway, str(APISERVER_PORT), api.hostname, str(api.port)]
    start(root, st, "apiserver-relay", [sys.executable, *relay])

    for path in PRIVATE_DIRS:
        if not Path(path).exists():
            Path(path).mkdir(parents=True)
            st.created_dirs.append(path)
    (base / "sysctl").mkdir(parents=True, exist_ok=True)
    (base / "resolv.conf").write_text("")
    st.save(root)
    start(
        root,
        st,
        "holder",
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            holder_script(st, base),
        ],
    )
    wait("the node's mount namespace", lambda: _ns_ready(st), 10, root, "holder")

    for i in range(st.count):
        d = base / f"node-{i}"
        for sub in ("cni", "cni-ipam", "pod-logs", "kubelet", "containerd"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "resolv.conf").write_text("")
        (d / "containerd.toml").write_text(containerd_config(d))
        (d / "cni" / "10-mpijob.conflist").write_text(cni_config(st, i, d))
        (d / "kubelet.yaml").write_text(kubelet_config(st, i, d))
        make_cgroups(st, i)
        st.save(root)
        start(
            root,
            st,
            f"containerd-{i}",
            in_node_ns(st, ["containerd", "--config", str(d / "containerd.toml")]),
        )
        wait(
            f"containerd of {node_name(i)}",
            lambda d=d: _containerd_ready(d),
            30,
            root,
            f"containerd-{i}",
        )
        import_images(d, node_images)
        start(
            root,
            st,
            f"kubelet-{i}",
            in_node_ns(
                st,
                [
                    str(bins["kubelet"]),
                    f"--config={d / 'kubelet.yaml'}",
                    f"--kubeconfig={kubeconfig}",
                    f"--hostname-override={node_name(i)}",
                    f"--node-ip={st.gateway}",
                    f"--root-dir={d / 'kubelet'}",
                    f"--node-labels={ROLE}=true",
                    "--v=1",
                ],
            ),
        )

    wait("CoreDNS", lambda: _dns_ready(st), 30, root, "coredns")
    wait("the API server relay", lambda: _relay_ready(st), 10, root, "apiserver-relay")
    for i in range(st.count):
        wait(
            f"{node_name(i)} Ready",
            lambda i=i: node_ready(kubectl, node_name(i)),
            120,
            root,
            f"kubelet-{i}",
        )


def _containerd_ready(d: Path) -> bool:
    argv = ["ctr", "--address", str(d / "containerd.sock"), "version"]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _ns_ready(st: NodeState) -> bool:
    pid = st.pids["holder"]
    if not alive(pid):
        raise NodeError("the node's mount namespace exited (see logs/holder.log)")
    with contextlib.suppress(OSError):
        # Ready once `sleep` runs: the script before it made the mounts.
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
    return False


def _relay_ready(st: NodeState) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((st.gateway, APISERVER_PORT), 1):
        return True
    return False


def _dns_ready(st: NodeState) -> bool:
    import urllib.request

    with contextlib.suppress(OSError):
        url = f"http://127.0.0.1:{st.ports['coredns-health']}/health"
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    return False


def node_ready(kubectl: Kubectl, name: str) -> bool:
    try:
        out = kubectl(
            "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        )
    except SystemExit:
        return False
    return out.strip() == "True"


def nodes_ready(kubectl: Kubectl, count: int) -> bool:
    return all(node_ready(kubectl, node_name(i)) for i in range(count))


def healthy(st: NodeState) -> bool:
    names = ["coredns", "holder", "apiserver-relay"]
    for i in range(st.count):
        names += [f"containerd-{i}", f"kubelet-{i}"]
    return all(alive(st.pids.get(n, -1)) for n in names)


# --- teardown -----------------------------------------------------------------------------------


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if alive(p):
            _kill(p, signal.SIGKILL)


def _ns_members(holder: int) -> list[int]:
    """Every process in the node's mount namespace (containerd's shims among them)."""
    try:
        ns = os.readlink(f"/proc/{holder}/ns/mnt")
    except OSError:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != holder:
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == ns:
                    out.append(int(entry.name))
    return out


def _cgroup_procs(paths: list[str]) -> list[int]:
    out: set[int] = set()
    for p in paths:
        for f in Path(p).rglob("cgroup.procs") if Path(p).exists() else []:
            with contextlib.suppress(OSError):
                out.update(int(x) for x in f.read_text().split())
    return sorted(out)


def _rmdir_tree(path: Path) -> None:
    if not path.exists():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def drain(kubectl: Kubectl, st: NodeState, root: Path) -> None:
    """Deletes the real nodes' pods while the kubelets still run, so each sandbox is torn down
    the regular way (CNI DEL frees its address, the kubelet unmounts its volumes)."""
    for i in range(st.count):
        with contextlib.suppress(SystemExit):
            kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                "--field-selector",
                f"spec.nodeName={node_name(i)}",
                "--grace-period=0",
                "--force",
                "--wait=false",
            )
    deadline = time.monotonic() + 20
    for i in range(st.count):
        d = root / "realnode" / f"node-{i}"
        while time.monotonic() < deadline and alive(st.pids.get(f"containerd-{i}", -1)):
            if not ctr(d, "tasks", "ls", "-q", check=False).split():
                break
            time.sleep(0.3)


def down(root: Path, kubectl: Kubectl | None = None) -> None:
    """Stops the real nodes and removes all they made: processes, mounts (with the namespace),
    veths (with the pods' network namespaces), cgroups, the bridge, the folders it created."""
    st = NodeState.load(root)
    if st is None:
        return
    if kubectl is not None and healthy(st):
        drain(kubectl, st, root)
    kubelets = [st.pids[n] for n in st.pids if n.startswith("kubelet-")]
    for pid in kubelets:
        _kill(pid, signal.SIGTERM)
    _wait_gone(kubelets, 10)
    # Pod processes first (they live in the nodes' cgroups), then containerd and its shims.
    for pid in _cgroup_procs(st.cgroups):
        _kill(pid, signal.SIGKILL)
    daemons = [st.pids[n] for n in st.pids if n.startswith("containerd-")]
    for pid in daemons:
        _kill(pid, signal.SIGTERM)
    _wait_gone(daemons, 10)
    holder = st.pids.get("holder", -1)
    members = _ns_members(holder) if alive(holder) else []
    for pid in members:
        _kill(pid, signal.SIGKILL)
    _wait_gone(members, 5)
    for name in ("holder", "coredns", "apiserver-relay"):
        pid = st.pids.get(name, -1)
        if alive(pid):
            _kill(pid, signal.SIGTERM)
            _wait_gone([pid], 5)
    for pid in _cgroup_procs(st.cgroups):  # anything that raced the first sweep
        _kill(pid, signal.SIGKILL)
    for path in st.cgroups:
        _rmdir_tree(Path(path))
    if st.bridge and run("ip", "link", "show", st.bridge, check=False):
        run("ip", "link", "del", st.bridge, check=False)
    for path in reversed(st.created_dirs):
        with contextlib.suppress(OSError):
            Path(path).rmdir()
    if kubectl is not None:
        for i in range(st.count):
            with contextlib.suppress(SystemExit):
                kubectl("delete", "node", node_name(i), "--ignore-not-found", "--wait=false")
    base = root / "realnode"
    for i in range(st.count):
        d = base / f"node-{i}"
        # The image store stays (a warm start imports nothing); the rest is per run.
        for sub in ("kubelet", "cni-ipam", "pod-logs", "containerd/state"):
            subprocess.run(["rm", "-rf", str(d / sub)], check=False)
    (base / "state.json").unlink(missing_ok=True)


def status(root: Path) -> list[tuple[str, int]]:
    st = NodeState.load(root)
    return sorted(st.pids.items()) if st else []
