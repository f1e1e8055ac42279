#!/usr/bin/env python3
"""Volcano's real scheduler and controllers beside the local control plane (``--volcano``,
``VOLCANO=1 make cluster``; the tests always start it).

``hack/build-bins.sh volcano`` builds ``vc-scheduler`` and ``vc-controller-manager`` at the
version pinned in ``hack/versions.env``; they run as plain processes like the rest of
``hack/cluster.py``'s cluster, with what Volcano's Helm chart installs, arranged for loopback:

- Volcano's CRDs from the downloaded Go module (``config/crd/volcano/bases``): PodGroups and
  Queues, and the kinds its scheduler and controllers watch (HyperNodes, NUMA topologies, node
  shards, Volcano Jobs and Commands); ``hack/cluster.py`` applies the PodGroup one with the
  control plane, so an operator with ``--gang-scheduling volcano`` finds its kind either way;
- the scheduler with the chart's own configuration (``volcano-scheduler.conf``: enqueue,
  allocate, backfill; gang, proportion, predicates and the rest) under the name ``volcano``;
- the controller manager with the controllers the scheduler depends on: the queue controller
  (a Queue is scheduled only once it is ``Open``) and the PodGroup controller.

Only pods whose ``schedulerName`` is ``volcano`` are Volcano's, so it runs beside the default
scheduler for the whole life of the cluster; ``hack/cluster.py down`` stops it with the rest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hack import common as local

SCHEDULER = "vc-scheduler"
CONTROLLERS = "vc-controller-manager"
MODULE = "volcano.sh/volcano"
# The CRDs of Volcano's chart that its scheduler and the two controllers run here watch.
CRDS = (
    "scheduling.volcano.sh_podgroups",
    "scheduling.volcano.sh_queues",
    "topology.volcano.sh_hypernodes",
    "nodeinfo.volcano.sh_numatopologies",
    "shard.volcano.sh_nodeshards",
    "batch.volcano.sh_jobs",
    "bus.volcano.sh_commands",
)
PODGROUP_CRD = CRDS[0]
DEFAULT_QUEUE = "default"


def version() -> str:
    return local.versions()["VOLCANO_VERSION"]


def binaries() -> dict[str, Path]:
    folder = local.cache_dir() / "bin" / f"volcano-v{version()}"
    return {SCHEDULER: folder / SCHEDULER, CONTROLLERS: folder / CONTROLLERS}


def module_dir() -> Path:
    return local.go_module_dir(f"{MODULE}@v{version()}", "its CRDs and scheduler configuration")


def crd_files(names: tuple[str, ...] = CRDS) -> list[Path]:
    bases = module_dir() / "config/crd/volcano/bases"
    return [bases / f"{name}.yaml" for name in names]


def crd_name(path: Path) -> str:
    """``scheduling.volcano.sh_podgroups.yaml`` holds ``podgroups.scheduling.volcano.sh``."""
    group, _, plural = path.stem.partition("_")
    return f"{plural}.{group}"


def scheduler_conf() -> Path:
    return module_dir() / "installer/helm/chart/volcano/config/volcano-scheduler.conf"


def running(state: local.State) -> bool:
    return all(local.alive(state.pids.get(name, -1)) for name in (SCHEDULER, CONTROLLERS))


def queue_open(state: local.State) -> bool:
    out = local.kubectl(
        state,
        "get",
        "queues.scheduling.volcano.sh",
        "-o",
        "json",
        f"--field-selector=metadata.name={DEFAULT_QUEUE}",
    )
    return any(
        (q.get("status") or {}).get("state") == "Open" for q in json.loads(out).get("items", [])
    )


def ensure(state: local.State) -> None:
    """Volcano running against the cluster of ``state``; harmless when it already is. Its CRDs
    are applied either way: a test that plays a HyperNode CRD appearing deletes Volcano's."""
    files = crd_files()
    local.kubectl(state, "apply", "--server-side", *[a for f in files for a in ("-f", str(f))])
    local.wait_established(state, [f"crd/{crd_name(f)}" for f in files])
    if running(state):
        return
    t0 = time.monotonic()
    if not all(p.exists() for p in binaries().values()):
        local.say(f"Volcano v{version()} missing; building it (hack/build-bins.sh volcano)")
        subprocess.run([str(local.HACK / "build-bins.sh"), "volcano"], check=True)
    for port in ("vc-scheduler-metrics", "vc-scheduler-healthz", "vc-controllers"):
        state.ports[port] = local.free_port()
    state.save()
    kubeconfig = str(local.state_dir() / "kubeconfig")
    bins = binaries()
    local.start(
        CONTROLLERS,
        [
            str(bins[CONTROLLERS]),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--controllers=queue-controller,pg-controller",
            f"--listen-address=127.0.0.1:{state.ports['vc-controllers']}",
            "--logtostderr",
            "-v=1",
        ],
        state,
    )
    local.start(
        SCHEDULER,
        [
            str(bins[SCHEDULER]),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--scheduler-conf={scheduler_conf()}",
            "--scheduler-name=volcano",
            f"--listen-address=127.0.0.1:{state.ports['vc-scheduler-metrics']}",
            "--enable-healthz=true",
            f"--healthz-address=127.0.0.1:{state.ports['vc-scheduler-healthz']}",
            "--logtostderr",
            "-v=1",
        ],
        state,
    )

    def ready() -> bool:
        for name in (CONTROLLERS, SCHEDULER):
            if not local.alive(state.pids[name]):
                local.wait_for(f"{name} (exited)", lambda: False, 0, name)
        return queue_open(state)

    # The scheduler creates the default Queue; the queue controller opens it.
    local.wait_for("Volcano's default Queue Open", ready, 120, SCHEDULER)
    local.say(f"Volcano v{version()} up in {time.monotonic() - t0:.1f}s (logs/{SCHEDULER}.log)")


def main() -> int:
    usage = "usage: python -m hack.volcano up  (the local cluster must be running: make cluster)"
    if sys.argv[1:] != ["up"]:
        print(usage, file=sys.stderr)
        return 2
    state = local.State.load()
    if not state or not local.healthy(state):
        print(
            "[volcano] error: no local cluster is running; run `make cluster` first",
            file=sys.stderr,
        )
        return 1
    ensure(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
