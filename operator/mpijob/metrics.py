"""Every Prometheus metric the operator exports, in one place.

Upstream mpi-operator's names are kept unchanged (``mpi_operator_jobs_created_total`` and the
rest), so existing dashboards and alerts keep working; our additions share the prefix. No metric
carries a per-job label except upstream's ``mpi_operator_job_info``: jobs come and go, series
would not. Metrics live in the default registry next to the process collector (memory, CPU), and
``serve`` exposes them on one port beside the probes its caller names: the operator's readiness
(its liveness is Kopf's, on ``--health-port``), the node agent's liveness and readiness.

The per-GPU share gauges (``mpi_operator_gpu_share_*``) are labelled by node and GPU index: one
series per GPU of a ``core_mem`` node, a bounded set (the opted-in fleet), removed with the node.

The node agent serves the same registry on its health port; its one metric of its own carries
the ``mpijob_agent_`` prefix. Both "not honoured" counters are labelled by ``binding`` (``dra``
or ``annotations``, the ``--gpu-binding`` modes), so a process that never counts one exports no
series of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# --- upstream -----------------------------------------------------------------------------------
JOBS_CREATED: Final = Counter("mpi_operator_jobs_created", "Counts number of MPI jobs created")
JOBS_SUCCESSFUL: Final = Counter(
    "mpi_operator_jobs_successful", "Counts number of MPI jobs successful"
)
JOBS_FAILED: Final = Counter("mpi_operator_jobs_failed", "Counts number of MPI jobs failed")
JOB_INFO: Final = Gauge(
    "mpi_operator_job_info",
    "Information about MPIJob",
    ["launcher", "namespace"],
)
IS_LEADER: Final = Gauge(
    "mpi_operator_is_leader", "Is this client the leader of this mpi-operator client set?"
)

# --- reconcile ----------------------------------------------------------------------------------
RECONCILE_SECONDS: Final = Histogram(
    "mpi_operator_reconcile_duration_seconds",
    "Time one reconcile of one MPIJob took, from dequeue to status written",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS: Final = Counter(
    "mpi_operator_reconcile_errors", "Reconciles that failed and were re-queued with backoff"
)
QUEUE_DEPTH: Final = Gauge("mpi_operator_workqueue_depth", "MPIJob keys waiting to be reconciled")
API_REQUESTS: Final = Counter(
    "mpi_operator_api_requests", "Requests sent to the Kubernetes API server", ["verb"]
)
EVENTS_DROPPED: Final = Counter(
    "mpi_operator_events_dropped",
    "Events not sent because 1,000 were waiting already (they came faster than the API rate "
    "limit left room for)",
)
JOBS_RUNNING: Final = Gauge("mpi_operator_jobs_running", "MPIJobs whose Running condition is True")
TIME_TO_RUNNING: Final = Histogram(
    "mpi_operator_job_time_to_running_seconds",
    "Time from an MPIJob's creation to its Running condition",
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
JOB_DURATION: Final = Histogram(
    "mpi_operator_job_duration_seconds",
    "Time from an MPIJob's start to its completion (succeeded or failed)",
    buckets=(10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 24 * 3600),
)
JOB_FAILURES: Final = Counter(
    "mpi_operator_job_failures",
    "Failures of MPIJobs and of their workers, by the kubelet's reason (OOMKilled, Error, "
    "Evicted, DeadlineExceeded, ImagePullBackOff, ...), else the launcher Job's: each failure "
    "of a worker while its job runs (every kill of a restarting container), and each failed "
    "job by its first pod failure unless that was counted already; a reason outside the known "
    "set counts as Other",
    ["reason"],
)
TIME_TO_WORKERS_READY: Final = Histogram(
    "mpi_operator_job_time_to_workers_ready_seconds",
    "Time from an MPIJob's creation until every one of its workers was Ready (pods' Ready "
    "transition times), once per job",
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
TIME_TO_LAUNCHER_RUNNING: Final = Histogram(
    "mpi_operator_job_time_to_launcher_running_seconds",
    "Time from an MPIJob's creation until its launcher's container first ran, once per job",
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
FINISHED_JOBS_GPUS_HELD: Final = Gauge(
    "mpi_operator_finished_jobs_gpus_held",
    "GPUs requested by Running or Pending worker pods of MPIJobs that have finished: workers "
    "that cleanPodPolicy None (upstream's default) leaves in place, holding GPUs nothing uses",
)

# --- placement ----------------------------------------------------------------------------------
PLACEMENT_SECONDS: Final = Histogram(
    "mpi_operator_placement_decision_seconds",
    "Time to decide the node and GPU set of every worker of one job",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
PLACEMENT_RING_GBPS: Final = Histogram(
    "mpi_operator_placement_ring_bandwidth_gbps",
    "Ring bottleneck bandwidth (GB/s per direction) of each placed job",
    buckets=(1, 5, 10, 12.5, 20, 25, 40, 50, 75, 100, 150, 200, 300, 450),
)
JOBS_WAITING_GPUS: Final = Gauge(
    "mpi_operator_jobs_waiting_for_gpus", "Topology-placed MPIJobs that do not fit yet"
)
PLACEMENTS_NOT_HONOURED: Final = Counter(
    "mpi_operator_placements_not_honoured",
    "Placements the cluster did not carry out as decided: a placed worker whose containers hold "
    "other GPUs than were chosen for it, as the node agent reports (mpijob.io/gpu-actual "
    "appears or changes), or (dra binding) a pinned GPU taken before its claim was allocated, "
    "the job then placed anew",
    ["binding"],
)
for _binding in ("dra", "annotations"):  # exported at 0 from the start, for rates and alerts
    PLACEMENTS_NOT_HONOURED.labels(binding=_binding)

# --- node agent ---------------------------------------------------------------------------------
AGENT_PLACEMENTS_NOT_HONOURED: Final = Counter(
    "mpijob_agent_placements_not_honoured",
    "Placed pods on this node whose containers hold other GPUs than were chosen for them, "
    "according to the kubelet's pod-resources API; once per pod and set of GPUs",
    ["binding"],
)

# --- gang admission -----------------------------------------------------------------------------
GANG_WAITING: Final = Gauge(
    "mpi_operator_gang_waiting_jobs", "MPIJobs whose gang is not admitted or not fully bound"
)
GANG_BIND_SECONDS: Final = Histogram(
    "mpi_operator_gang_bind_seconds",
    "Time from an MPIJob's creation to all of its pods bound to nodes",
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
ADMISSION_PASS_SECONDS: Final = Histogram(
    "mpi_operator_admission_pass_seconds",
    "Wall time of one pass of our topology admission over every waiting job (the line rebuilt, "
    "every job placed or told why it waits, the decisions written)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60),
)
GANG_TIMEOUTS: Final = Counter(
    "mpi_operator_gang_timeouts", "MPIJobs failed because their gang was not admitted in time"
)

# --- GPU shares (--fractional-gpus) -------------------------------------------------------------
GPU_SHARES: Final = Gauge(
    "mpi_operator_gpu_shares",
    "GPU shares the ledger holds (admitted pods and workers reserved for their MPIJob); 0 "
    "without --fractional-gpus",
)
GPU_SHARE_WAITING: Final = Gauge(
    "mpi_operator_gpu_share_waiting_pods",
    "Pods admitted behind the mpijob.io/gpu-share scheduling gate: no eligible GPU and node had "
    "room for their share yet",
)
GPU_SHARE_MEMORY: Final = Gauge(
    "mpi_operator_gpu_share_memory_gib",
    "GiB of GPU memory held by shares, per core_mem node and GPU index",
    ["node", "gpu"],
)
GPU_SHARE_PERCENTAGE: Final = Gauge(
    "mpi_operator_gpu_share_percentage",
    "Percent of a GPU's compute held by shares, per core_mem node and GPU index",
    ["node", "gpu"],
)
GPU_SHARE_CLIENTS: Final = Gauge(
    "mpi_operator_gpu_share_clients",
    "MPS clients (containers) holding a share, per core_mem node and GPU index (at most 48)",
    ["node", "gpu"],
)


def serve(
    port: int,
    probes: Mapping[str, Callable[[], bool]],
    registry: CollectorRegistry = REGISTRY,
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` and each of ``probes`` (path: whether it answers 200, else 500) on
    0.0.0.0:``port`` from a daemon thread. OSError when the port cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if path.startswith("/metrics"):
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path in probes:
                ok = probes[path]()
                body, ctype = (b"ok" if ok else b"unhealthy"), "text/plain"
                code = 200 if ok else 500
            else:
                body, ctype, code = b"not found", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes every 15 s would drown the operator's own log

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
