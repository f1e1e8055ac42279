"""Reconcile benchmark: 100 MPIJobs with 8 workers each, our operator against upstream's.

Run as ``make bench`` (``.venv/bin/python bench/reconcile.py``). Starts its own local cluster
(``hack/cluster.py`` with ``MPIJOB_CLUSTER_DIR=.bench/cluster``, an audit log and one token user
per operator), so the test cluster is never touched, and stops it at the end. Builds upstream's
mpi-operator into the binary cache first if it is missing (``hack/build-bins.sh mpi-operator``).

For each operator in turn, on the same cluster and the same workload, each scoped to its own
namespace with the same client limits (QPS 100, burst 200, threadiness 8):

1. start it and wait until it reports leadership (``mpi_operator_is_leader`` is 1 on /metrics),
   then 2 s more;
2. apply the 100 MPIJobs (``kubectl apply --server-side``) and time, with watches from the
   admin user, until every job has its Service, ConfigMap, Secret, 8 worker pods and launcher
   Job (each controlled by the MPIJob) and a Created condition that is True;
3. read its peak RSS (VmHWM) and CPU time from /proc, stop it, and count its API requests in
   the API server's audit log;
4. delete the namespace, so the next run starts from the same empty cluster.

Prints a table and writes ``.bench/reconcile.json``. Operator logs go to ``.bench/logs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
OUT = BENCH / "reconcile.json"
sys.path.insert(0, str(ROOT / "hack"))
os.environ.setdefault("MPIJOB_CLUSTER_DIR", str(BENCH / "cluster"))
import cluster  # noqa: E402 - hack/cluster.py, which reads MPIJOB_CLUSTER_DIR on each call

SIDES = ("ours", "upstream")
LIMITS = {"qps": 100, "burst": 200, "threadiness": 8}
SETTLE_SECONDS = 2.0
UPSTREAM_HEALTH_PORT = 8080  # fixed in upstream's binary, on every interface
CHILD_KINDS = ("services", "configmaps", "secrets", "pods", "jobs")
WATCH_PATHS = {
    "services": "/api/v1/namespaces/{ns}/services",
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "mpijobs": "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
}
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cluster(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "hack" / "cluster.py"), *args], check=True)


def kubectl(*args: str, input: str | None = None) -> str:
    return cluster.kubectl(cluster.State.load(), *args, input=input)  # type: ignore[arg-type]


# --- workload -----------------------------------------------------------------------------------


def job_names(jobs: int) -> list[str]:
    return [f"pi-{i:03d}" for i in range(jobs)]


def mpijob(name: str, workers: int) -> dict[str, Any]:
    """Upstream's pi example, as users apply it."""
    image = "mpioperator/mpi-pi:openmpi"
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "mpi-launcher",
                                    "image": image,
                                    "command": ["mpirun"],
                                    "args": ["-n", str(workers), "/home/mpiuser/pi"],
                                }
                            ]
                        }
                    },
                },
                "Worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "mpi-worker",
                                    "image": image,
                                    "command": ["/usr/sbin/sshd"],
                                    "args": ["-De", "-f", "/home/mpiuser/.sshd_config"],
                                }
                            ]
                        }
                    },
                },
            },
        },
    }


def expected_children(jobs: list[str], workers: int) -> dict[str, dict[str, str]]:
    """Child name -> owning job name, per kind (upstream's names, spec section 2)."""
    return {
        "services": {j: j for j in jobs},
        "configmaps": {f"{j}-config": j for j in jobs},
        "secrets": {f"{j}-ssh": j for j in jobs},
        "pods": {f"{j}-worker-{i}": j for j in jobs for i in range(workers)},
        "jobs": {f"{j}-launcher": j for j in jobs},
    }


# --- progress, seen through watches -------------------------------------------------------------


def controller_job(obj: dict[str, Any]) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "MPIJob":
            return str(ref.get("name"))
    return None


