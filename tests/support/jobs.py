"""MPIJobs for tests: :func:`body`, the one factory of MPIJob objects every suite builds on
(:func:`parsed` makes the operator's model of one), and :func:`mpijob`, a job in the shape users
write them (upstream's examples) for the integration tests.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from mpijob import api, keys


def body(
    name: str = "foo",
    namespace: str | None = "bar",
    *,
    uid: str | None = None,
    launcher: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    workers: int | None = None,
    launcher_replicas: int | None = 1,
    metadata: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An MPIJob object as the API holds it.

    Its metadata: ``name``, ``namespace`` (None: none), ``uid`` (``uid-<name>`` unless given;
    "" for none), then ``metadata``'s fields. Its spec: a Launcher replica spec when
    ``launcher`` (a pod template) is given, with ``launcher_replicas`` (None: left to
    defaulting); a Worker replica spec when ``worker`` or ``workers`` is given (a template of
    ``{}`` when only ``workers``); then ``spec``'s fields as they are.
    """
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    uid = f"uid-{name}" if uid is None else uid
    if uid:
        meta["uid"] = uid
    meta.update(copy.deepcopy(dict(metadata or {})))
    replica_specs: dict[str, Any] = {}
    if launcher is not None:
        replica_specs[keys.REPLICA_LAUNCHER] = {"template": copy.deepcopy(launcher)}
        if launcher_replicas is not None:
            replica_specs[keys.REPLICA_LAUNCHER] = {
                "replicas": launcher_replicas,
                **replica_specs[keys.REPLICA_LAUNCHER],
            }
    if worker is not None or workers is not None:
        replica_specs[keys.REPLICA_WORKER] = {
            "replicas": workers,
            "template": copy.deepcopy(worker if worker is not None else {}),
        }
    job_spec: dict[str, Any] = {"mpiReplicaSpecs": replica_specs} if replica_specs else {}
    job_spec.update(spec)
    return {"apiVersion": keys.API_VERSION, "kind": keys.KIND, "metadata": meta, "spec": job_spec}


def parsed(obj: dict[str, Any]) -> api.MPIJob:
    """The operator's model of ``obj``, parsed and defaulted as the reconcile does."""
    return api.with_defaults(api.parse(obj))


def gpu_template(gpus: int | str, *, image: str = "mpi", **pod_spec: Any) -> dict[str, Any]:
    """A pod template of one container ``c`` that limits ``gpus`` GPUs (none when 0)."""
    limits = {keys.GPU_RESOURCE: gpus} if gpus else {}
    container = {"name": "c", "image": image, "resources": {"limits": limits}}
    return {"spec": {"containers": [container], **pod_spec}}


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
    made = body(
        name,
        None,
        uid="",
        metadata={"annotations": dict(annotations or {})},
        slotsPerWorker=1,
        mpiReplicaSpecs=replica_specs,
        runPolicy=dict(run_policy or {}),
    )
    if implementation:
        made["spec"]["mpiImplementation"] = implementation
    made["spec"].update(spec or {})
    return made
