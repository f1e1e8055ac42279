"""The ConfigMap holding the MPI hostfile and Horovod's ``discover_hosts.sh``.

The hostfile lists every desired host (so it follows scaling); ``discover_hosts.sh`` lists the
worker pods that are Running right now (so elastic Horovod follows them). Recomputed by the
reconcile loop on every sync of an unfinished job, and updated whenever ``data`` differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import names

HOSTFILE_KEY = "hostfile"
DISCOVER_HOSTS_KEY = "discover_hosts.sh"


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
