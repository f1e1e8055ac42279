"""What every part of the local cluster shares: where things live (the project, the binary cache,
the cluster's state folder), the pinned versions, the cluster's state file, its processes, its
API server as seen from here, and kubectl against it.

hack/cluster.py composes the cluster from this; the optional components (hack/kueue.py,
hack/realnode.py, hack/dra.py) build on it too, never on hack/cluster.py, so nothing imports in
a circle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HACK = Path(__file__).resolve().parent
ROOT = HACK.parent
TOKEN = "mpijob-local-admin"  # loopback-only cluster; the token never leaves this machine
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "sched-plugins-controller",
    "kwok",
)


def versions() -> dict[str, str]:
    """hack/versions.env's pins for the Kubernetes minor the local cluster runs, resolved as
    hack/versions.sh resolves them: ``K8S_VERSION`` from the environment, else
    ``DEFAULT_K8S_VERSION``; each ``KEY_<major>_<minor>`` pin of that minor becomes ``KEY``."""
    pins: dict[str, str] = {}
    for raw in (HACK / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key] = value.strip('"')
    minor = os.environ.get("K8S_VERSION") or pins["DEFAULT_K8S_VERSION"]
    supported = pins["K8S_VERSIONS"].split()
    if minor not in supported:
        raise SystemExit(
            f"K8S_VERSION={minor}: the local cluster runs one of {' '.join(supported)} "
            "(hack/versions.env); set K8S_VERSION to one of them, or unset it for "
            f"{pins['DEFAULT_K8S_VERSION']}"
        )
    suffix = "_" + minor.replace(".", "_")
    for key, value in list(pins.items()):
        if key.endswith(suffix):
            pins[key.removesuffix(suffix)] = value
    pins["K8S_VERSION"] = minor
    return pins


def cache_dir() -> Path:
    if os.environ.get("MPIJOB_CACHE"):
        return Path(os.environ["MPIJOB_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "mpijob-operator"


def go_env() -> dict[str, str]:
    """This environment with Go's build and module caches inside the project's cache, as
    hack/build-bins.sh sets them, unless set already: removing that cache removes all Go built
    or downloaded for the project, and a cold start is really cold."""
    env = dict(os.environ)
    env.setdefault("GOCACHE", str(cache_dir() / "go-build"))
    env.setdefault("GOMODCACHE", str(cache_dir() / "go-mod"))
    # Go makes its module cache read-only; a user's `rm -rf` of the project's cache must work.
    env["GOFLAGS"] = f"{env.get('GOFLAGS', '')} -modcacherw".strip()
    return env


def state_dir() -> Path:
    return Path(os.environ.get("MPIJOB_CLUSTER_DIR") or ROOT / ".cluster")


def binaries() -> dict[str, Path]:
    v = versions()
    b = cache_dir() / "bin"
    kube = b / f"kubernetes-v{v['KUBE_VERSION']}"
    sp = b / f"scheduler-plugins-v{v['SCHED_PLUGINS_VERSION']}-k8s-v{v['KUBE_VERSION']}"
    return {
        "etcd": b / f"etcd-v{v['ETCD_VERSION']}" / "etcd",
        "kube-apiserver": kube / "kube-apiserver",
        "kube-controller-manager": kube / "kube-controller-manager",
        "kubectl": kube / "kubectl",
        "kube-scheduler": sp / "kube-scheduler",
        "sched-plugins-controller": sp / "sched-plugins-controller",
        "kwok": b / f"kwok-v{v['KWOK_VERSION']}" / "kwok",
        "kubelet": b / f"kubelet-v{v['KUBE_VERSION']}" / "kubelet",
        "coredns": b / f"coredns-v{v['COREDNS_VERSION']}" / "coredns",
        "helm": b / f"helm-v{v['HELM_VERSION']}" / "helm",
    }


def say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


#: The lowest port :func:`free_port` hands out.
LISTEN_PORTS_FROM = 15000


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (``ip_local_port_range``)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on, for a component of the local cluster, a
    benchmark or a test to listen on.

    Chosen below the kernel's ephemeral range: a port the kernel picks in that range (a bind to
    port 0) can be taken as the source port of any outgoing connection before the component it
    was meant for binds it, and the cluster opens thousands (Kueue once failed to start with
    "address already in use" so). Outside that range only another listener can take it."""
    low, _ = ephemeral_ports()
    for _ in range(500 if low > LISTEN_PORTS_FROM else 0):
        port = random.randrange(LISTEN_PORTS_FROM, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    # No room below the range (an odd kernel setting), or all tried are taken: the kernel's pick.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class State:
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    stages: str = ""
    """Digest of the kwok stages the cluster runs: a changed file needs a restart to count."""
    kube_version: str = ""
    """The Kubernetes version it runs (``KUBE_VERSION`` of the minor chosen when it started)."""
    feature_gates: str = ""
    """The control plane's ``--feature-gates`` (``FEATURE_GATES`` of that minor)."""

    @classmethod
    def load(cls) -> State | None:
        path = state_dir() / "state.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self) -> None:
        (state_dir() / "state.json").write_text(json.dumps(asdict(self), indent=2))


def alive(pid: int) -> bool:
    if pid <= 0:  # kill(-1, 0) would ask about every process
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # a zombie is not alive
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def stages_digest() -> str:
    return hashlib.sha256((HACK / "kwok/stages.yaml").read_bytes()).hexdigest()


def server_url(state: State) -> str:
    return f"https://127.0.0.1:{state.ports['kube-apiserver']}"


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    ca = state_dir() / "pki" / "apiserver.crt"
    # Until the apiserver has written its self-signed certificate there is nothing to verify.
    ctx = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
    if not ca.exists():
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return 0, str(e)


def healthy(state: State, patience: float = 0) -> bool:
    """Every process alive and the API server ready; with ``patience``, an API server that is
    slow to answer (a busy machine) is asked again for that many seconds before it counts as
    not ready: a running cluster taken for a stale one would be torn down."""
    if not all(alive(state.pids.get(c, -1)) for c in COMPONENTS):
        return False
    deadline = time.monotonic() + patience
    while get(server_url(state) + "/readyz")[0] != 200:
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)
    return True


