"""Reconcile benchmark: 100 MPIJobs with 8 workers each, our operator against upstream's.

Run as ``make bench`` (``.venv/bin/python -m bench.reconcile``; ``--help`` for the knobs). It
starts its own local cluster (``hack/cluster.py`` with ``MPIJOB_CLUSTER_DIR=.bench/cluster``, an
audit log and one token user per run), so the test cluster is never touched, and stops it at
the end. Upstream's mpi-operator is built into the binary cache first if it is missing
(``hack/build-bins.sh mpi-operator``).

Three runs, one after the other, on the same cluster with the same workload, each operator
scoped to its own namespace with the same client limits (QPS 100, burst 200, threadiness 8):
``ours``; ``upstream`` (v0.8.2, otherwise default flags); ``upstream-fastqueue``, the same with
its work-queue rate limit raised (default 10 adds/s after a burst of 100, counting every pod
event; ours has no such limit). For each run:

1. start the operator and wait until ``mpi_operator_is_leader`` is 1 on its /metrics, then 2 s;
2. apply the MPIJobs (``kubectl apply --server-side``) and time, through admin-user watches,
   until every job has its Service, ConfigMap, Secret, worker pods and launcher Job (each
   controlled by the MPIJob) and a Created condition that is True;
3. read the operator's peak RSS (VmHWM) and CPU time from /proc, stop it, and count its API
   requests in the API server's audit log;
4. delete the namespace, so the next run starts from the same empty cluster.

Prints a table and writes ``.bench/reconcile.json``; operator logs go to ``.bench/logs/``.

``--scale`` (``make bench-scale``) is the scale run: on one cluster of 200 simulated nodes,
``ours`` and ``upstream-fastqueue`` with 100 MPIJobs, then both with 1,000 MPIJobs (8 workers
each, so 9,000 pods with the launchers), one after the other in one invocation. Besides the
per-run figures it reports each operator's peak RSS per 1,000 pods held: the slope between the
two scales, (RSS at 1,000 jobs - RSS at 100 jobs) / (pods held at 1,000 - pods held at 100),
where pods held is how many pods of the namespace existed when the workload was done. It writes
``.bench/reconcile-scale.json``.
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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench import ours_env
from bench import profile as profiling
from hack import cluster
from hack.common import free_port

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
OUT = BENCH / "reconcile.json"
SCALE_OUT = BENCH / "reconcile-scale.json"
SCALE_NODES = 200
SCALE_JOBS = (100, 1000)
SCALE_RUNS = ("ours", "upstream-fastqueue")
# hack.cluster reads MPIJOB_CLUSTER_DIR on every call, so setting it here, after the import, holds.
os.environ.setdefault("MPIJOB_CLUSTER_DIR", str(BENCH / "cluster"))

LIMITS = {"--kube-api-qps": "100", "--kube-api-burst": "200", "--threadiness": "8"}
FAST_QUEUE = {"--controller-queue-rate-limit": "10000", "--controller-queue-burst": "100000"}
RUNS: dict[str, dict[str, str]] = {"ours": {}, "upstream": {}, "upstream-fastqueue": FAST_QUEUE}
SETTLE_SECONDS = 2.0
TAIL_SECONDS = 10.0  # after the workload is done: what each operator still sends (Events lag)
POD_CAPACITY = 110  # per simulated node (hack/cluster.py)
UPSTREAM_HEALTH_PORT = 8080  # fixed in upstream's binary, on every interface
WATCH_PATHS = {
    "services": "/api/v1/namespaces/{ns}/services",
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "mpijobs": "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
}
METADATA = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def kubectl(*args: str, input: str | None = None) -> str:
    return cluster.kubectl(cluster.State.load(), *args, input=input)  # type: ignore[arg-type]


def run_cluster(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hack.cluster", *args], cwd=ROOT, check=True)


# --- workload -----------------------------------------------------------------------------------


def replica(replicas: int, name: str, command: list[str]) -> dict[str, Any]:
    container = {"name": name, "image": "mpioperator/mpi-pi:openmpi", "command": command}
    return {"replicas": replicas, "template": {"spec": {"containers": [container]}}}


def mpijob(name: str, workers: int) -> dict[str, Any]:
    """Upstream's pi example, as users apply it."""
    launcher = ["mpirun", "-n", str(workers), "/home/mpiuser/pi"]
    worker = ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "mpiReplicaSpecs": {
                "Launcher": replica(1, "mpi-launcher", launcher),
                "Worker": replica(workers, "mpi-worker", worker),
            },
        },
    }


