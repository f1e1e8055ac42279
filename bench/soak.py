"""Soak: thousands of MPIJob lifecycles through one operator process, and whether it grows.

Run as ``make bench-soak`` (``.venv/bin/python -m bench.soak``; ``--help`` for the knobs). It
starts its own local cluster (``MPIJOB_CLUSTER_DIR=.bench/soak-cluster``, simulated nodes only),
one operator process scoped to one namespace, and keeps ``--in-flight`` jobs going: each MPIJob
(one launcher, one worker, on kwok nodes) is created, runs, succeeds (its launcher pod is told
to by ``mpijob.io/sim-succeed-after``) and is deleted, and a new one takes its place, until
``--jobs`` lifecycles are done.

At each checkpoint (``--checkpoints``, default after 1,000 and after ``--jobs``) it reads, with
no job in flight: the operator's resident memory (VmRSS, MiB) and the number of series its
/metrics serves. A long-running operator must not grow with the number of jobs it has ever
seen: the last checkpoint must be within ``--tolerance`` (10 %) of the first, or the run
fails. Writes ``.bench/soak.json``.

``--trace-memory`` runs the operator under ``bench.memtrace`` (tracemalloc, several times
slower; ``MEMTRACE_FRAMES=0`` for none), takes a reading at each checkpoint (objects alive, RSS
after ``malloc_trim``) and prints the allocations that grew most between the first and the
last: where to look when the RSS grows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from bench import memtrace, ours_env
from hack import cluster
from mpijob import keys

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
OUT = BENCH / "soak.json"
NAMESPACE = "soak"
# hack.cluster reads MPIJOB_CLUSTER_DIR on every call, so setting it here, after the import, holds.
os.environ.setdefault("MPIJOB_CLUSTER_DIR", str(BENCH / "soak-cluster"))
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"


def say(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def mpijob(name: str) -> dict[str, Any]:
    def replica(role: str, annotations: dict[str, str]) -> dict[str, Any]:
        container = {"name": role, "image": "mpioperator/mpi-pi:openmpi"}
        meta = {"annotations": annotations}
        return {"replicas": 1, "template": {"metadata": meta, "spec": {"containers": [container]}}}

    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": replica("launcher", {keys.SIM_SUCCEED_AFTER: "1s"}),
                "Worker": replica("worker", {}),
            },
        },
    }


def finished(job: dict[str, Any]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def series(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


class Soak:
    """Keeps ``in_flight`` jobs going; counts the lifecycles that ended Succeeded and deleted."""

    def __init__(self, api: client.ApiClient, in_flight: int) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.in_flight = in_flight
        self.created = 0
        self.done = 0
        self.failed: list[str] = []
        self.live: set[str] = set()
        self.cond = threading.Condition()

    def create(self) -> None:
        name = f"soak-{self.created}"
        self.created += 1
        self.live.add(name)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, mpijob(name))

    def watch(self, stop: threading.Event) -> None:
        """Deletes each job once it finished; a 410 or a closed stream restarts the watch."""
        while not stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NAMESPACE,
                    PLURAL,
                    timeout_seconds=30,
                ):
                    obj = ev["object"]
                    name = obj["metadata"]["name"]
                    outcome = finished(obj)
                    if ev["type"] == "DELETED" or not outcome or name not in self.live:
                        continue
                    self.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, NAMESPACE, PLURAL, name, propagation_policy="Background"
                    )
                    with self.cond:
                        self.live.discard(name)
                        self.done += 1
                        if outcome != "Succeeded":
                            self.failed.append(name)
                        self.cond.notify_all()
            except Exception as exc:  # the stream broke: list and watch again
                say(f"watch restarted: {exc!r}")

    def run_to(self, target: int, timeout: float) -> None:
        """Until ``target`` lifecycles are done, ``in_flight`` at a time."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.done < target:
                while len(self.live) < self.in_flight and self.created < target:
                    self.create()
                if time.monotonic() > deadline:
                    raise SystemExit(f"[soak] error: {self.done}/{target} done in {timeout:.0f} s")
                self.cond.wait(timeout=5)


def wait_namespace_empty(core: client.CoreV1Api, timeout: float = 300) -> None:
    """Until the deleted jobs' pods are gone: a checkpoint reads an idle operator."""
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(NAMESPACE, limit=1).items:
        if time.monotonic() > deadline:
            raise SystemExit("[soak] error: pods of deleted jobs are still there")
        time.sleep(1)


def start_cluster(env: dict[str, str]) -> client.ApiClient:
    """The soak's own cluster with the CRDs and the namespace; an API client for it."""
    subprocess.run(
        [sys.executable, "-m", "hack.cluster", "up", "--nodes", "4", "--real-nodes", "0"],
        cwd=ROOT,
        check=True,
        env=env,
    )
    state = cluster.State.load()
    assert state is not None
    cluster.kubectl(state, "apply", "--server-side", "-f", str(ROOT / "crds"))
    api = config.new_client_from_config(str(cluster.state_dir() / "kubeconfig"))
    try:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
    except ApiException as e:
        if e.status != 409:
            raise
    return api


