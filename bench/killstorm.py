#!/usr/bin/env python3
"""Kill storm: many topology jobs compete for too few GPUs while the operator is SIGKILLed over
and over and the API server goes away once. Nothing may be lost, duplicated or double-booked.

On its own local cluster (4 simulated DGX-1 V100 nodes, 32 GPUs), in one namespace:

- ``--jobs`` topology-placed MPIJobs (default 56) of mixed shapes (1x8, 2x4, 4x2, 2x2, 1x4, 4x1,
  3x2, 2x8), asking several times the 32 GPUs in all, are created one after another; each
  launcher succeeds 3 s after it runs, and ``cleanPodPolicy: Running`` deletes the workers then;
  every fourth job has ``ttlSecondsAfterFinished: 0`` (its launcher Job goes once it finished);
- the operator is SIGKILLed and restarted every 1.5 to 4 s (seeded, so runs repeat) until
  ``--kills`` kills (default 24) have landed; at the middle kill the kube-apiserver is SIGKILLed
  too and started again 5 s later with the same arguments;
- a sampler lists the namespace's pods every 0.25 s and counts, per node and GPU index, the live
  worker pods (terminating ones included) whose ``mpijob.io/gpu-ids`` name that GPU, and per
  node the GPUs its bound, unfinished pods hold (``nvidia.com/gpu``, or a claimed worker's
  GPU ids under the dra binding).

It passes (exit 0) when every job Succeeded, the most pods ever seen on one GPU is 1, no node
was ever asked for more than its 8 GPUs, each job has exactly one Service, ConfigMap, Secret,
launcher Job and launcher pod (a TTL-0 job none, once finished), every job has exactly one
``MPIJobCreated`` Event (count 1: none lost to a SIGKILL between a status write and its post,
none posted twice) and was launched once (one launcher Job ever, by the Job controller's
Events, which outlive a deleted Job), and no PlacementDecision is left. It reports Events per
job and relaunches per job (expected: 1 and 0 for every job). A benchmark, not a CI test (a few
minutes of a 2-core machine): ``make bench-storm``; writes ``.bench/killstorm-<binding>.json``
(``--gpu-binding``, default auto).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench import ours_env
from hack import cluster as local  # the local control plane
from mpijob import keys
from tests.support.jobs import mpijob  # the tests' job factory, the shape users write

ROOT = Path(__file__).resolve().parents[1]

CLUSTER_DIR = ROOT / ".bench" / "cluster-storm"
NAMESPACE = "storm"
SHAPES = [(1, 8), (2, 4), (4, 2), (2, 2), (1, 4), (4, 1), (3, 2), (2, 8)]
GPUS_PER_NODE = 8


#: Every fourth job has ``ttlSecondsAfterFinished: 0``: its launcher Job goes as soon as the
#: job is recorded finished, and must never be created again.
TTL_ZERO_EVERY = 4


def ttl_zero(index: int) -> bool:
    return index % TTL_ZERO_EVERY == TTL_ZERO_EVERY - 1


def storm_job(index: int) -> dict[str, Any]:
    workers, gpus = SHAPES[index % len(SHAPES)]
    policy: dict[str, Any] = {"cleanPodPolicy": "Running"}
    if ttl_zero(index):
        policy["ttlSecondsAfterFinished"] = 0
    return mpijob(
        f"job-{index:03d}",
        workers=workers,
        gpus=gpus,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "3s"},
        run_policy=policy,
    )


class Operator:
    """Our operator as a process, killed and restarted at will."""

    def __init__(self, kubeconfig: Path, binding: str) -> None:
        self.kubeconfig = kubeconfig
        self.binding = binding
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (CLUSTER_DIR / "logs" / "operator-storm.log").open("ab")
        self.starts = 0

    def start(self) -> None:
        argv = [sys.executable, "-m", "mpijob", "run", "-n", NAMESPACE, "--no-leader-elect"]
        argv += ["--monitoring-port", "0", "--health-port", "0", "--kube-api-qps", "0"]
        argv += ["--kubeconfig", str(self.kubeconfig), "--gpu-binding", self.binding]
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=ours_env()
        )
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def restart_apiserver(outage: float, cluster_dir: Path = CLUSTER_DIR) -> float:
    """SIGKILL the kube-apiserver of the cluster in ``cluster_dir``, start it again ``outage`` s
    later with the same arguments; returns when it answers (monotonic)."""
    os.environ["MPIJOB_CLUSTER_DIR"] = str(cluster_dir)
    state = local.State.load()
    assert state is not None, "no local cluster state"
    pid = state.pids["kube-apiserver"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGKILL)
    while local.alive(pid):
        time.sleep(0.05)
    time.sleep(outage)
    local.start("kube-apiserver", [a.decode() for a in argv], state)
    local.wait_for("kube-apiserver", lambda: local.healthy(state), timeout=60)
    return time.monotonic()


class Sampler(threading.Thread):
    """Per GPU, the most live worker pods ever seen on it; per node, the most GPUs requested."""

    def __init__(self, core: client.CoreV1Api) -> None:
        super().__init__(daemon=True)
        self.core = core
        self.stop = threading.Event()
        self.samples = 0
        self.failed = 0
        self.max_per_gpu = 0
        self.max_per_node = 0
        self.worst: dict[str, Any] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                pods = self.core.list_namespaced_pod(NAMESPACE, _request_timeout=5).items
            except Exception:  # the API server is down: no sample
                self.failed += 1
                time.sleep(0.25)
                continue
            self.samples += 1
            per_gpu: Counter[tuple[str, int]] = Counter()
            per_node: Counter[str] = Counter()
            holders: dict[tuple[str, int], list[str]] = {}
            for p in pods:
                if p.status.phase in ("Succeeded", "Failed") or not p.spec.node_name:
                    continue
                requested = 0
                for c in p.spec.containers:
                    limits = (c.resources.limits if c.resources else None) or {}
                    requested += int(limits.get(keys.GPU_RESOURCE, 0))
                ids = (p.metadata.annotations or {}).get(keys.GPU_IDS)
                # Under the dra binding a worker asks for its claim, not nvidia.com/gpu.
                per_node[p.spec.node_name] += max(requested, len(ids.split(",")) if ids else 0)
                if not ids:
                    continue
                for gpu in (int(i) for i in ids.split(",")):
                    per_gpu[(p.spec.node_name, gpu)] += 1
                    holders.setdefault((p.spec.node_name, gpu), []).append(p.metadata.name)
            if per_gpu:
                (where, count) = per_gpu.most_common(1)[0]
                if count > self.max_per_gpu:
                    self.max_per_gpu = count
                    self.worst = {"node": where[0], "gpu": where[1], "pods": holders[where]}
            if per_node:
                self.max_per_node = max(self.max_per_node, *per_node.values())
            time.sleep(0.25)


def children(ns: str) -> dict[str, Counter[str]]:
    """Per kind, how many objects each job controls (by its controller owner's name)."""
    core, batch = client.CoreV1Api(), client.BatchV1Api()
    out: dict[str, Counter[str]] = {}
    listings = {
        "Service": core.list_namespaced_service(ns).items,
        "ConfigMap": core.list_namespaced_config_map(ns).items,
        "Secret": core.list_namespaced_secret(ns).items,
        "Job": batch.list_namespaced_job(ns).items,
    }
    for kind, items in listings.items():
        counter: Counter[str] = Counter()
        for obj in items:
            for ref in obj.metadata.owner_references or []:
                if ref.controller and ref.kind == keys.KIND:
                    counter[ref.name] += 1
        out[kind] = counter
    launchers: Counter[str] = Counter()
    for p in core.list_namespaced_pod(ns, label_selector=f"{keys.LABEL_JOB_ROLE}=launcher").items:
        launchers[p.metadata.labels[keys.LABEL_JOB_NAME]] += 1
    out["launcher Pod"] = launchers
    created: Counter[str] = Counter()
    launcher_jobs: dict[str, set[str]] = {}
    suffix = "-launcher"
    for e in core.list_namespaced_event(ns).items:
        involved = e.involved_object
        if e.reason == keys.REASON_CREATED and involved.kind == keys.KIND:
            created[involved.name] += e.count or 1
        if involved.kind == "Job" and involved.name.endswith(suffix):
            launcher_jobs.setdefault(involved.name[: -len(suffix)], set()).add(involved.uid)
    out["MPIJobCreated Event"] = created
    out["launcher Job ever"] = Counter({job: len(uids) for job, uids in launcher_jobs.items()})
    return out


def storm(args: argparse.Namespace, objects: client.CustomObjectsApi, operator: Operator) -> int:
    """Create the jobs while killing the operator; the API server restarts once. Returns the
    number of API server restarts."""
    rng = random.Random(args.seed)
    kills = api_restarts = created = 0
    next_kill = time.monotonic() + rng.uniform(1.5, 4.0)
    while kills < args.kills or created < args.jobs:
        if created < args.jobs:
            try:
                objects.create_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, NAMESPACE, keys.PLURAL, storm_job(created)
                )
                created += 1
            except client.ApiException as e:
                if e.status != 409:
                    raise
                created += 1  # created before a dropped answer
            except Exception:  # the API server is restarting: try again
                time.sleep(0.5)
        if kills < args.kills and time.monotonic() >= next_kill:
            operator.kill()
            kills += 1
            if kills == args.kills // 2:
                print(f"kill {kills}: restarting the kube-apiserver (5 s outage)", flush=True)
                restart_apiserver(5.0)
                api_restarts += 1
            operator.start()
            next_kill = time.monotonic() + rng.uniform(1.5, 4.0)
        time.sleep(0.3 if created < args.jobs else 0.1)
    print(f"{kills} kills, {api_restarts} API server restart; waiting for all jobs", flush=True)
    return api_restarts