def created(obj: dict[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Created" and c.get("status") == "True" for c in conditions)


@dataclass
class Progress:
    """What exists of the expected children and Created conditions, updated by watch events."""

    expected: dict[str, dict[str, str]]
    jobs: set[str]
    have: dict[str, set[str]] = field(default_factory=dict)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if event == "SYNC":
            self.have[kind] = set()
            for item in obj["items"]:
                self.apply(kind, "ADDED", item)
            return
        name = obj.get("metadata", {}).get("name", "")
        have = self.have.setdefault(kind, set())
        if kind == "mpijobs":
            ok = name in self.jobs and created(obj)
        else:
            owner = controller_job(obj)
            ok = owner is not None and self.expected[kind].get(name) == owner
        if ok and event != "DELETED":
            have.add(name)
        else:
            have.discard(name)

    def missing(self) -> dict[str, int]:
        wanted = {**{k: len(v) for k, v in self.expected.items()}, "mpijobs": len(self.jobs)}
        return {k: n - len(self.have.get(k, ())) for k, n in wanted.items()}


class Watches:
    """Admin-user list-then-watch of the namespace's objects, as an informer does.

    Feeds one queue of (kind, type, object); type SYNC carries a fresh list (``{"items": ...}``)
    that replaces what was known of that kind. A watch the API server ends (it closes watchers
    that fall behind) resumes from the last resourceVersion, or relists when that is gone.
    """

    def __init__(self, namespace: str) -> None:
        self.events: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        self._open_now: dict[str, Any] = {}
        self._stopped = threading.Event()
        state = cluster.State.load()
        assert state is not None
        self._server = cluster.server_url(state)
        self._ctx = ssl.create_default_context(
            cafile=str(cluster.state_dir() / "pki/apiserver.crt")
        )
        for kind, path in WATCH_PATHS.items():
            url = self._server + path.format(ns=namespace)
            threading.Thread(target=self._follow, args=(kind, url), daemon=True).start()

    def _open(self, url: str, accept: str) -> Any:
        headers = {"Authorization": f"Bearer {cluster.TOKEN}", "Accept": accept}
        for _ in range(60):
            try:
                return urllib.request.urlopen(
                    urllib.request.Request(url, headers=headers), context=self._ctx, timeout=3600
                )
            except urllib.error.HTTPError as e:
                if e.code != 429:  # 429: a fresh API server's watch cache is still filling
                    raise
                time.sleep(1)
        raise SystemExit(f"[bench] error: the API server kept refusing {url}")

    def _follow(self, kind: str, url: str) -> None:
        full = kind == "mpijobs"
        rv = ""
        with contextlib.suppress(Exception):  # stopped, or the cluster went away
            while not self._stopped.is_set():
                if not rv:
                    with self._open(url, "application/json" if full else METADATA_LIST) as r:
                        body = json.load(r)
                    rv = body["metadata"]["resourceVersion"]
                    self.events.put((kind, "SYNC", {"items": body.get("items") or []}))
                query = f"?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
                resp = self._open(url + query, "application/json" if full else METADATA_ONLY)
                self._open_now[kind] = resp
                for line in resp:
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # 410 Gone: our resourceVersion was compacted
                        rv = ""
                        break
                    rv = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.events.put((kind, event["type"], event["object"]))

    def stop(self) -> None:
        self._stopped.set()
        # close() would wait for the reader thread's buffer lock; a shutdown ends its read.
        for resp in self._open_now.values():
            with contextlib.suppress(Exception):
                resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)


# --- operators ----------------------------------------------------------------------------------


def upstream_binary() -> Path:
    version = cluster.versions()["MPI_OPERATOR_VERSION"]
    path = cluster.cache_dir() / "bin" / f"mpi-operator-v{version}" / "mpi-operator"
    if not path.exists():
        say(f"upstream mpi-operator v{version} missing; building it (hack/build-bins.sh)")
        subprocess.run([str(ROOT / "hack" / "build-bins.sh"), "mpi-operator"], check=True)
    return path


def operator_argv(side: str, namespace: str, port: int, kubeconfig: Path) -> list[str]:
    common = [
        "--namespace",
        namespace,
        "--lock-namespace",
        namespace,
        "--monitoring-port",
        str(port),
        "--kube-api-qps",
        str(LIMITS["qps"]),
        "--kube-api-burst",
        str(LIMITS["burst"]),
        "--threadiness",
        str(LIMITS["threadiness"]),
    ]
    if side == "ours":
        return [sys.executable, "-m", "mpijob", "run", *common]
    return [str(upstream_binary()), "--kubeConfig", str(kubeconfig), *common]


def leading(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "mpi_operator_is_leader":
            return float(value) == 1
    return False


def proc_status(pid: int) -> dict[str, float]:
    """Peak RSS (VmHWM, MiB) and CPU seconds (user + system) of a live process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "peak_rss_mb": int(fields["VmHWM"].split()[0]) / 1024,
        "cpu_seconds": (int(stat[11]) + int(stat[12])) / ticks,
    }


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- API requests, counted by the API server ----------------------------------------------------


def audit_requests(user: str, since: float, until: float) -> Counter[str]:
    """Requests by ``user`` received in [since, until], as 'verb resource[/subresource]'.

    One audit ID is one request; a watch is one request however long it streams (its events and
    bookmarks are not requests).
    """
    seen: dict[str, str] = {}
    needle = f'"username":"{user}"'
    with (cluster.state_dir() / "logs" / "audit.log").open() as log:
        for line in log:
            if needle not in line:
                continue
            event = json.loads(line)
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if since <= received <= until:
                ref = event.get("objectRef") or {}
                what = ref.get("resource") or event["requestURI"].split("?")[0]
                if ref.get("subresource"):
                    what += "/" + ref["subresource"]
                seen[event["auditID"]] = f"{event['verb']} {what}"
    return Counter(seen.values())


# --- one run ------------------------------------------------------------------------------------


def run_side(side: str, jobs: int, workers: int, timeout: float) -> dict[str, Any]:
    namespace = f"bench-{side}"
    kubectl("create", "namespace", namespace)
    kubeconfig = cluster.state_dir() / f"kubeconfig-{namespace}"
    port = free_port()
    argv = operator_argv(side, namespace, port, kubeconfig)
    if side == "upstream" and not port_free(UPSTREAM_HEALTH_PORT):
        raise SystemExit(f"[bench] error: port {UPSTREAM_HEALTH_PORT} is taken; upstream needs it")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}  # upstream: KUBECONFIG beats --kubeConfig
    log_path = BENCH / "logs" / f"{side}.log"
    names = job_names(jobs)
    progress = Progress(expected_children(names, workers), set(names))
    watches = Watches(namespace)
    started = time.time()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not leading(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"[bench] error: {side} operator did not start:\n{tail}")
            time.sleep(0.1)
        time.sleep(SETTLE_SECONDS)
        say(f"{side}: leading after {time.time() - started:.1f} s; applying {jobs} MPIJobs")
        manifests = yaml.safe_dump_all([mpijob(n, workers) for n in names])
        t0 = time.monotonic()
        kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=manifests)
        applied = time.monotonic() - t0
        seconds = None
        while time.monotonic() - t0 < timeout:
            try:
                kind, event, obj = watches.events.get(timeout=1)
            except queue.Empty:
                continue
            progress.apply(kind, event, obj)
            if not any(progress.missing().values()):
                seconds = time.monotonic() - t0
                break
        done = time.time()
        usage = proc_status(proc.pid)
    finally:
        stop(proc)
        watches.stop()
    time.sleep(1)  # the audit log is written per request; let the last lines land
    requests = audit_requests(namespace, started, done)
    total = sum(requests.values())
    rss = usage["peak_rss_mb"]
    say(f"{side}: done in {seconds} s, {total} API requests, peak RSS {rss:.0f} MiB")
    return {
        "seconds": seconds,
        "timed_out": seconds is None,
        "missing_at_end": {k: v for k, v in progress.missing().items() if v},
        "apply_seconds": applied,
        "api_requests": total,
        "api_requests_per_job": total / jobs,
        "api_requests_by_kind": dict(requests.most_common()),
        "peak_rss_mb": usage["peak_rss_mb"],
        "cpu_seconds": usage["cpu_seconds"],
        "startup_to_workload_seconds": round(done - started - (seconds or 0), 2),
        "command": [Path(argv[0]).name, *argv[1:]],
        "log": str(log_path.relative_to(ROOT)),
    }


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def delete_namespace(namespace: str) -> None:
    t0 = time.monotonic()
    kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=300s")
    say(f"{namespace} deleted in {time.monotonic() - t0:.0f} s")


# --- report -------------------------------------------------------------------------------------

METHOD = {
    "seconds": "wall time from the start of `kubectl apply --server-side` of all MPIJobs until "
    "admin-user watches have seen every expected child (Service <job>, ConfigMap <job>-config, "
    "Secret <job>-ssh, Pods <job>-worker-0..N-1, batch Job <job>-launcher, each with a controller "
    "ownerReference to the MPIJob) and every MPIJob with condition Created=True; the operator "
    f"was started first and the workload applied {SETTLE_SECONDS:.0f} s after its "
    "mpi_operator_is_leader metric read 1",
    "api_requests": "kube-apiserver audit log (Metadata level, one event per audit ID): every "
    "request authenticated as the operator's own token user, all verbs (get, list, watch, create, "
    "update, patch, delete) and all resources (including Events, the leader-election Lease and "
    "the startup CRD check), received from the operator's process start until the workload was "
    "done; a watch counts once however long it streams, so watch events and bookmarks are not "
    "requests; requests per job = that count / jobs",
    "peak_rss_mb": "VmHWM from /proc/<pid>/status of the operator process (for ours, the "
    "Python process running `python -m mpijob run`), read when the workload was done, in MiB",
    "cpu_seconds": "utime + stime from /proc/<pid>/stat at the same moment",
}


def ratio(num: float | None, den: float | None) -> float | None:
    return None if not num or not den else num / den


def report(sides: dict[str, dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    ours, up = sides.get("ours", {}), sides.get("upstream", {})
    out: dict[str, Any] = {}
    for side, row in (("ours", ours), ("upstream", up)):
        out[f"{side}_seconds"] = row.get("seconds")
        out[f"{side}_api_requests_per_job"] = row.get("api_requests_per_job")
        out[f"{side}_peak_rss_mb"] = row.get("peak_rss_mb")
    out["ratios"] = {
        "seconds_upstream_over_ours": ratio(up.get("seconds"), ours.get("seconds")),
        "api_requests_ours_over_upstream": ratio(
            ours.get("api_requests_per_job"), up.get("api_requests_per_job")
        ),
        "peak_rss_ours_over_upstream": ratio(ours.get("peak_rss_mb"), up.get("peak_rss_mb")),
        "reading": "each ratio above 1 favours ours for time (upstream/ours) and is against "
        "ours for requests and memory (ours/upstream)",
    }
    return {**out, **meta, "method": METHOD, "runs": sides}


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    r = result["ratios"]
    rows = [
        (
            "seconds to all children + Created",
            "seconds",
            ".1f",
            r["seconds_upstream_over_ours"],
            "upstream/ours (>1: ours faster)",
        ),
        (
            "API requests per job",
            "api_requests_per_job",
            ".1f",
            r["api_requests_ours_over_upstream"],
            "ours/upstream (<1: ours fewer)",
        ),
        (
            "operator peak RSS (MiB)",
            "peak_rss_mb",
            ".0f",
            r["peak_rss_ours_over_upstream"],
            "ours/upstream (<1: ours smaller)",
        ),
    ]
    print(
        f"\n{result['jobs']} MPIJobs x {result['workers_per_job']} workers, "
        f"{result['nodes']} nodes, Kubernetes {result['kube_version']}, "
        f"upstream mpi-operator v{result['upstream_version']}"
    )
    print(f"{'':36}{'ours':>10}{'upstream':>10}{'ratio':>8}  reading")
    for label, key, spec, ratio_value, reading in rows:
        ours = result[f"ours_{key}"]
        up = result[f"upstream_{key}"]
        print(
            f"{label:36}{fmt(ours, spec):>10}{fmt(up, spec):>10}"
            f"{fmt(ratio_value, '.2f'):>8}  {reading}"
        )
    for side in SIDES:
        run = result["runs"].get(side)
        if not run:
            continue
        top = ", ".join(f"{k} {v}" for k, v in list(run["api_requests_by_kind"].items())[:8])
        print(f"\n{side}: {run['api_requests']} requests ({top}); CPU {run['cpu_seconds']:.1f} s")
        if run["timed_out"]:
            print(f"{side}: TIMED OUT; still missing {run['missing_at_end']}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="MPIJobs per operator (100)")
    parser.add_argument("--workers", type=int, default=8, help="workers per MPIJob (8)")
    parser.add_argument("--nodes", type=int, default=12, help="simulated nodes, 110 pods each")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per operator")
    parser.add_argument(
        "--only", choices=SIDES, action="append", help="run only this operator (repeatable)"
    )
    parser.add_argument(
        "--keep-cluster", action="store_true", help="leave the benchmark cluster running"
    )
    args = parser.parse_args()
    pods = args.jobs * (args.workers + 1)
    if pods > args.nodes * 110:
        parser.error(f"{pods} pods do not fit on {args.nodes} nodes of 110 pods")
    sides = args.only or list(SIDES)
    if "upstream" in sides:
        upstream_binary()
    t0 = time.monotonic()
    (BENCH / "logs").mkdir(parents=True, exist_ok=True)
    say(f"starting the benchmark cluster in {cluster.state_dir()}")
    run_cluster("down")  # a cluster left by an interrupted run has other objects in it
    users = [a for side in SIDES for a in ("--user", f"bench-{side}")]
    results: dict[str, dict[str, Any]] = {}
    try:
        run_cluster("up", "--nodes", str(args.nodes), "--audit-log", *users)
        kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
        state = cluster.State.load()
        assert state is not None
        version = json.loads(cluster.get(cluster.server_url(state) + "/version")[1])
        for side in sides:
            results[side] = run_side(side, args.jobs, args.workers, args.timeout)
            delete_namespace(f"bench-{side}")
    finally:
        if not args.keep_cluster:
            run_cluster("down")
    meta = {
        "jobs": args.jobs,
        "workers_per_job": args.workers,
        "nodes": args.nodes,
        "node_pod_capacity": 110,
        "kube_version": version["gitVersion"],
        "upstream_version": cluster.versions()["MPI_OPERATOR_VERSION"],
        "client_limits": LIMITS,
        "order": sides,
        "cpus": os.cpu_count(),
        "runtime_s": round(time.monotonic() - t0, 1),
    }
    result = report(results, meta)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nwrote {OUT.relative_to(ROOT)} in {meta['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
