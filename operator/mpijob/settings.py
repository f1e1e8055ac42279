"""The operator's configuration, as the command line sets it. Pure data; no I/O.

Flags mirror upstream mpi-operator's where they mean something here (``--namespace``,
``--cluster-domain``, ``--gang-scheduling``, ``--monitoring-port``, ``--lock-namespace``,
``--kube-api-qps``/``--kube-api-burst``, ``--threadiness``). Built by :mod:`mpijob.cli`, read by
the handlers through Kopf's ``memo``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpijob import keys


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces (or globs) to watch; empty means the whole cluster."""

    cluster_domain: str = ""
    """Suffix of hostfile and discover_hosts.sh FQDNs: ``<pod>.<job>.<ns>.svc.<domain>``."""

    gang_scheduling: str = ""
    """``""`` off, ``volcano``, or the schedulerName of a Coscheduling scheduler."""

    monitoring_port: int = 8080
    """Port of ``/metrics`` and the readiness probe, ``/readyz``; 0 turns the server off."""

    health_port: int = 8081
    """Port of the liveness probe, ``/healthz``, which Kopf's probe server answers on the event
    loop; 0 turns it off. Another port than ``monitoring_port``."""

    lock_namespace: str = "mpi-operator"
    """Namespace of the leader-election Lease."""

    lock_name: str = "mpijob-operator"
    """Name of the leader-election Lease. Differs from upstream's ``mpi-operator`` on purpose:
    the two operators must never share a lock, and must never both manage the same jobs."""

    leader_elect: bool = True
    """Elect one active replica through a Lease; off only for a single process (tests, dev)."""

    controller_names: tuple[str, ...] = (keys.MANAGED_BY_UPSTREAM,)
    """``spec.runPolicy.managedBy`` values this operator reconciles (absent always counts)."""

    kube_api_qps: float = 50.0
    """Client-side request rate limit (requests/s); 0 disables it."""

    kube_api_burst: int = 100
    """Client-side burst above the rate limit."""

    threadiness: int = 8
    """Jobs reconciled concurrently."""

    default_clean_pod_policy: str = keys.CLEAN_POD_NONE
    """``spec.runPolicy.cleanPodPolicy`` of a job that sets none. Upstream's default, ``None``,
    leaves a finished job's running workers (and their GPUs) in place; ``Running`` or ``All``
    is a deliberate difference a cluster admin opts into."""

    gpu_topology_default: bool = False
    """Place every GPU job topology-aware, as if it had ``mpijob.io/gpu-topology: "true"``."""

    gpu_binding: str = "auto"
    """How placed workers get their chosen GPUs: ``dra`` (ResourceClaims pinned by UUID),
    ``annotations`` (the device plugin picks), or ``auto`` (``dra`` where the cluster serves it);
    see :mod:`mpijob.desired.gpu_binding`."""

    inter_node_gbps: float = 12.5
    """Bandwidth (GB/s per direction) between two nodes, bounding rings that span nodes."""

    placement_release_seconds: float = 300.0
    """How long a placed worker may stay unschedulable before its job's PlacementDecision is
    released (a worker the API server refuses releases it at once); a released job then waits as
    long before it is queued again, so the jobs behind it get the GPUs it could not use."""

    fabric: str = ""
    """The fabric between nodes: a shipped one by name (``nvl72``, ``hgx-h100-rail``,
    ``dgx1-v100``) or a YAML/JSON file of levels (docs/placement.md); empty: none, every
    inter-node hop at ``inter_node_gbps``."""

    fractional_gpus: bool = False
    """Place and limit GPU shares (``aliyun.com/gpu-mem``, ``aliyun.com/gpu-core.percentage``)
    of any pod at creation, through admission webhooks this process serves."""

    gpu_share_runtime_class: str = ""
    """RuntimeClass written into a GPU-share pod that names none (``spec.runtimeClassName``, at
    admission: the field cannot change later); empty: none is added. The share reaches its
    container as ``NVIDIA_VISIBLE_DEVICES``, which only the nvidia container runtime reads: set
    it to that runtime's RuntimeClass (``nvidia`` where the NVIDIA GPU Operator made it) unless
    the nodes run the nvidia runtime by default."""

    webhook_port: int = 9443
    """Port of the HTTPS webhook server (with ``fractional_gpus``)."""

    webhook_service: str = "mpijob-operator-webhook"
    """Service in ``lock_namespace`` through which the API server reaches the webhooks."""

    webhook_url: str = ""
    """Reach the webhooks at this HTTPS URL instead of through the Service (an API server that
    cannot reach Service IPs, e.g. the local cluster); its host goes into the certificate."""

    webhook_client_ca: str = ""
    """PEM file of the CA that signs the API server's webhook client certificate: the webhooks
    then answer only clients that present a certificate it signed (TLS client authentication;
    the API server presents one through its admission configuration). Empty: any client that
    reaches the port may call them (a warning at start)."""

    webhook_cert_dir: str = ""
    """Directory holding the webhooks' serving certificate (``tls.crt``, ``tls.key``, and
    ``ca.crt`` when a CA signed it), e.g. a mounted Secret: every replica then serves the one
    certificate the configurations' CA bundle names. Empty: a self-signed certificate made at
    every start (one replica)."""

    launch_image: str = ""
    """The image whose ``/usr/local/bin/mpijob-launch`` the pods of a job annotated
    ``mpijob.io/launch: agent`` copy in (docs/launch.md). Empty: the operator's own image, read
    from its own pod at start (``POD_NAME``); outside a pod, none, and such jobs are refused
    with a message saying so."""

    kubeconfig: str | None = None
    """Path of a kubeconfig; unset means $KUBECONFIG, else in a pod its service account, else
    ~/.kube/config."""

    @property
    def cluster_wide(self) -> bool:
        return not self.namespaces
