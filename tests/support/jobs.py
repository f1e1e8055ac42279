"""MPIJob manifests for tests, in the shape users write them (upstream's examples)."""

from __future__ import annotations

import copy
from typing import Any

from mpijob import keys


def mpijob(
    name: str,
    *,
    workers: int | None = 2,
    implementation: str | None = None,
    gpus: int = 0,
    launcher_annotations: dict[str, str] | None = None,
    worker_annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    run_policy: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pi-style job: one launcher running mpirun, ``workers`` sshd workers."""
    resources = {"limits": {keys.GPU_RESOURCE: str(gpus)}} if gpus else {}
    replica_specs: dict[str, Any] = {
        "Launcher": {
            "replicas": 1,
            "template": {
                "metadata": {"annotations": dict(launcher_annotations or {})},
                "spec": {
                    "containers": [
                        {
                            "name": "launcher",
                            "image": "mpioperator/mpi-pi:openmpi",
                            "command": ["mpirun", "-n", str(workers or 1), "/home/mpiuser/pi"],
                        }
                    ]
                },
            },
        },
    }
    if workers is not None:
        replica_specs["Worker"] = {
            "replicas": workers,
            "template": {
                "metadata": {"annotations": dict(worker_annotations or {})},
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "mpioperator/mpi-pi:openmpi",
                            "resources": copy.deepcopy(resources),
                        }
                    ]
                },
            },
        }
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": replica_specs,
            "runPolicy": dict(run_policy or {}),
        },
    }
    if implementation:
        body["spec"]["mpiImplementation"] = implementation
    body["spec"].update(spec or {})
    return body