def expected_children(jobs: list[str], workers: int) -> dict[str, dict[str, str]]:
    """Child name -> owning MPIJob, per kind (upstream's names)."""
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
    """Which expected children exist and which jobs are Created, updated by watch events."""

    expected: dict[str, dict[str, str]]
    jobs: set[str]
    have: dict[str, set[str]] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)
    """Every pod of the namespace (the launchers' too): the pods the operator's caches hold."""

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if event == "SYNC":  # a fresh list replaces what was known
            self.have[kind] = set()
            if kind == "pods":
                self.pods = set()
            for item in obj["items"]:
                self.apply(kind, "ADDED", item)
            return
        name = obj.get("metadata", {}).get("name", "")
        if kind == "pods":
            (self.pods.discard if event == "DELETED" else self.pods.add)(name)
        if kind == "mpijobs":
            ok = name in self.jobs and created(obj)
        else:
            owner = controller_job(obj)
            ok = owner is not None and self.expected[kind].get(name) == owner
        have = self.have.setdefault(kind, set())
        if ok and event != "DELETED":
            have.add(name)
        else:
            have.discard(name)

    def missing(self) -> dict[str, int]:
        wanted = {**{k: len(v) for k, v in self.expected.items()}, "mpijobs": len(self.jobs)}
        short = {k: n - len(self.have.get(k, ())) for k, n in wanted.items()}
        return {k: n for k, n in short.items() if n}


class Watches:
    """Admin-user list-then-watch of one namespace's objects, as an informer does.

    Feeds one queue of (arrival on the monotonic clock, kind, type, object). A watch the API
    server ends (it closes watchers that fall behind) resumes from the last resourceVersion, or
    relists if that is too old. ``paths`` adds kinds to :data:`WATCH_PATHS`; the kinds in
    ``whole`` are read whole, the others as metadata only.
    """

    def __init__(
        self,
        namespace: str,
        kinds: Iterable[str] = WATCH_PATHS,
        paths: Mapping[str, str] | None = None,
        whole: Iterable[str] = ("mpijobs",),
    ) -> None:
        self.events: queue.Queue[tuple[float, str, str, dict[str, Any]]] = queue.Queue()
        self._streams: dict[str, Any] = {}
        self._stopped = threading.Event()
        self._whole = frozenset(whole)
        all_paths = {**WATCH_PATHS, **(paths or {})}
        self._server = cluster.server_url(cluster.State.load())  # type: ignore[arg-type]
        self._ctx = ssl.create_default_context(
            cafile=str(cluster.state_dir() / "pki/apiserver.crt")
        )
        for kind in kinds:
            path = all_paths[kind]
            url = self._server + path.format(ns=namespace)
            threading.Thread(target=self._follow, args=(kind, url), daemon=True).start()

    def _open(self, url: str, accept: str) -> Any:
        headers = {"Authorization": f"Bearer {cluster.TOKEN}", "Accept": accept}
        request = urllib.request.Request(url, headers=headers)
        for _ in range(60):
            try:
                return urllib.request.urlopen(request, context=self._ctx, timeout=3600)
            except urllib.error.HTTPError as e:
                if e.code != 429:  # 429: a fresh API server's watch cache is still filling
                    raise
                time.sleep(1)
        raise SystemExit(f"[bench] error: the API server kept refusing {url}")

    def _follow(self, kind: str, url: str) -> None:
        # Metadata is enough for children; MPIJobs are read whole for their conditions.
        listing, watching = (
            ("application/json",) * 2
            if kind in self._whole
            else (METADATA.format("List"), METADATA.format(""))
        )
        rv = ""
        while not self._stopped.is_set():
            try:
                rv = self._list_and_watch(kind, url, listing, watching, rv)
            except Exception:  # stopped, or a dropped connection: the loop decides
                time.sleep(0.2)

    def _list_and_watch(self, kind: str, url: str, listing: str, watching: str, rv: str) -> str:
        """List if ``rv`` is empty, then watch until the stream ends; returns where to resume."""
        if not rv:
            with self._open(url, listing) as r:
                body = json.load(r)
            rv = body["metadata"]["resourceVersion"]
            self.events.put((time.monotonic(), kind, "SYNC", {"items": body.get("items") or []}))
        query = f"?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
        with self._open(url + query, watching) as stream:
            self._streams[kind] = stream
            for line in stream:
                event = json.loads(line)
                if event["type"] == "ERROR":  # 410 Gone: relist
                    return ""
                rv = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self.events.put((time.monotonic(), kind, event["type"], event["object"]))
        return rv

    def stop(self) -> None:
        self._stopped.set()
        # close() would wait for the reader's buffer lock; a shutdown ends its blocked read.
        for stream in self._streams.values():
            with contextlib.suppress(Exception):
                stream.fp.raw._sock.shutdown(socket.SHUT_RDWR)


