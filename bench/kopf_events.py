"""What Kopf's path costs per MPIJob event: CPU per event, without I/O or a cluster.

Run as ``make bench-kopf-events`` (``.venv/bin/python -m bench.kopf_events``; ``--events`` and
``--rounds`` for the knobs). Each way runs in a fresh interpreter, since the operator's changes
to Kopf are for the whole process (:mod:`mpijob.platform.kopf_tuning`):

* ``kopf``: Kopf's ``process_resource_event`` with the operator's registry, settings and
  indexers, as ``mpijob-operator run`` makes them (``startup.registry_for``,
  ``kopf_tuning.configure`` and ``patch_kopf``), for ``--events`` MODIFIED events of 100
  MPIJobs of 8 GPU workers (spec, status, managed fields as ``kubectl apply`` leaves them):
  Kopf's memory of the object, its body and patch, its loggers, the index function
  (:func:`mpijob.handlers.watches.mpijobs_by_key`: the job filed, its sync asked for) and the
  deletion handler's filter;
* ``kopf, arguments built at every use``: the same without
  ``kopf_tuning.causes_build_their_arguments_once``;
* ``the handler alone``: the index function called directly and its result filed, what an
  informer's event costs besides its decoding (``platform/informer.py``).

Kopf's watch stream and its per-object worker tasks are not in it (``make bench --profile``
shows those). Per way, the minimum over ``--rounds`` rounds of CPU time (``process_time``)
per event: the machine's other load only ever adds to a round. Prints a table and writes
``.bench/kopf-events.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

OUT = Path(".bench/kopf-events.json")
WAYS = {
    "kopf": "kopf, as the operator runs it",
    "kopf-untuned": "kopf, arguments built at every use",
    "handler": "the handler alone",
}


def job(i: int, version: int) -> dict[str, Any]:
    """An MPIJob of 8 GPU workers, as its watch event brings it."""
    template = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "mpioperator/mpi-pi:openmpi",
                    "command": ["mpirun", "-n", "64", "python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": 8}},
                }
            ]
        }
    }
    replicas = {"Launcher": 1, "Worker": 8}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {
            "name": f"job-{i}",
            "namespace": "bench",
            "uid": f"uid-{i}",
            "resourceVersion": str(version),
            "generation": 1,
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "labels": {"team": "bench"},
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}},
                {"manager": "mpijob-operator", "operation": "Update", "subresource": "status"},
            ],
        },
        "spec": {
            "slotsPerWorker": 8,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                role: {"replicas": n, "template": template} for role, n in replicas.items()
            },
        },
        "status": {
            "conditions": [
                {
                    "type": "Created",
                    "status": "True",
                    "reason": "MPIJobCreated",
                    "message": f"MPIJob bench/job-{i} is created.",
                    "lastTransitionTime": "2026-11-29T10:00:00Z",
                    "lastUpdateTime": "2026-11-29T10:00:00Z",
                }
            ],
            "replicaStatuses": {"Launcher": {}, "Worker": {"active": 8}},
        },
    }


async def _measure(way: str, events: int, rounds: int) -> float:
    """Microseconds of CPU per event, the least of ``rounds``."""
    import kopf
    from kopf._cogs.structs import references
    from kopf._core.engines import indexing
    from kopf._core.reactor import inventory, processing

    from mpijob.handlers import startup, watches
    from mpijob.handlers.cache import Cache, Index
    from mpijob.platform import kopf_tuning
    from mpijob.settings import OperatorSettings

    ours = OperatorSettings()
    settings = kopf.OperatorSettings()
    kopf_tuning.configure(settings, ours)
    if way == "kopf-untuned":
        kopf_tuning.causes_build_their_arguments_once = lambda: None  # type: ignore[assignment]
    kopf_tuning.patch_kopf()
    registry = startup.registry_for(ours)
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    asked: list[Any] = []
    workers = SimpleNamespace(enqueue_rate_limited=asked.append, enqueue_after=asked.append)
    memo = SimpleNamespace(
        runtime=SimpleNamespace(cache=Cache(indices=indexers.indices), workers=workers)
    )
    resource = references.Resource(
        group="kubeflow.org", version="v2beta1", plural="mpijobs", kind="MPIJob",
        namespaced=True, verbs=["list", "watch"],
    )  # fmt: skip
    memories = inventory.ResourceMemories()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    bodies = [job(n % 100, 10 + n) for n in range(events)]
    filed: dict[Any, Any] = {}
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for body in bodies:
            if way == "handler":
                meta = body["metadata"]
                got = await watches.mpijobs_by_key(
                    body=kopf.Body(body), namespace=meta["namespace"], name=meta["name"],
                    memo=memo,
                )  # fmt: skip
                filed.update(got)
            else:
                await processing.process_resource_event(
                    lifecycle=kopf.lifecycles.all_at_once, indexers=indexers, registry=registry,
                    settings=settings, memories=memories, memobase=memo, resource=resource,
                    raw_event={"type": "MODIFIED", "object": body}, event_queue=queue,
                )  # fmt: skip
        best = min(best, time.process_time() - start)
    filed_jobs = len(filed) or len(indexers.indices[Index.MPIJOBS_BY_KEY])
    assert filed_jobs == min(100, events), filed_jobs  # every job filed
    assert len(asked) == events * rounds, len(asked)  # and its sync asked for, every event
    return best * 1e6 / events


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=400, help="events per round (400)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; the least is kept (15)")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a child
    args = parser.parse_args()
    if args.way:
        import uvloop

        print(uvloop.run(_measure(args.way, args.events, args.rounds)))
        return 0
    results = {}
    for way in WAYS:
        child = [sys.executable, "-m", "bench.kopf_events", "--way", way]
        child += ["--events", str(args.events), "--rounds", str(args.rounds)]
        done = subprocess.run(child, capture_output=True, text=True, check=True)
        results[way] = float(done.stdout.strip().splitlines()[-1])
    print(f"CPU per MPIJob event, least of {args.rounds} rounds of {args.events} events")
    for way, label in WAYS.items():
        print(f"  {label:<40} {results[way]:7.0f} us")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    OUT.write_text(json.dumps({"us_per_event": results, "machine": machine, **vars(args)}))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
