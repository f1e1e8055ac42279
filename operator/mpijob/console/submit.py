"""The MPIJob that ``mpijob submit`` creates, from arena's flags. Pure: options in, a dict out.

Called by :mod:`mpijob.console.main`. The job has upstream's shape (kubeflow.org/v2beta1) and
applies unchanged to upstream's CRD; only ``--gputopology`` adds our annotation.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from mpijob import keys

#: mpirun's options per implementation, before the user's command (arena's defaults for OpenMPI:
#: no core binding, ranks placed slot by slot, NCCL and paths forwarded to every rank).
MPIRUN_OPTIONS: Mapping[str, tuple[str, ...]] = {
    keys.IMPL_OPENMPI: (
        "--allow-run-as-root",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "PATH",
    ),
    keys.IMPL_INTEL: ("-genv", "I_MPI_DEBUG", "1"),
    keys.IMPL_MPICH: (),
}


@dataclass(frozen=True)
class SubmitOptions:
    """What the user asked for on the command line."""

    name: str
    image: str
    command: tuple[str, ...]
    """The training command; wrapped in ``mpirun -np <ranks>`` unless it starts with mpirun."""
    workers: int = 1
    gpus: int = 0
    """GPUs per worker (``nvidia.com/gpu`` limit); also the worker's slot count."""
    gang: bool = False
    gputopology: bool = False
    namespace: str | None = None
    implementation: str = keys.IMPL_OPENMPI
    cpu: str | None = None
    memory: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Added to the launcher's and the workers' pod templates, as arena's ``--annotation``."""


def slots_per_worker(options: SubmitOptions) -> int:
    return max(options.gpus, 1)


#: Characters that make a quoted command the shell's to read: it runs through ``sh -c`` as typed.
SHELL_SYNTAX = frozenset("$`\\|&;<>()*?[]{}~!#\n")


def launcher_command(options: SubmitOptions) -> list[str]:
    """The launcher's command: the user's, under ``mpirun`` with one rank per slot. A command
    that is already ``mpirun ...`` (as words, or quoted as one string as arena's users type it)
    is the launcher's command as it is: wrapping it would start mpirun under mpirun."""
    command = list(options.command)
    if len(command) == 1 and " " in command[0]:
        try:
            words = shlex.split(command[0])
        except ValueError:  # unbalanced quotes: the shell says what is wrong
            words = []
        if _is_mpirun(words[:1]):
            return words if SHELL_SYNTAX.isdisjoint(command[0]) else ["sh", "-c", command[0]]
        command = ["sh", "-c", command[0]]
    if _is_mpirun(command[:1]):
        return command
    ranks = options.workers * slots_per_worker(options)
    return ["mpirun", "-np", str(ranks), *MPIRUN_OPTIONS[options.implementation], *command]


def _is_mpirun(first: list[str]) -> bool:
    return bool(first) and first[0].rsplit("/", 1)[-1] in ("mpirun", "mpiexec")


def build_mpijob(options: SubmitOptions) -> dict[str, Any]:
    """The MPIJob manifest for ``options``."""
    limits: dict[str, str] = {}
    if options.gpus:
        limits[keys.GPU_RESOURCE] = str(options.gpus)
    if options.cpu:
        limits["cpu"] = options.cpu
    if options.memory:
        limits["memory"] = options.memory
    worker: dict[str, Any] = {"name": "worker", "image": options.image}
    if limits:
        worker["resources"] = {"limits": limits}
    launcher = {"name": "launcher", "image": options.image, "command": launcher_command(options)}
    metadata: dict[str, Any] = {"name": options.name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    if options.gputopology:
        metadata["annotations"] = {keys.GPU_TOPOLOGY: "true"}
    run_policy: dict[str, Any] = {"cleanPodPolicy": keys.CLEAN_POD_RUNNING}
    if options.gang:
        run_policy["schedulingPolicy"] = {"minAvailable": options.workers + 1}
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": slots_per_worker(options),
            "mpiImplementation": options.implementation,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                keys.REPLICA_LAUNCHER: _replica(1, launcher, options.annotations),
                keys.REPLICA_WORKER: _replica(options.workers, worker, options.annotations),
            },
        },
    }


def _replica(replicas: int, container: dict[str, Any], annotations: Mapping[str, str]) -> Any:
    template: dict[str, Any] = {"spec": {"containers": [container]}}
    if annotations:
        template["metadata"] = {"annotations": dict(annotations)}
    return {"replicas": replicas, "template": template}


#: Arena's names of the MPIJob type (``arena submit mpijob``, ``arena get --type mpi``).
JOB_TYPES = ("mpijob", "mpi")


def without_job_type(command: Sequence[str]) -> tuple[str, ...]:
    """The command without arena's job type in front (``submit mpijob --name ... CMD``)."""
    if len(command) > 1 and command[0].lower() in JOB_TYPES:
        return tuple(command[1:])
    return tuple(command)


def gang_note(options: SubmitOptions) -> str | None:
    """What ``--gang`` does for this job where that may be nothing."""
    if not options.gang or options.gputopology:
        return None
    return (
        f"--gang sets schedulingPolicy.minAvailable={options.workers + 1}; it takes effect "
        "only where the operator runs a gang scheduler (--gang-scheduling: Volcano or "
        "scheduler-plugins). Without one, all-or-nothing admission is the operator's own and "
        "applies to --gputopology jobs; this job's pods are scheduled one by one"
    )


def parse_pairs(values: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; ValueError names the first one without ``=``."""
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise ValueError(f"{value!r} is not KEY=VALUE")
        pairs[key] = rest
    return pairs


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as ``kubectl apply -f`` reads it, keys in the order they were built."""
    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)
