#!/usr/bin/env python3
"""The in-cluster operator's figures: rollout, fail-over time, and memory after many jobs.

On the local cluster with its real node (``make cluster``), the operator installed from its image
by hack/incluster.py (standalone overlay, two replicas, watching one namespace of its own):

- **rollout**: ``kubectl apply -k`` to the Deployment and the agent rolled out, and each pod's
  start to Ready (the API's timestamps, whole seconds);
- **fail-over** (``--failovers``, default 3): the leader's pod deleted (grace 0) until the
  standby holds the Lease, timed here by polling the Lease every 0.1 s; the replacement pod is
  waited for before the next round. The median and every run are printed;
- **memory** (``--jobs``, default 100; 0 skips it): that many simulated MPIJobs (two workers,
  launcher done 1 s after it starts, on the kwok nodes) run to Succeeded, then the leader's
  ``process_resident_memory_bytes``, read from its /metrics at its pod address;
- **starts** (``--starts N``, default 0): N fresh installs of one replica (everything removed
  between them), each pod's start to Ready; with ``--archive PATH``, of that image archive
  (an earlier recipe's, to compare two images on the same machine) instead of the current one.

Writes ``.bench/incluster.json``. A benchmark, not a test (minutes of a 2-core machine):
``.venv/bin/python -m bench.incluster``. Leaves the operator installed; ``make undeploy-local``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from hack import incluster

ROOT = Path(__file__).resolve().parents[1]

NAMESPACE = "bench-incluster"
SELECTOR = "app.kubernetes.io/name=mpijob-operator,app.kubernetes.io/component=operator"


def kubectl_json(*args: str) -> Any:
    return json.loads(incluster.kubectl(*args, "-o", "json"))


def live_pods() -> list[dict[str, Any]]:
    items = kubectl_json("get", "pods", "-n", incluster.NAMESPACE, "-l", SELECTOR)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def wait(what: str, probe: Any, timeout: float = 300, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(every)
    raise SystemExit(f"[bench] {what} not reached in {timeout:.0f}s")


def holder() -> str:
    lease = kubectl_json("get", "lease", incluster.OPERATOR, "-n", incluster.NAMESPACE)
    return str(lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]


def two_ready() -> list[dict[str, Any]]:
    pods = live_pods()
    return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else []


def failover() -> float:
    names = {p["metadata"]["name"] for p in wait("two Ready replicas", two_ready)}
    leader = wait("a leader", lambda: (h := holder()) in names and h)
    t0 = time.monotonic()
    incluster.kubectl(
        "delete", "pod", leader, "-n", incluster.NAMESPACE, "--grace-period=0", "--force"
    )
    new = wait("the standby leading", lambda: (h := holder()) != leader and h, every=0.1)
    took = time.monotonic() - t0
    print(f"  {leader} -> {new}: {took:.1f}s", flush=True)
    return took


def rss_after_jobs(count: int) -> float:
    incluster.kubectl("create", "namespace", NAMESPACE, check=False)
    incluster.kubectl("delete", "mpijobs", "--all", "-n", NAMESPACE, "--wait=true")
    from mpijob import keys
    from tests.support.jobs import mpijob

    jobs = [
        mpijob(
            f"job-{i}",
            workers=2,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
            run_policy={"cleanPodPolicy": "Running"},
        )
        for i in range(count)
    ]
    incluster.kubectl(
        "apply", "-n", NAMESPACE, "-f", "-", input=json.dumps({"kind": "List", "items": jobs,
                                                               "apiVersion": "v1"})
    )  # fmt: skip
    t0 = time.monotonic()

    def succeeded() -> bool:
        items = kubectl_json("get", "mpijobs", "-n", NAMESPACE)["items"]
        done = sum(
            any(c["type"] == "Succeeded" and c["status"] == "True"
                for c in (j.get("status") or {}).get("conditions", []))
            for j in items
        )  # fmt: skip
        return done == count

    wait(f"{count} jobs Succeeded", succeeded, timeout=1200, every=2)
    print(f"  {count} jobs Succeeded in {time.monotonic() - t0:.0f}s", flush=True)
    lead = holder()
    (pod,) = [p for p in live_pods() if p["metadata"]["name"] == lead]
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("process_resident_memory_bytes ")]
    return float(line.split()[1]) / 2**20


def start_to_ready(pod: dict[str, Any]) -> float:
    ready_at = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    start = time.mktime(time.strptime(pod["status"]["startTime"], "%Y-%m-%dT%H:%M:%SZ"))
    ready = time.mktime(time.strptime(ready_at["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
    return ready - start


def starts(count: int, archive: Path | None) -> list[float]:
    """``count`` installs of one replica from nothing: each pod's start to Ready."""
    from hack import cluster, operator_image

    image = None
    if archive is not None:
        st = incluster.nodes()
        for i in range(st.count):
            sock = cluster.state_dir() / "realnode" / f"node-{i}" / "containerd.sock"
            ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
            operator_image.import_into(ctr, archive)
        image = operator_image.reference(operator_image.digest_of(archive))
    out = []
    for _ in range(count):
        incluster.undeploy()
        incluster.deploy("standalone", replicas=1, namespaces=(NAMESPACE,), image=image)
        (pod,) = wait("one Ready replica", lambda: [p for p in live_pods() if is_ready(p)])
        out.append(start_to_ready(pod))
        print(f"  {pod['spec']['containers'][0]['image']}: start to Ready {out[-1]:.0f}s")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--starts", type=int, default=0)
    parser.add_argument("--archive", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {}
    incluster.kubectl("create", "namespace", NAMESPACE, check=False)
    if args.starts:
        runs = starts(args.starts, args.archive)
        out["starts_to_ready_seconds"] = runs
        out["starts_median_seconds"] = statistics.median(runs)
        print(f"start to Ready: {runs}, median {out['starts_median_seconds']:.0f}s")
    t0 = time.monotonic()
    incluster.deploy("standalone", replicas=2, namespaces=(NAMESPACE,))
    out["rollout_seconds"] = round(time.monotonic() - t0, 1)
    pods = wait("two Ready replicas", two_ready)
    out["start_to_ready_seconds"] = [start_to_ready(p) for p in pods]
    print(f"rollout {out['rollout_seconds']}s; start to Ready {out['start_to_ready_seconds']}")
    if args.failovers:
        print("fail-over (leader pod deleted -> standby holds the Lease):")
        runs = [failover() for _ in range(args.failovers)]
        out["failover_seconds"] = [round(r, 1) for r in runs]
        out["failover_median_seconds"] = round(statistics.median(runs), 1)
        print(f"  median {out['failover_median_seconds']}s of {len(runs)}")
    if args.jobs:
        print(f"memory after {args.jobs} jobs:")
        wait("two Ready replicas", two_ready)
        out["jobs"] = args.jobs
        out["leader_rss_mib"] = round(rss_after_jobs(args.jobs), 1)
        print(f"  leader RSS {out['leader_rss_mib']} MiB")
    dest = ROOT / ".bench" / "incluster.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(out, indent=2))
    print(f"wrote {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
