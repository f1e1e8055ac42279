"""The ``mpijob-operator`` command (also ``python -m mpijob``): flags in, operator running.

A thin shell over :class:`mpijob.settings.OperatorSettings` and :func:`mpijob.handlers.startup.run`.
Flag names follow upstream mpi-operator's where they mean the same thing.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import cast

import click

from mpijob import keys
from mpijob.desired.gpu_binding import FLAG_VALUES
from mpijob.platform import heap
from mpijob.settings import OperatorSettings

DEFAULTS = OperatorSettings()
"""Every flag's default is the setting's own: one place to change it."""


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx: click.Context) -> None:
    """mpijob-operator: runs kubeflow.org/v2beta1 MPIJobs, drop-in for Kubeflow's mpi-operator.

    Run `mpijob-operator run --help` for the operator's flags.
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@main.command()
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    default=None,
    metavar="PATH",
    help="Kubeconfig to use. Default: $KUBECONFIG; inside a pod without one, the pod's "
    "service account; else ~/.kube/config.",
)
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    envvar="KUBEFLOW_NAMESPACE",
    metavar="NS",
    help="Only watch this namespace (repeatable; globs like 'team-*' work). "
    "Default: all namespaces. Env: KUBEFLOW_NAMESPACE.",
)
@click.option(
    "--cluster-domain",
    default=DEFAULTS.cluster_domain,
    metavar="DOMAIN",
    help="Cluster DNS domain appended to hostfile names: "
    "<pod>.<job>.<ns>.svc.<DOMAIN>. Default: none (<pod>.<job>.<ns>.svc).",
)
@click.option(
    "--gang-scheduling",
    default=DEFAULTS.gang_scheduling,
    metavar="SCHEDULER",
    help="Create PodGroups and hand pods to a gang scheduler: 'volcano' for Volcano "
    "(scheduling.volcano.sh), or the schedulerName of a scheduler-plugins "
    "Coscheduling scheduler (scheduling.x-k8s.io), e.g. 'default-scheduler'. "
    "Default: off.",
)
@click.option(
    "--monitoring-port",
    default=DEFAULTS.monitoring_port,
    show_default=True,
    type=int,
    help="Port serving /metrics (Prometheus) and the readiness probe /readyz. 0 turns it off.",
)
@click.option(
    "--health-port",
    default=DEFAULTS.health_port,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port where Kopf's probe server answers the liveness probe /healthz (the event loop "
    "beat within 30 s), on the event loop itself. 0 turns it off.",
)
@click.option(
    "--lock-namespace",
    default=DEFAULTS.lock_namespace,
    show_default=True,
    help="Namespace of the leader-election Lease (it must exist).",
)
@click.option(
    "--lock-name",
    default=DEFAULTS.lock_name,
    show_default=True,
    help="Name of the leader-election Lease.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=DEFAULTS.leader_elect,
    show_default=True,
    help="Elect one active replica through a Lease. Turn off only when exactly one process runs.",
)
@click.option(
    "--controller-name",
    "controller_names",
    multiple=True,
    default=DEFAULTS.controller_names,
    show_default=True,
    help="spec.runPolicy.managedBy values this operator reconciles (repeatable). "
    "Jobs without managedBy are always reconciled; others are left alone.",
)
@click.option(
    "--kube-api-qps",
    default=DEFAULTS.kube_api_qps,
    show_default=True,
    type=float,
    help="Client-side limit of API requests per second (0: unlimited), per API client as "
    "upstream's: the core and batch kinds (Events included), MPIJobs, each PodGroup API and "
    "the leader-election Lease each have their own. Events wait while other requests of "
    "their client wait for the limit.",
)
@click.option(
    "--kube-api-burst",
    default=DEFAULTS.kube_api_burst,
    show_default=True,
    type=int,
    help="Requests allowed in a burst above --kube-api-qps.",
)
@click.option(
    "--threadiness",
    default=DEFAULTS.threadiness,
    show_default=True,
    type=click.IntRange(1, 256),
    help="How many MPIJobs are reconciled concurrently.",
)
@click.option(
    "--default-clean-pod-policy",
    type=click.Choice([keys.CLEAN_POD_NONE, keys.CLEAN_POD_RUNNING, keys.CLEAN_POD_ALL]),
    default=DEFAULTS.default_clean_pod_policy,
    show_default=True,
    help="spec.runPolicy.cleanPodPolicy of a job that sets none. Upstream's default, None, "
    "leaves a finished job's running workers, and the GPUs they hold, in place (the job gets "
    f"{keys.COND_WORKERS_LEFT_RUNNING}=True); Running deletes them when the job finishes. "
    "A job's own cleanPodPolicy always wins.",
)
@click.option(
    "--gpu-topology-default/--no-gpu-topology-default",
    default=DEFAULTS.gpu_topology_default,
    show_default=True,
    help=f'Place every GPU job topology-aware, as if annotated {keys.GPU_TOPOLOGY}: "true".',
)
@click.option(
    "--gpu-binding",
    type=click.Choice(FLAG_VALUES),
    default=DEFAULTS.gpu_binding,
    show_default=True,
    help="How a topology-placed worker gets its chosen GPUs. 'dra': a ResourceClaim of "
    "NVIDIA's DRA driver (gpu.nvidia.com) pins them by UUID and replaces the pod's "
    "nvidia.com/gpu request, so the scheduler enforces the placement. 'annotations': the pod "
    f"keeps nvidia.com/gpu and carries the choice in {keys.GPU_IDS}/{keys.GPU_UUIDS} and a "
    "node affinity; the device plugin picks which GPUs of the node it gets. 'auto': 'dra' "
    f"where the API server serves {keys.DRA_API_VERSION} and the DeviceClass "
    f"{keys.NVIDIA_GPU_DRIVER} exists, else 'annotations'. The choice and its reason are "
    "logged at startup.",
)
@click.option(
    "--inter-node-bandwidth",
    "inter_node_gbps",
    default=DEFAULTS.inter_node_gbps,
    show_default=True,
    type=float,
    metavar="GBPS",
    help="Bandwidth between two nodes in GB/s per direction (12.5 = 100 Gb/s); "
    "bounds the ring of a job spread over nodes.",
)
@click.option(
    "--placement-release-seconds",
    default=DEFAULTS.placement_release_seconds,
    show_default=True,
    type=click.FloatRange(min=1),
    metavar="SECONDS",
    help="A topology-placed job whose worker stays unschedulable this long, or whose worker "
    "the API server refuses (a ResourceQuota, an invalid template), loses its placement "
    f"({keys.REASON_WORKERS_UNSCHEDULABLE} / {keys.REASON_WORKERS_REFUSED}) and waits as long "
    "before it is queued again.",
)
@click.option(
    "--fabric",
    default=DEFAULTS.fabric,
    metavar="NAME|FILE",
    help="The fabric between nodes, read from node labels: a shipped one (nvl72, "
    "hgx-h100-rail, dgx1-v100) or a YAML/JSON file of levels {levels: [{name, nodeLabel, "
    "gbps}], outsideGbps}. Jobs are then placed for their ring across NVLink cliques, leaves "
    f"and blocks, honour {keys.FABRIC_REQUIRED_LEVEL} / {keys.FABRIC_PREFERRED_LEVEL}, and a "
    "job on several nodes of one NVLink clique gets a ComputeDomain. Empty: one "
    "--inter-node-bandwidth.",
)
@click.option(
    "--launch-image",
    default=DEFAULTS.launch_image,
    metavar="IMAGE",
    help=f'The image whose mpijob-launch binary jobs annotated {keys.LAUNCH}: "agent" copy into '
    "their pods, to start ranks with no sshd. Empty: the operator's own image, read from its "
    "pod at start.",
)
@click.option(
    "--fractional-gpus/--no-fractional-gpus",
    default=DEFAULTS.fractional_gpus,
    show_default=True,
    help="Place GPU shares (aliyun.com/gpu-mem, aliyun.com/gpu-core.percentage) of any pod on "
    "one GPU of a core_mem node at creation, through admission webhooks served by the operator.",
)
@click.option(
    "--gpu-share-runtime-class",
    default=DEFAULTS.gpu_share_runtime_class,
    metavar="NAME",
    help="RuntimeClass given to a GPU-share pod that names none (with --fractional-gpus), e.g. "
    "'nvidia' where the nvidia container runtime is not the nodes' default. Default: none added.",
)
@click.option(
    "--webhook-port",
    default=DEFAULTS.webhook_port,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="HTTPS port of the admission webhooks (with --fractional-gpus).",
)
@click.option(
    "--webhook-service",
    default=DEFAULTS.webhook_service,
    show_default=True,
    metavar="NAME",
    help="Service in the lock namespace that routes the API server to the webhooks.",
)
@click.option(
    "--webhook-url",
    default=DEFAULTS.webhook_url,
    metavar="URL",
    help="Reach the webhooks at this https:// URL instead of through the Service (API servers "
    "that cannot reach Service IPs, such as the local cluster's).",
)
@click.option(
    "--webhook-client-ca",
    default=DEFAULTS.webhook_client_ca,
    metavar="FILE",
    help="PEM CA of the API server's webhook client certificate: the webhooks then answer only "
    "clients presenting a certificate it signed (docs/gpu-shares.md).",
)
@click.option(
    "--webhook-cert-dir",
    default=DEFAULTS.webhook_cert_dir,
    metavar="DIR",
    help="Serve the webhooks with tls.crt/tls.key (and ca.crt) from DIR, e.g. a mounted Secret "
    "shared by every replica; empty: a self-signed certificate made at each start.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log line format: 'text' is klog's (time, level, file, message, then logger, object "
    "and every field as key=\"value\"), 'json' one zap-style object a line (ts, level, logger, "
    "caller, msg, object, namespace, name, error) for log pipelines.",
)
@click.option("--verbose", "-v", is_flag=True, help="Log debug messages too.")
def run(**opts: object) -> None:
    """Run the operator in the foreground until interrupted."""
    _stop_at_once_while_starting()
    _without_official_client()
    heap.give_back_large_blocks()
    with _collector_paused():
        from mpijob.handlers import startup

    json_logs = opts.pop("log_format") == "json"
    verbose = bool(opts.pop("verbose"))
    for many in ("namespaces", "controller_names"):
        opts[many] = tuple(cast("tuple[str, ...]", opts[many]) or ())
    try:
        startup.run(
            OperatorSettings(**opts),  # type: ignore[arg-type]
            verbose=verbose,
            json_logs=json_logs,
        )
    except startup.StartupFailed as e:
        # One line naming what failed and where; status 1, so the kubelet restarts the pod.
        logging.getLogger("mpijob").error("Start-up failed: %s", e)
        sys.exit(1)