def succeeded(objects: client.CustomObjectsApi, namespace: str = NAMESPACE) -> list[str]:
    """The MPIJobs of ``namespace`` whose Succeeded condition is True."""
    done = []
    for item in objects.list_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL
    )["items"]:
        conditions = (item.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions):
            done.append(item["metadata"]["name"])
    return done


def decisions_left(objects: client.CustomObjectsApi, within: float) -> list[str]:
    """Decisions still there after ``within`` seconds (they go once the workers are gone)."""
    deadline = time.monotonic() + within
    while True:
        left = [
            d["metadata"]["name"]
            for d in objects.list_namespaced_custom_object(
                keys.DECISION_GROUP, keys.DECISION_VERSION, NAMESPACE, keys.DECISION_PLURAL
            )["items"]
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def start_cluster() -> Path:
    env = {**os.environ, "MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
    up = [sys.executable, "-m", "hack.cluster", "up", "--nodes", "4", "--real-nodes", "0"]
    subprocess.run(up, cwd=ROOT, check=True, env=env)
    kubeconfig = CLUSTER_DIR / "kubeconfig"
    kubectl = [str(local.binaries()["kubectl"]), "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True)
    crds = ["crd/mpijobs.kubeflow.org", "crd/placementdecisions.mpijob.io"]
    subprocess.run([*kubectl, "wait", "--for=condition=Established", *crds], check=True)
    gone = [*kubectl, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"]
    subprocess.run(gone, check=True)
    return kubeconfig


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=56)
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=900, help="seconds for all to finish")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--gpu-binding",
        default="auto",
        choices=["auto", "dra", "annotations"],
        help="the operator's --gpu-binding (auto: dra on the local cluster)",
    )
    args = parser.parse_args()

    kubeconfig = start_cluster()
    config.load_kube_config(config_file=str(kubeconfig))
    core, objects = client.CoreV1Api(), client.CustomObjectsApi()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    operator = Operator(kubeconfig, args.gpu_binding)
    operator.start()
    sampler = Sampler(core)
    sampler.start()
    started = time.monotonic()
    try:
        api_restarts = storm(args, objects, operator)
        while len(succeeded(objects)) < args.jobs and time.monotonic() - started < args.timeout:
            time.sleep(2)
        done = succeeded(objects)
        decisions = decisions_left(objects, within=60)
        wall = time.monotonic() - started
    finally:
        sampler.stop.set()
        operator.stop()
    sampler.join(timeout=5)

    names = {f"job-{i:03d}" for i in range(args.jobs)}
    owned = children(NAMESPACE)
    duplicates = {
        kind: dup
        for kind, counter in owned.items()
        if (dup := {name: n for name, n in counter.items() if n != 1})
    }
    events = owned["MPIJobCreated Event"]
    launches = owned.pop("launcher Job ever")
    events_per_job = Counter(events.get(name, 0) for name in names)
    relaunches_per_job = Counter(max(launches.get(name, 0) - 1, 0) for name in names)
    # A TTL-0 job's launcher Job and pod are gone once it finished: it was launched once if
    # one launcher Job was ever made (the Job controller's Events).
    expired = {f"job-{i:03d}" for i in range(args.jobs) if ttl_zero(i)}
    for kind in ("Job", "launcher Pod"):
        for name in expired:
            owned[kind].pop(name, None)
    missing = {
        kind: sorted(left)
        for kind, c in owned.items()
        if (left := names - set(c) - (expired if kind in ("Job", "launcher Pod") else set()))
    }
    result = {
        "gpu_binding": args.gpu_binding,
        "jobs": args.jobs,
        "gpus_asked": sum(w * g for w, g in (SHAPES[i % len(SHAPES)] for i in range(args.jobs))),
        "gpus": 4 * GPUS_PER_NODE,
        "operator_kills": args.kills,
        "operator_starts": operator.starts,
        "api_server_restarts": api_restarts,
        "succeeded": len(done),
        "wall_seconds": round(wall, 1),
        "samples": sampler.samples,
        "samples_missed_api_down": sampler.failed,
        "max_live_pods_per_gpu": sampler.max_per_gpu,
        "worst_gpu": sampler.worst,
        "max_gpus_requested_per_node": sampler.max_per_node,
        "duplicate_children": duplicates,
        "missing_children": missing,
        "created_events_lost": sorted(names - set(events)),
        # How many jobs had each number of MPIJobCreated Events (expected: every job, 1) and of
        # relaunches, launcher Jobs beyond the first (expected: every job, 0).
        "created_events_per_job": dict(sorted(events_per_job.items())),
        "relaunches_per_job": dict(sorted(relaunches_per_job.items())),
        "decisions_left": decisions,
    }
    out = ROOT / ".bench" / f"killstorm-{args.gpu_binding}.json"
    out.write_text(json.dumps(result, indent=2))
    for key, value in result.items():
        print(f"  {key:28} {value}")
    print(f"wrote {out.relative_to(ROOT)}")
    if not args.keep:
        env = {**os.environ, "MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
        down = [sys.executable, "-m", "hack.cluster", "down"]
        subprocess.run(down, cwd=ROOT, env=env, check=True)
    ok = (
        len(done) == args.jobs
        and sampler.max_per_gpu <= 1
        and sampler.max_per_node <= GPUS_PER_NODE
        and not duplicates
        and not missing
        and not decisions
        and set(events_per_job) == {1}
        and set(relaunches_per_job) == {0}
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
