#!/usr/bin/env python3
"""Fail-over: two replicas through leadership changes, and the API server restarted.

On its own local cluster (4 simulated DGX-1 V100 nodes, 32 GPUs, the API server's audit log on),
two operator replicas with leader election, each reaching the API server through a relay of its
own that the benchmark can cut (``hack.relay.Partition``: its requests hang), each restarted
1 s after it exits (as the kubelet would).

``make bench-failover``: ``--changes`` leadership changes (default 20), the leader in turn
frozen (SIGSTOP for 25 s, then resumed), SIGKILLed, and cut off from the API server (25 s, then
healed), while ``--jobs`` topology jobs (default 60, the kill storm's shapes, several times the
32 GPUs in all) are created three by three. Reports: jobs Succeeded, duplicate children, the
most PlacementDecisions and live worker pods ever seen on one GPU, writes by a replica that did
not hold the Lease (the audit log), and the time from each fault to the new leader's first write
(median, p95). Writes ``.bench/failover.json``.

``make bench-apiserver-restart``: ``--restarts`` times (default 3), with topology jobs in
flight, the API server is SIGKILLed and started again 20 s later; as soon as it answers, a job
is created: the seconds until all of its pods exist and until it is ``Created`` (each run, and
the median). Writes ``.bench/apiserver-restart.json``.

Each replica names itself in its User-Agent (``mpijob-operator/replica-<i>_<uuid>``), so the
audit log tells them apart. A benchmark, not a CI test (minutes of a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from bench import ours_env
from bench.killstorm import SHAPES, children, restart_apiserver, succeeded
from hack import cluster as local  # the local control plane
from hack.relay import Partition
from mpijob import keys
from tests.support import audit
from tests.support.gpu_sampler import GpuSampler
from tests.support.jobs import mpijob

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_DIR = ROOT / ".bench" / "cluster-failover"
NAMESPACE = "failover"
FAULT_SECONDS = 25.0
FAULTS = ("freeze", "kill", "partition")


def topology_job(name: str, shape: tuple[int, int], succeed_after: str = "5s") -> dict[str, Any]:
    workers, gpus = shape
    return mpijob(
        name,
        workers=workers,
        gpus=gpus,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: succeed_after},
        run_policy={"cleanPodPolicy": "Running"},
    )


class Replica:
    """One operator process behind its own relay; started again 1 s after it exits, unless
    the benchmark is stopping."""

    def __init__(self, index: int, kubeconfig: Path, target: tuple[str, int]) -> None:
        self.name = f"replica-{index}"
        self.relay = Partition(target)
        port = self.relay.start()
        conf = yaml.safe_load(kubeconfig.read_text())
        conf["clusters"][0]["cluster"]["server"] = f"https://{target[0]}:{port}"
        self.kubeconfig = CLUSTER_DIR / f"kubeconfig-{self.name}"
        self.kubeconfig.write_text(yaml.safe_dump(conf))
        self.log = (CLUSTER_DIR / "logs" / f"operator-{self.name}.log").open("ab")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.stopping = False
        self.watch = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> None:
        argv = [sys.executable, "-m", "mpijob", "run", "-n", NAMESPACE, "--leader-elect"]
        argv += ["--lock-namespace", NAMESPACE, "--monitoring-port", "0", "--health-port", "0"]
        argv += ["--kube-api-qps", "0"]
        argv += ["--kubeconfig", str(self.kubeconfig)]
        env = ours_env(POD_NAME=self.name)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        if not self.watch.is_alive():
            self.watch.start()

    def _supervise(self) -> None:
        while not self.stopping:
            if self.proc is not None and self.proc.poll() is not None:
                time.sleep(1)
                if not self.stopping:
                    self.start()
            time.sleep(0.2)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.stopping = True
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def holder(coordination: client.CoordinationV1Api) -> str:
    try:
        lease = coordination.read_namespaced_lease("mpijob-operator", NAMESPACE, _request_timeout=5)
    except Exception:
        return ""
    return str(lease.spec.holder_identity or "")


def wait_for(condition: Any, timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def start_cluster() -> Path:
    env = {**os.environ, "MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
    up = [sys.executable, "-m", "hack.cluster", "up", "--nodes", "4", "--real-nodes", "0"]
    subprocess.run([*up, "--audit-log"], cwd=ROOT, check=True, env=env)
    kubeconfig = CLUSTER_DIR / "kubeconfig"
    kubectl = [str(local.binaries()["kubectl"]), "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True)
    crds = ["crd/mpijobs.kubeflow.org", "crd/placementdecisions.mpijob.io"]
    subprocess.run([*kubectl, "wait", "--for=condition=Established", *crds], check=True)
    gone = [*kubectl, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"]
    subprocess.run(gone, check=True)
    return kubeconfig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_change(
    fault: str, by_name: dict[str, Replica], coordination: client.CoordinationV1Api
) -> dict[str, Any]:
    """The leader frozen, killed or cut off; returns when another holds the Lease and the
    fault is over (the frozen one resumed, the cut one healed)."""
    wait_for(lambda: holder(coordination), 120, "a leader")
    time.sleep(3)  # the leader at work on the new jobs
    old = holder(coordination)
    victim = by_name[old.rsplit("_", 1)[0]]
    at = datetime.now(UTC)
    started = time.monotonic()
    if fault == "freeze":
        victim.signal(signal.SIGSTOP)
    elif fault == "kill":
        victim.signal(signal.SIGKILL)
    else:
        victim.relay.cut()
    new = wait_for(lambda: (h := holder(coordination)) and h != old and h, 120, "a new leader")
    took_over = time.monotonic() - started
    if fault != "kill":
        time.sleep(max(0.0, FAULT_SECONDS - (time.monotonic() - started)))
        if fault == "freeze":
            victim.signal(signal.SIGCONT)
        else:
            victim.relay.heal()
    return {"fault": fault, "at": at, "old": old, "new": new, "lease_taken_s": took_over}


def failover(args: argparse.Namespace, replicas: list[Replica], api: client.ApiClient) -> int:
    objects, coordination = client.CustomObjectsApi(api), client.CoordinationV1Api(api)
    by_name = {r.name: r for r in replicas}
    since = datetime.now(UTC)
    changes: list[dict[str, Any]] = []
    created = 0
    per_change = max(1, args.jobs // args.changes)
    with GpuSampler(api, NAMESPACE) as sampler:
        for i in range(args.changes):
            for _ in range(per_change if i < args.changes - 1 else args.jobs - created):
                shape = SHAPES[created % len(SHAPES)]
                objects.create_namespaced_custom_object(
                    keys.GROUP,
                    keys.VERSION,
                    NAMESPACE,
                    keys.PLURAL,
                    topology_job(f"job-{created:03d}", shape),
                )
                created += 1
            change = one_change(FAULTS[i % len(FAULTS)], by_name, coordination)
            changes.append(change)
            print(
                f"  change {i + 1:2}: {change['fault']:9} {change['old']} -> {change['new']} "
                f"in {change['lease_taken_s']:.1f} s",
                flush=True,
            )
        deadline = time.monotonic() + args.timeout
        while len(succeeded(objects, NAMESPACE)) < args.jobs and time.monotonic() < deadline:
            time.sleep(2)
    time.sleep(2)
    found = audit.events(since, CLUSTER_DIR / "logs" / "audit.log")
    outside, checked = audit.writes_outside_terms(found, NAMESPACE)
    latencies = []
    for change in changes:
        first = audit.first_write(found, audit.OPERATOR_AGENT + change["new"], change["at"])
        change["first_write_s"] = (
            round((first - change["at"]).total_seconds(), 2) if first is not None else None
        )
        if first is not None:
            latencies.append((first - change["at"]).total_seconds())
    owned = children(NAMESPACE)
    owned.pop("launcher Job ever", None)
    duplicates = {
        kind: dup
        for kind, counter in owned.items()
        if (dup := {name: n for name, n in counter.items() if n > 1})
    }
    result = {
        "jobs": args.jobs,
        "succeeded": len(succeeded(objects, NAMESPACE)),
        "leadership_changes": len(changes),
        "faults": {f: sum(c["fault"] == f for c in changes) for f in FAULTS},
        "duplicate_children": duplicates,
        "most_decisions_on_one_gpu": sampler.most_decisions,
        "most_live_pods_on_one_gpu": sampler.most_pods,
        "gpu_samples": sampler.samples,
        "writes_by_replicas_checked": checked,
        "writes_by_non_leaders": outside,
        "kopf_writes": len(audit.writes_by(found, "kopf/")),
        "fault_to_new_leader_first_write_s": {
            "median": round(statistics.median(latencies), 2) if latencies else None,
            "p95": round(percentile(latencies, 0.95), 2) if latencies else None,
        },
        "fault_to_lease_taken_s_median": round(
            statistics.median(c["lease_taken_s"] for c in changes), 2
        ),
        "changes": [{**c, "at": c["at"].isoformat()} for c in changes],
        "replica_starts": {r.name: r.starts for r in replicas},
    }
    out = ROOT / ".bench" / "failover.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    for key, value in result.items():
        if key != "changes":
            print(f"  {key:36} {value}")
    print(f"wrote {out.relative_to(ROOT)}")
    ok = (
        result["succeeded"] == args.jobs
        and not duplicates
        and sampler.most_decisions <= 1
        and sampler.most_pods <= 1
        and not outside
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def has_pods(core: client.CoreV1Api, job: str, count: int, *, bound: bool) -> bool:
    """``job`` has ``count`` pods (bound to nodes, with ``bound``)."""
    try:
        found = core.list_namespaced_pod(
            NAMESPACE, label_selector=f"{keys.LABEL_JOB_NAME}={job}", _request_timeout=5
        ).items
    except Exception:
        return False
    return len([p for p in found if p.spec.node_name or not bound]) >= count


def is_created(objects: client.CustomObjectsApi, job: str) -> bool:
    try:
        body = objects.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, NAMESPACE, keys.PLURAL, job
        )
    except Exception:
        return False
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Created" and c["status"] == "True" for c in conditions)


def apiserver_restarts(args: argparse.Namespace, api: client.ApiClient) -> int:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    runs = []
    for run in range(args.restarts):
        for j in range(4):  # in flight: running, and one waiting for GPUs
            objects.create_namespaced_custom_object(
                keys.GROUP,
                keys.VERSION,
                NAMESPACE,
                keys.PLURAL,
                topology_job(f"flight-{run}-{j}", (2, 8), succeed_after="60s"),
            )
        time.sleep(8)
        back = restart_apiserver(args.outage, CLUSTER_DIR)
        name = f"after-{run}"
        objects.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, NAMESPACE, keys.PLURAL, mpijob(name, workers=2)
        )
        made = time.monotonic()
        seen: dict[str, float] = {}
        checks = {
            "workers_s": partial(has_pods, core, name, 2, bound=False),
            "created_s": partial(is_created, objects, name),
            "all_bound_s": partial(has_pods, core, name, 3, bound=True),
        }
        while len(seen) < len(checks) and time.monotonic() - made < 300:
            for what, check in checks.items():
                if what not in seen and check():
                    seen[what] = round(time.monotonic() - made, 2)
            time.sleep(0.1)
        runs.append({**seen, "api_back_to_job_s": round(made - back, 2)})
        print(f"  run {run + 1}: {runs[-1]}", flush=True)
        time.sleep(20)  # the next run starts from a steady state
    result = {
        "outage_s": args.outage,
        "runs": runs,
        **{
            f"{what}_median": statistics.median(r.get(what, float("inf")) for r in runs)
            for what in ("workers_s", "created_s", "all_bound_s")
        },
    }
    out = ROOT / ".bench" / "apiserver-restart.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for all to finish")
    parser.add_argument("--restarts", type=int, default=0, help="API server restarts instead")
    parser.add_argument("--outage", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()

    kubeconfig = start_cluster()
    config.load_kube_config(config_file=str(kubeconfig))  # bench.killstorm.children's client
    api = client.ApiClient()
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
    )
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    replicas = [Replica(i, kubeconfig, (host, int(port))) for i in range(2)]
    try:
        for r in replicas:
            r.start()
        if args.restarts:
            return apiserver_restarts(args, api)
        return failover(args, replicas, api)
    finally:
        for r in replicas:
            r.stop()
        if not args.keep:
            env = {**os.environ, "MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
            down = [sys.executable, "-m", "hack.cluster", "down"]
            subprocess.run(down, cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    sys.exit(main())