def _without_official_client() -> None:
    """Keep the official ``kubernetes`` package out of the operator's process.

    Kopf imports it, when installed, only to recognise its model objects; the operator hands
    Kopf plain dicts and talks to the API through its own adapter, so the package's hundreds of
    modules (about 11 MiB held for the process's life) would be dead weight. A ``None`` in
    ``sys.modules`` makes the import fail, which Kopf expects. Only in a fresh process: where
    Kopf is loaded already (a test that runs this command), it has imported the package, and
    blocking it then would only break later imports.
    """
    if "kopf" not in sys.modules:
        sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while the operator's modules load, then all they made
    frozen (never scanned again, as :func:`mpijob.handlers.startup.tune_garbage_collector` does
    for the rest of start-up).

    The imports make about 70,000 objects that live as long as the process and next to no
    garbage, and as the heap grows the collector scans it again and again: pausing it took
    the imports from 0.95 to 0.86 s of CPU on a 2-core machine (median of 15 each)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _stop_at_once_while_starting() -> None:
    """SIGTERM ends the process at once until Kopf takes it over for the graceful stop. In its
    container the operator is PID 1, which the kernel sends no default SIGTERM action: a pod
    deleted while it starts (a rollout, an uninstall) would otherwise wait out its grace period
    (30 s). Start-up holds nothing to give back (it asks for the Lease last), so an exit is all
    a stop needs; it is the same as a kill at that point."""

    def stop(signum: int, _frame: object) -> None:
        os.write(2, b"Stopped by SIGTERM during start-up\n")  # no logging: its locks
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
