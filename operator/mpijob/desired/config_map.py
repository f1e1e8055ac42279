"""The ConfigMap holding the MPI hostfile and Horovod's ``discover_hosts.sh``.

The hostfile lists every desired host (so it follows scaling); ``discover_hosts.sh`` lists the
worker pods that are Running right now (so elastic Horovod follows them). Recomputed by the
reconcile loop on every sync of an unfinished job, and updated whenever ``data`` differs.
:func:`size_errors` refuses a job whose data would exceed what the API server stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.api.errors import FieldError, invalid
from mpijob.desired import names

HOSTFILE_KEY = "hostfile"
DISCOVER_HOSTS_KEY = "discover_hosts.sh"

#: The API server refuses a ConfigMap whose data exceeds this many bytes (``MaxSecretSize``,
#: which ConfigMaps share), and a request body beyond 3 MiB with 413 before it validates.
MAX_DATA_BYTES = 1024 * 1024

#: Where a summary of a ConfigMap (:func:`summary_data`) holds its data's digests.
DIGESTS = "dataDigests"
#: The digest entry that says the ConfigMap holds keys of someone else's (never a ConfigMap
#: key: those are non-empty).
OTHER_KEYS = ""


def digests(data: Mapping[str, Any]) -> dict[str, str]:
    """A digest of each of the operator's keys' values, and :data:`OTHER_KEYS` when ``data``
    has keys of anyone else's: what the caches keep of a ConfigMap's data and what the sync
    compares. The values can be a MiB (the hostfile of a big job) and anyone with ``edit`` in
    the namespace can write more under other keys; a digest is 32 bytes whatever they hold."""
    out = {
        k: hashlib.blake2b(str(data[k]).encode(), digest_size=16).hexdigest()
        for k in (HOSTFILE_KEY, DISCOVER_HOSTS_KEY)
        if k in data
    }
    if any(k not in (HOSTFILE_KEY, DISCOVER_HOSTS_KEY) for k in data):
        out[OTHER_KEYS] = "present"
    return out


def data_digests(config_map: Mapping[str, Any]) -> dict[str, str]:
    """The data digests of a ConfigMap: its cache summary's, or computed from a whole one (the
    object a create returned, until its watch event files the summary)."""
    if DIGESTS in config_map:
        return dict(config_map[DIGESTS])
    return digests(config_map.get("data") or {})


def fqdn(job: MPIJob, host: str, cluster_domain: str = "") -> str:
    """``<host>.<job>.<ns>.svc``, with ``.<cluster_domain>`` appended when one is given."""
    name = f"{host}.{job.name}.{job.namespace}.svc"
    return f"{name}.{cluster_domain}" if cluster_domain else name


def hostfile(job: MPIJob, cluster_domain: str = "") -> str:
    """One line per host with its slots: the launcher first if it works, then every worker."""
    hosts = [names.launcher_name(job)] if job.spec.launcher_is_worker else []
    hosts += names.worker_names(job)
    slots = job.spec.slots_per_worker if job.spec.slots_per_worker is not None else 1
    if job.spec.mpi_implementation == keys.IMPL_OPENMPI:
        line = "{} slots={}\n"
    elif job.spec.mpi_implementation in (keys.IMPL_INTEL, keys.IMPL_MPICH):
        line = "{}:{}\n"
    else:
        return ""
    return "".join(line.format(fqdn(job, host, cluster_domain), slots) for host in hosts)


def discover_hosts(
    job: MPIJob, running_worker_pod_names: Sequence[str], cluster_domain: str = ""
) -> str:
    """A shell script echoing the launcher (if it works) and each Running worker, sorted."""
    hosts = [names.launcher_name(job)] if job.spec.launcher_is_worker else []
    hosts += sorted(running_worker_pod_names)
    return "#!/bin/sh\n" + "".join(f"echo {fqdn(job, h, cluster_domain)}\n" for h in hosts)


def _digits_total(count: int) -> int:
    """Characters needed to write 0, 1, ..., count-1 in decimal, without writing them."""
    total, width, low = 0, 1, 0
    while low < count:
        high = min(count, 10**width)
        total += (high - low) * width
        low, width = high, width + 1
    return total


def data_bytes(job: MPIJob, cluster_domain: str = "") -> int:
    """The size the ConfigMap's data reaches once every worker runs, counted, not built: a job
    asking for millions of workers must not make the operator write millions of lines.

    Each host's name appears twice, once in the hostfile and once in discover_hosts.sh.
    """
    workers = max(job.spec.worker_replicas, 0)
    slots = job.spec.slots_per_worker if job.spec.slots_per_worker is not None else 1
    tail = (
        f" slots={slots}\n" if job.spec.mpi_implementation == keys.IMPL_OPENMPI else f":{slots}\n"
    )
    per_host = len(tail) + len("echo \n")
    stem = len(fqdn(job, names.worker_name(job, 0), cluster_domain)) - len("0")
    size = workers * (2 * stem + per_host) + 2 * _digits_total(workers)
    if job.spec.launcher_is_worker:
        size += 2 * len(fqdn(job, names.launcher_name(job), cluster_domain)) + per_host
    return size + len("#!/bin/sh\n") + len(HOSTFILE_KEY) + len(DISCOVER_HOSTS_KEY)


def size_errors(job: MPIJob, cluster_domain: str = "") -> list[FieldError]:
    """The job's hostfile would not fit in a ConfigMap: say which field and the limit."""
    size = data_bytes(job, cluster_domain)
    if size <= MAX_DATA_BYTES:
        return []
    path = f"spec.mpiReplicaSpecs[{keys.REPLICA_WORKER}].replicas"
    detail = (
        f"the hostfile and discover_hosts.sh of this many workers take {size} bytes, beyond the "
        f"{MAX_DATA_BYTES} bytes the API server accepts in the ConfigMap "
        f'"{names.config_map_name(job)}"; use fewer workers, a shorter job name or namespace'
    )
    return [invalid(path, job.spec.worker_replicas, detail)]


def build_config_map(
    job: MPIJob, running_worker_pod_names: Sequence[str], cluster_domain: str = ""
) -> dict[str, Any]:
    """The desired v1 ConfigMap of ``job``, given the names of its Running worker pods."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.child_metadata(job, names.config_map_name(job), names.app_labels(job)),
        "data": {
            HOSTFILE_KEY: hostfile(job, cluster_domain),
            DISCOVER_HOSTS_KEY: discover_hosts(job, running_worker_pod_names, cluster_domain),
        },
    }
