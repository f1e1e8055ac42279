"""Worker pods: one bare Pod per index, ``<job>-worker-<i>``, running sshd by default (the
operator's launch agent with ``mpijob.io/launch: agent``).

Called by the reconcile loop for each missing index; gang and placement decoration are applied
to the returned dict afterwards by their own modules.
"""

from __future__ import annotations

from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import launch, names, ssh, template

DEFAULT_WORKER_COMMAND = ["/usr/sbin/sshd", "-De"]
#: Upstream hard-codes this domain in the workers' DNS search path.
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def build_worker(
    job: MPIJob, index: int, cluster_domain: str = "", launch_image: str = ""
) -> dict[str, Any]:
    """The desired v1 Pod of worker ``index``.

    The DNS search entry uses ``cluster_domain`` when one is given (as upstream does since its
    PR #832) and ``cluster.local`` otherwise (as upstream v0.8 always does). ``launch_image``
    holds the launch agent a job with ``mpijob.io/launch: agent`` runs instead of sshd.
    """
    name = names.worker_name(job, index)
    pod = template.copy_template(job.spec.worker)
    # With the launcher in the hostfile as host 0, workers are numbered from 1.
    replica_index = index + 1 if job.spec.launcher_is_worker else index
    template.add_labels(
        pod,
        {**names.worker_selector(job), keys.LABEL_REPLICA_INDEX: str(replica_index)},
    )
    template.set_host(pod, job, name)
    spec = pod["spec"]
    dns_config = spec.get("dnsConfig") or {}
    search = f"{job.name}.{job.namespace}.svc.{cluster_domain or DEFAULT_CLUSTER_DOMAIN}"
    spec["dnsConfig"] = {**dns_config, "searches": [*(dns_config.get("searches") or []), search]}
    spec["restartPolicy"] = template.restart_policy(job.spec.worker)
    container = spec["containers"][0]
    if not container.get("command") and not container.get("args"):
        container["command"] = list(DEFAULT_WORKER_COMMAND)
    template.append_env(pod, [template.env_var(template.ENV_JOB_ROLE, keys.ROLE_WORKER)])
    if job.launch_agent:
        launch.add_to_worker(job, spec, launch_image)
    else:
        ssh.add_ssh_volume(job, spec)
    metadata = pod["metadata"]
    pod_metadata: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": metadata["labels"],
    }
    if metadata.get("annotations"):
        pod_metadata["annotations"] = metadata["annotations"]
    pod_metadata["ownerReferences"] = [names.owner_reference(job)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": spec}