def wait_for(what: str, check: Any, timeout: float, proc: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    log = state_dir() / "logs" / f"{proc}.log" if proc else None
    tail = ""
    if log and log.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    raise SystemExit(
        f"[cluster] error: {what} not ready after {timeout:.0f}s.\n{tail}\n"
        f"Logs: {state_dir() / 'logs'}"
    )


def spawn(argv: list[str], log_path: Path) -> int:
    """Start ``argv`` in a session of its own (it outlives this script), appending its output to
    ``log_path``; its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


#: How a component started with ``restart=True`` runs: in a loop that starts it again a second
#: after it exits, as a kubelet restarts a control-plane static pod. kube-scheduler exits on
#: purpose when it finds its cache corrupt (``klog.FlushAndExit``), which 1.37's did once here
#: after an API-server restart, and is meant to be restarted then.
RESTART_LOOP = (
    'while :; do "$@"; echo "[cluster] $0 exited with status $?; starting it again in 1 s"; '
    "sleep 1; done"
)


def start(name: str, argv: list[str], state: State, restart: bool = False) -> None:
    """Starts a component into ``state``; with ``restart``, restarted whenever it exits (its
    pid is the loop's, so stopping the cluster stops both)."""
    if restart:
        argv = ["sh", "-c", RESTART_LOOP, name, *argv]
    state.pids[name] = spawn(argv, state_dir() / "logs" / f"{name}.log")
    state.save()


def go_module_dir(mod: str, what: str, who: str = "cluster") -> Path:
    """Where the Go module proxy's copy of ``mod`` (``path@vX``) lies; exits naming ``what``
    it was needed for when it cannot be downloaded."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", mod],
        capture_output=True,
        text=True,
        cwd="/",
        env=go_env(),
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(
            f"[{who}] error: cannot download {mod} from the Go module proxy "
            f"for {what}:\n{out.stdout}{out.stderr}"
        )
    return Path(json.loads(out.stdout)["Dir"])


def kubectl(state: State, *args: str, input: str | None = None) -> str:
    out = subprocess.run(
        [str(binaries()["kubectl"]), "--kubeconfig", str(state_dir() / "kubeconfig"), *args],
        capture_output=True,
        text=True,
        input=input,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"[cluster] error: kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def wait_established(state: State, crds: list[str], timeout: float = 60) -> None:
    """Until every CRD (``crd/<name>``) is Established. ``kubectl wait`` errs instead of waiting
    on a CRD whose status is not written yet, right after it was created."""

    def established() -> bool:
        doc = json.loads(kubectl(state, "get", *crds, "-o", "json"))
        return all(
            any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (crd.get("status") or {}).get("conditions") or ()
            )
            for crd in doc.get("items", [doc])
        )

    wait_for(f"{len(crds)} CRDs Established", established, timeout, "kube-apiserver")