# --- operators ----------------------------------------------------------------------------------


def upstream_binary() -> Path:
    version = cluster.versions()["MPI_OPERATOR_VERSION"]
    path = cluster.cache_dir() / "bin" / f"mpi-operator-v{version}" / "mpi-operator"
    if not path.exists():
        say(f"upstream mpi-operator v{version} is missing; building it (hack/build-bins.sh)")
        subprocess.run([str(ROOT / "hack" / "build-bins.sh"), "mpi-operator"], check=True)
    return path


def operator_argv(run: str, namespace: str, port: int, kubeconfig: Path) -> list[str]:
    flags = {"--namespace": namespace, "--lock-namespace": namespace}
    flags |= {"--monitoring-port": str(port), **LIMITS, **RUNS[run]}
    args = [a for pair in flags.items() for a in pair]
    if run == "ours":
        # No liveness probe (nothing probes it here): its default port stays free.
        return [sys.executable, "-m", "mpijob", "run", *args, "--health-port", "0"]
    return [str(upstream_binary()), "--kubeConfig", str(kubeconfig), *args]


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def launch(
    argv: list[str], port: int, env: dict[str, str], log_path: Path, timeout: float = 120.0
) -> subprocess.Popen[bytes]:
    """Start an operator (ours or upstream's), its output to ``log_path``; return it once its
    /metrics on ``port`` says it leads. One that exits or takes longer than ``timeout`` ends the
    benchmark with the tail of its log."""
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    while not leading(port):
        if proc.poll() is not None or time.monotonic() - started > timeout:
            stop(proc)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(f"[bench] error: {argv[0]} did not start:\n{tail}")
        time.sleep(0.1)
    return proc


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


