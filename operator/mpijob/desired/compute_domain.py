"""The ComputeDomain of a job placed across nodes of one NVLink clique, and its workers' claim.

Nodes of a multi-node NVLink domain (GB200 NVL72 and the like) reach each other's GPUs over
NVLink only through IMEX channels, which NVIDIA's DRA driver runs per ComputeDomain
(``resource.nvidia.com/v1beta1``). For such a job the operator creates one ComputeDomain named
``<job>-compute-domain``, owned by the MPIJob (it goes with the job through garbage
collection); the driver then creates the ResourceClaimTemplate named in its
``spec.channel.resourceClaimTemplate.name``, and every worker claims one channel from it.
``numNodes`` is left 0 (deprecated by the driver). Pure: built by the admission pass, merged
into worker pods by :mod:`mpijob.desired.sync`.
"""

from __future__ import annotations

from mpijob import keys
from mpijob.api import JSON


def domain_name(job_name: str) -> str:
    return f"{job_name}{keys.COMPUTE_DOMAIN_SUFFIX}"


def channel_template(domain: str) -> str:
    """The ResourceClaimTemplate the driver creates for a ComputeDomain's channels."""
    return f"{domain}{keys.CHANNEL_TEMPLATE_SUFFIX}"


def compute_domain(job_name: str, namespace: str, job_uid: str) -> JSON:
    """The ComputeDomain of a job, owned by it."""
    name = domain_name(job_name)
    return {
        "apiVersion": keys.COMPUTE_DOMAIN_API_VERSION,
        "kind": keys.COMPUTE_DOMAIN_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {keys.LABEL_JOB_NAME: job_name},
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND,
                    "name": job_name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": channel_template(name)},
                "allocationMode": "Single",
            },
        },
    }


def owned_by(obj: JSON, job_uid: str) -> bool:
    """Whether a live ComputeDomain is the job's own (a same-named one of another is not)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == job_uid for ref in refs)


def with_channel(pod: JSON, template: str) -> None:
    """Give a worker pod one IMEX channel from ``template``, in every container."""
    spec = pod.setdefault("spec", {})
    entry = {"name": keys.CHANNEL_CLAIM, "resourceClaimTemplateName": template}
    claims = [c for c in spec.get("resourceClaims") or [] if c.get("name") != keys.CHANNEL_CLAIM]
    spec["resourceClaims"] = [*claims, entry]
    for container in spec.get("containers") or []:
        resources = container.setdefault("resources", {})
        refs = [r for r in resources.get("claims") or [] if r.get("name") != keys.CHANNEL_CLAIM]
        resources["claims"] = [*refs, {"name": keys.CHANNEL_CLAIM}]