def start_operator(port: int, trace: Path | None) -> subprocess.Popen[bytes]:
    """One operator process for the whole soak, once it serves /metrics; traced into ``trace``."""
    BENCH.mkdir(exist_ok=True)
    run = ["-m", "bench.memtrace", str(trace)] if trace else ["-m", "mpijob"]
    argv = [sys.executable, *run, "run", "--namespace", NAMESPACE]
    argv += ["--monitoring-port", str(port), "--health-port", "0", "--no-leader-elect"]
    kubeconfig = str(cluster.state_dir() / "kubeconfig")
    with (BENCH / "soak-operator.log").open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=ours_env(KUBECONFIG=kubeconfig),
        )
    deadline = time.monotonic() + 120
    while True:
        try:
            series(port)
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("[soak] error: the operator did not serve /metrics") from None
            time.sleep(0.5)


def snapshot(proc: subprocess.Popen[bytes], trace: Path, n: int) -> Path:
    """The operator's ``n``-th memory reading (``bench.memtrace`` writes it on SIGUSR2)."""
    path = trace / f"{n}.json"
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 300
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"[soak] error: no memory snapshot {path}")
        time.sleep(1)
    return path


def soak_run(
    api: client.ApiClient, proc: subprocess.Popen[bytes], port: int, checkpoints: list[int],
    in_flight: int, trace: Path | None,
) -> tuple[list[dict[str, Any]], list[str], list[Path]]:  # fmt: skip
    """The lifecycles, with a reading at each checkpoint: the readings, the failed jobs and, when
    traced, a memory snapshot per checkpoint."""
    soak = Soak(api, in_flight)
    stop = threading.Event()
    threading.Thread(target=soak.watch, args=(stop,), daemon=True).start()
    readings: list[dict[str, Any]] = []
    snapshots: list[Path] = []
    t0 = time.monotonic()
    try:
        for target in checkpoints:
            soak.run_to(target, timeout=max(600.0, target * 2.0))
            wait_namespace_empty(client.CoreV1Api(api))
            time.sleep(5)  # the operator's last status writes and Events for the deleted jobs
            reading = {
                "lifecycles": soak.done,
                "seconds": round(time.monotonic() - t0, 1),
                "rss_mib": round(rss_mib(proc.pid), 1),
                "series": series(port),
            }
            readings.append(reading)
            if trace:
                snapshots.append(snapshot(proc, trace, len(snapshots)))
                reading["rss_trimmed_mib"] = json.loads(snapshots[-1].read_text())[
                    "rss_trimmed_mib"
                ]
                say(f"  RSS after malloc_trim: {reading['rss_trimmed_mib']:.1f} MiB")
            say(
                f"{reading['lifecycles']} lifecycles in {reading['seconds']} s: "
                f"RSS {reading['rss_mib']} MiB, {reading['series']} metric series"
            )
    finally:
        stop.set()
    return readings, soak.failed, snapshots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="lifecycles in all (10,000)")
    parser.add_argument(
        "--checkpoints",
        type=lambda t: [int(x) for x in t.split(",")],
        default=None,
        help="lifecycles after which to read RSS and series (default 1000,JOBS)",
    )
    parser.add_argument("--in-flight", type=int, default=20, help="jobs at once (20)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed growth (0.10)")
    parser.add_argument(
        "--trace-memory", action="store_true", help="tracemalloc the operator (slow; diagnosis)"
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    checkpoints = args.checkpoints or sorted({min(1000, args.jobs), args.jobs})

    env = {**os.environ, "REAL_NODES": "0"}
    api = start_cluster(env)
    port = cluster.free_port()
    trace = BENCH / "soak-memtrace" if args.trace_memory else None
    if trace:
        shutil.rmtree(trace, ignore_errors=True)
    proc = start_operator(port, trace)
    try:
        readings, failed, snapshots = soak_run(api, proc, port, checkpoints, args.in_flight, trace)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if not args.keep_cluster:
            down = [sys.executable, "-m", "hack.cluster", "down"]
            subprocess.run(down, cwd=ROOT, env=env, check=False)

    first, last = readings[0], readings[-1]
    growth = {
        "rss": last["rss_mib"] / first["rss_mib"] - 1,
        "series": last["series"] / first["series"] - 1,
    }
    result = {
        "readings": readings,
        "growth": {k: round(v, 4) for k, v in growth.items()},
        "failed_jobs": failed,
        "in_flight": args.in_flight,
        "tolerance": args.tolerance,
        "cpus": os.cpu_count(),
        "load_at_end": os.getloadavg(),
    }
    OUT.write_text(json.dumps(result, indent=2))
    say(
        f"growth from {first['lifecycles']} to {last['lifecycles']} lifecycles: RSS "
        f"{growth['rss']:+.1%}, series {growth['series']:+.1%} (allowed {args.tolerance:.0%}); "
        f"{len(failed)} job(s) did not succeed; {OUT}"
    )
    if len(snapshots) > 1:
        say("objects alive whose number grew most between the first and the last checkpoint:")
        first_reading, last_reading = (
            json.loads(p.read_text()) for p in (snapshots[0], snapshots[-1])
        )
        print("\n".join(memtrace.types_grown(first_reading, last_reading)), file=sys.stderr)
    traced = [p.with_suffix(".snap") for p in snapshots if p.with_suffix(".snap").exists()]
    if len(traced) > 1:
        say("traced memory that grew most between the first and the last traced checkpoint:")
        print("\n".join(memtrace.growth(traced[0], traced[-1])), file=sys.stderr)
    ok = all(abs(v) <= args.tolerance for v in growth.values()) and not failed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