def proc_usage(pid: int) -> dict[str, float]:
    """Peak RSS (VmHWM, MiB) and CPU seconds (user + system) of a live process."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024,
        "cpu_seconds": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"),
    }


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def audit_requests(user: str, since: float, until: float) -> Counter[str]:
    """Requests by ``user`` received in [since, until], as 'verb resource[/subresource]'.

    One audit ID is one request: a watch counts once however long it streams, and its events
    and bookmarks are not requests. The log's rotated parts (``audit-<time>.log``, every
    100 MB) are read too.
    """
    seen: dict[str, str] = {}
    needle = f'"username":"{user}"'
    for path in sorted((cluster.state_dir() / "logs").glob("audit*.log")):
        if path.stat().st_mtime >= since:  # a part rotated before ``since`` holds nothing later
            _audit_lines(path, needle, since, until, seen)
    return Counter(seen.values())


def _audit_lines(path: Path, needle: str, since: float, until: float, seen: dict[str, str]) -> None:
    with path.open() as log:
        for line in log:
            if needle not in line:
                continue
            event = json.loads(line)
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if since <= received <= until:
                ref = event.get("objectRef") or {}
                what = ref.get("resource") or event["requestURI"].split("?")[0]
                what += f"/{ref['subresource']}" if ref.get("subresource") else ""
                seen[event["auditID"]] = f"{event['verb']} {what}"


# --- one run ------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy samples ``pid`` into ``out`` (raw stacks) for the block, then its top costs are
    printed; nothing when ``out`` is None."""
    if out is None:
        yield
        return
    argv = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid)]
    # --nonblocking: the operator is not paused for each sample, so its timings stay its own.
    argv += ["--format", "raw", "--rate", "100", "--nonblocking", "--output", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        spy.wait(timeout=60)
    say("\n".join(profiling.top(out)))


def run_once(
    run: str, jobs: int, workers: int, timeout: float, tag: str = "", profile: Path | None = None
) -> dict[str, Any]:
    namespace = f"bench-{run}"  # also the operator's user name, and its Lease's namespace
    kubectl("create", "namespace", namespace)
    kubeconfig = cluster.state_dir() / f"kubeconfig-{namespace}"
    port = free_port()
    argv = operator_argv(run, namespace, port, kubeconfig)
    if run != "ours" and port_taken(UPSTREAM_HEALTH_PORT):
        raise SystemExit(f"[bench] error: port {UPSTREAM_HEALTH_PORT} is taken; upstream needs it")
    # Upstream: KUBECONFIG beats --kubeConfig. Ours: as its image runs it.
    env = ours_env() if run == "ours" else dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig)
    log_path = BENCH / "logs" / f"{run}{tag}.log"
    names = [f"pi-{i:03d}" for i in range(jobs)]
    progress = Progress(expected_children(names, workers), set(names))
    watches = Watches(namespace)
    started = time.time()
    proc = launch(argv, port, env, log_path)
    try:
        time.sleep(SETTLE_SECONDS)
        at_apply = proc_usage(proc.pid)["cpu_seconds"]
        say(
            f"{run}: leading after {time.time() - started:.1f} s, {at_apply:.2f} s of CPU; "
            f"applying {jobs} MPIJobs"
        )
        manifests = yaml.safe_dump_all([mpijob(n, workers) for n in names])
        with profiled(proc.pid, profile):
            applying, t0 = time.time(), time.monotonic()
            kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=manifests)
            applied = time.monotonic() - t0
            seconds = None
            while seconds is None and time.monotonic() - t0 < timeout:
                with contextlib.suppress(queue.Empty):
                    arrival, *event = watches.events.get(timeout=1)
                    progress.apply(*event)
                    if not progress.missing():
                        seconds = arrival - t0
            done = time.time()
            usage = proc_usage(proc.pid)
            time.sleep(TAIL_SECONDS)
            tail = time.time()
            later = proc_usage(proc.pid)
    finally:
        stop(proc)
        watches.stop()
    time.sleep(1)  # let the audit lines of the last responses land
    requests = audit_requests(namespace, started, done)
    total = sum(requests.values())
    with_tail = sum(audit_requests(namespace, started, tail).values())
    shown = "timed out" if seconds is None else f"{seconds:.1f} s"
    say(
        f"{run}: {shown}, {total} API requests, peak RSS {usage['peak_rss_mb']:.0f} MiB, "
        f"CPU {usage['cpu_seconds']:.1f} s"
    )
    return {
        "seconds": seconds,
        "missing_at_end": progress.missing(),
        "apply_seconds": round(applied, 2),
        "operator_start_to_apply_seconds": round(applying - started, 2),
        "api_requests": total,
        "api_requests_per_job": total / jobs,
        "api_requests_by_kind": dict(requests.most_common()),
        "api_requests_per_job_with_tail": with_tail / jobs,
        "cpu_seconds_with_tail": later["cpu_seconds"],
        "cpu_seconds_at_apply": at_apply,
        "cpu_seconds_after_start": usage["cpu_seconds"] - at_apply,
        "pods_held": len(progress.pods),
        **usage,
        "command": [Path(argv[0]).name, *argv[1:]],
        "log": str(log_path.relative_to(ROOT)),
    }


# --- report -------------------------------------------------------------------------------------

METHOD = {
    "seconds": "wall time from the start of `kubectl apply --server-side` of all MPIJobs until "
    "admin-user list+watch streams had seen every expected child (Service <job>, ConfigMap "
    "<job>-config, Secret <job>-ssh, Pods <job>-worker-0..N-1, batch/v1 Job <job>-launcher, each "
    "with a controller ownerReference to its MPIJob) and every MPIJob with condition "
    "Created=True; the operator was started before, and the workload applied "
    f"{SETTLE_SECONDS:.0f} s after its mpi_operator_is_leader metric read 1",
    "api_requests_per_job": "kube-apiserver audit log (policy: Metadata level for every request, "
    "RequestReceived stage omitted), counting distinct audit IDs authenticated as the run's own "
    "token user (bench-<run>, in system:masters): all verbs (get, list, watch, create, update, "
    "patch, delete) on all resources, Events, the leader-election Lease and discovery included, "
    "received from the operator process's start until the workload was done; a watch is one "
    "request however long it streams (its events and bookmarks are not requests); divided by "
    "the number of jobs",
    "peak_rss_mb": "VmHWM of the operator process from /proc/<pid>/status (ours: the Python "
    "process running `python -m mpijob run`), read when the workload was done, in MiB",
    "cpu_seconds": "utime + stime of the operator process from /proc/<pid>/stat, same moment",
    "cpu_seconds_at_apply": "the same, read just before the workload was applied: the start-up "
    f"(process start to leading, plus the {SETTLE_SECONDS:.0f} s wait)",
    "cpu_seconds_after_start": "cpu_seconds - cpu_seconds_at_apply: the workload's own CPU, "
    "without the start-up",
    "with_tail": f"api_requests_per_job_with_tail and cpu_seconds_with_tail: the same counts "
    f"{TAIL_SECONDS:.0f} s after the workload was done (the operator still running): Events "
    "and status writes that trail the children are counted too, for both operators",
    "rss_mb_per_1000_pods": "scale run only: (peak RSS at 1,000 jobs - peak RSS at 100 jobs) / "
    "(pods held at 1,000 jobs - pods held at 100 jobs) x 1,000, per operator; pods held: the "
    "pods of the run's namespace that the admin watch had seen and not seen deleted when the "
    "workload was done",
    "fairness": "same cluster and workload, runs one after the other with the namespace deleted "
    "in between, each operator scoped to its own namespace (--namespace, --lock-namespace) "
    "with --kube-api-qps 100 --kube-api-burst 200 --threadiness 8 and leader election on",
}
KEYS = {"ours": "ours", "upstream": "upstream", "upstream-fastqueue": "upstream_fastqueue"}
FIGURES = (
    "seconds",
    "api_requests_per_job",
    "peak_rss_mb",
    "cpu_seconds",
    "api_requests_per_job_with_tail",
    "cpu_seconds_with_tail",
    "cpu_seconds_at_apply",
    "cpu_seconds_after_start",
)


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def report(runs: dict[str, dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run, key in KEYS.items():
        for figure in FIGURES:
            out[f"{key}_{figure}"] = runs.get(run, {}).get(figure)
    ratios: dict[str, Any] = {}
    for peer in ("upstream", "upstream_fastqueue"):
        ratios[f"seconds_{peer}_over_ours"] = ratio(out[f"{peer}_seconds"], out["ours_seconds"])
        for figure in FIGURES[1:]:
            ratios[f"{figure}_ours_over_{peer}"] = ratio(
                out[f"ours_{figure}"], out[f"{peer}_{figure}"]
            )
    ratios["reading"] = (
        "seconds: upstream/ours, above 1 means ours is faster; requests, memory and CPU: "
        "ours/upstream, below 1 means ours uses fewer"
    )
    return {**out, "ratios": ratios, **meta, "method": METHOD, "runs": runs}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


ROWS = (
    ("seconds to children+Created", "seconds", ".1f", "seconds_{}_over_ours"),
    ("API requests per job", "api_requests_per_job", ".1f", "api_requests_per_job_ours_over_{}"),
    ("operator peak RSS (MiB)", "peak_rss_mb", ".0f", "peak_rss_mb_ours_over_{}"),
    ("operator CPU (s)", "cpu_seconds", ".1f", "cpu_seconds_ours_over_{}"),
    (
        "of which start-up CPU (s)",
        "cpu_seconds_at_apply",
        ".2f",
        "cpu_seconds_at_apply_ours_over_{}",
    ),
    (
        "CPU after start-up (s)",
        "cpu_seconds_after_start",
        ".1f",
        "cpu_seconds_after_start_ours_over_{}",
    ),
    (
        f"requests/job, +{TAIL_SECONDS:.0f} s",
        "api_requests_per_job_with_tail",
        ".1f",
        "api_requests_per_job_with_tail_ours_over_{}",
    ),
    (
        f"CPU (s), +{TAIL_SECONDS:.0f} s",
        "cpu_seconds_with_tail",
        ".1f",
        "cpu_seconds_with_tail_ours_over_{}",
    ),
)


def print_table(result: dict[str, Any]) -> None:
    r = result["ratios"]
    print(
        f"\n{result['jobs']} MPIJobs x {result['workers_per_job']} workers on {result['nodes']} "
        f"nodes, Kubernetes {result['kube_version']}, {result['cpus']} CPUs, upstream "
        f"mpi-operator v{result['upstream_version']}"
    )
    print(f"{'':30}{'ours':>8}{'upstream':>10}{'ratio':>7}{'upstream*':>11}{'ratio*':>8}")
    for label, figure, spec, ratio_key in ROWS:
        ours, up, fast = (fmt(result[f"{k}_{figure}"], spec) for k in KEYS.values())
        up_r, fast_r = (
            fmt(r[ratio_key.format(p)], ".2f") for p in ("upstream", "upstream_fastqueue")
        )
        print(f"{label:30}{ours:>8}{up:>10}{up_r:>7}{fast:>11}{fast_r:>8}")
    print(
        "ratio: upstream/ours for seconds (>1: ours faster), ours/upstream for requests, "
        "memory and CPU (<1: ours uses less).\nupstream*: upstream with "
        + " ".join(a for pair in FAST_QUEUE.items() for a in pair)
        + " (defaults 10 and 100)."
    )
    for run, row in result["runs"].items():
        top = ", ".join(f"{k} {v}" for k, v in list(row["api_requests_by_kind"].items())[:9])
        print(f"\n{run}: {row['api_requests']} requests: {top}")
        if row["missing_at_end"]:
            print(f"{run}: TIMED OUT, still missing {row['missing_at_end']}")


def slopes(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float | None]:
    """Peak RSS per 1,000 pods held, per run kind, between two scales."""
    out: dict[str, float | None] = {}
    for run in SCALE_RUNS:
        a, b = small["runs"].get(run), large["runs"].get(run)
        pods = (b or {}).get("pods_held", 0) - (a or {}).get("pods_held", 0)
        out[KEYS[run]] = (
            (b["peak_rss_mb"] - a["peak_rss_mb"]) / pods * 1000 if a and b and pods else None
        )
    return out


def bench(
    runs: list[str], jobs: int, workers: int, timeout: float, tag: str = "", profile: bool = False
) -> dict[str, dict[str, Any]]:
    """Each run in turn on the running cluster, its namespace deleted after it."""
    results = {}
    for run in runs:
        to = BENCH / f"profile-{run}{tag}.txt" if profile and run == "ours" else None
        results[run] = run_once(run, jobs, workers, timeout, tag, to)
        t = time.monotonic()
        kubectl("delete", "namespace", f"bench-{run}", "--wait=true", f"--timeout={timeout:.0f}s")
        say(f"bench-{run} deleted in {time.monotonic() - t:.0f} s")
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="MPIJobs per run (default 100)")
    parser.add_argument("--workers", type=int, default=8, help="workers per MPIJob (default 8)")
    parser.add_argument("--nodes", type=int, default=12, help="simulated nodes (default 12)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per run")
    parser.add_argument("--only", choices=RUNS, action="append", help="run only this (repeatable)")
    parser.add_argument(
        "--scale",
        action="store_true",
        help=f"the scale run: {SCALE_NODES} nodes, {' then '.join(map(str, SCALE_JOBS))} jobs, "
        f"{' and '.join(SCALE_RUNS)} (--jobs, --nodes and --only are then ignored)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample our operator with py-spy during the workload: .bench/profile-ours*.txt",
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.scale:
        args.nodes, scales, runs = SCALE_NODES, list(SCALE_JOBS), list(SCALE_RUNS)
        args.timeout = max(args.timeout, 1200)
    else:
        scales, runs = [args.jobs], args.only or list(RUNS)
    if max(scales) * (args.workers + 1) > args.nodes * POD_CAPACITY:
        raise SystemExit(
            f"[bench] error: {max(scales) * (args.workers + 1)} pods do not fit on "
            f"{args.nodes} nodes (--nodes)"
        )
    if any(run != "ours" for run in runs):
        upstream_binary()
    t0 = time.monotonic()
    (BENCH / "logs").mkdir(parents=True, exist_ok=True)
    say(f"starting the benchmark cluster in {cluster.state_dir()}")
    run_cluster("down")  # a cluster left by an interrupted run still holds its objects
    by_scale: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        users = [a for run in RUNS for a in ("--user", f"bench-{run}")]
        run_cluster("up", "--nodes", str(args.nodes), "--real-nodes", "0", "--audit-log", *users)
        kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
        server = cluster.server_url(cluster.State.load())  # type: ignore[arg-type]
        version = json.loads(cluster.get(server + "/version")[1])["gitVersion"]
        for jobs in scales:
            tag = f"-{jobs}" if args.scale else ""
            by_scale[jobs] = bench(runs, jobs, args.workers, args.timeout, tag, args.profile)
    finally:
        if not args.keep_cluster:
            run_cluster("down")
    meta = {
        "workers_per_job": args.workers,
        "nodes": args.nodes,
        "node_pod_capacity": POD_CAPACITY,
        "kube_version": version,
        "upstream_version": cluster.versions()["MPI_OPERATOR_VERSION"],
        "client_limits": LIMITS,
        "cpus": os.cpu_count(),
    }
    results = {jobs: report(runs_, {"jobs": jobs, **meta}) for jobs, runs_ in by_scale.items()}
    for result in results.values():
        print_table(result)
    runtime = round(time.monotonic() - t0, 1)
    if args.scale:
        small, large = (results[j] for j in SCALE_JOBS)
        slope = slopes(small, large)
        print(
            "\npeak RSS per 1,000 pods held (slope between the scales): "
            + ", ".join(f"{k} {fmt(v, '.1f')} MiB" for k, v in slope.items())
        )
        doc = {
            "scales": {str(j): r for j, r in results.items()},
            "rss_mb_per_1000_pods": slope,
            "rss_mb_per_1000_pods_ours_over_upstream_fastqueue": ratio(
                slope["ours"], slope["upstream_fastqueue"]
            ),
            "runtime_seconds": runtime,
        }
        out = SCALE_OUT
    else:
        doc, out = {**results[args.jobs], "runtime_seconds": runtime}, OUT
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)} in {runtime:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
