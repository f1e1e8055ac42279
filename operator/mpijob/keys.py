"""Every label, annotation, condition type, reason and name suffix the operator reads or writes.

Upstream (Kubeflow mpi-operator) keys are kept byte-for-byte so that a cluster can switch
operators without relabelling anything. Our own extensions live under one prefix, ``mpijob.io/``.
Imported by every layer; imports nothing.
"""

from typing import Final

# --- Upstream API identity -------------------------------------------------------------------
GROUP: Final = "kubeflow.org"
VERSION: Final = "v2beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "MPIJob"
PLURAL: Final = "mpijobs"

#: The value upstream writes into ``training.kubeflow.org/operator-name``; kept so that
#: Services and selectors match pods created by either operator.
OPERATOR_NAME: Final = "mpi-operator"
#: ``spec.runPolicy.managedBy`` values this operator answers to (plus ``--controller-name``).
MANAGED_BY_UPSTREAM: Final = "kubeflow.org/mpi-operator"
MANAGED_BY_MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
#: Kueue's label naming the LocalQueue of a job it queues (read only: Kueue admits such a job by
#: unsuspending it).
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
#: Event source component, as upstream reports it.
EVENT_COMPONENT: Final = "mpi-job-controller"

# --- Upstream labels -------------------------------------------------------------------------
LABEL_OPERATOR_NAME: Final = "training.kubeflow.org/operator-name"
LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_JOB_ROLE: Final = "training.kubeflow.org/job-role"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_APP: Final = "app"

ROLE_LAUNCHER: Final = "launcher"
ROLE_WORKER: Final = "worker"

# --- Gang scheduling (upstream) --------------------------------------------------------------
VOLCANO_GROUP_NAME_ANNOTATION: Final = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_NAME_ANNOTATION: Final = "scheduling.volcano.sh/queue-name"
VOLCANO_SCHEDULER_NAME: Final = "volcano"
SCHED_PLUGINS_POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
VOLCANO_POD_GROUP_API_VERSION: Final = "scheduling.volcano.sh/v1beta1"
SCHED_PLUGINS_POD_GROUP_API_VERSION: Final = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_PLURAL: Final = "podgroups"
#: What the Volcano API server defaults an empty ``spec.queue`` to.
VOLCANO_DEFAULT_QUEUE: Final = "default"

# --- Child names (upstream) ------------------------------------------------------------------
CONFIG_SUFFIX: Final = "-config"
SSH_SUFFIX: Final = "-ssh"
LAUNCHER_SUFFIX: Final = "-launcher"
WORKER_SUFFIX: Final = "-worker"

# --- Upstream condition types and reasons ----------------------------------------------------
COND_CREATED: Final = "Created"
COND_RUNNING: Final = "Running"
COND_RESTARTING: Final = "Restarting"
COND_SUCCEEDED: Final = "Succeeded"
COND_SUSPENDED: Final = "Suspended"
COND_FAILED: Final = "Failed"

REASON_CREATED: Final = "MPIJobCreated"
REASON_RUNNING: Final = "MPIJobRunning"
REASON_SUCCEEDED: Final = "MPIJobSucceeded"
REASON_SUSPENDED: Final = "MPIJobSuspended"
REASON_RESUMED: Final = "MPIJobResumed"
REASON_FAILED: Final = "MPIJobFailed"
REASON_EVICTED: Final = "MPIJobEvicted"
REASON_VALIDATION_ERROR: Final = "ValidationError"
#: Our condition (True while the spec fails the operator's validation; removed once fixed), so
#: that ``kubectl describe`` shows what upstream only reports in a Warning event.
COND_INVALID: Final = "Invalid"
REASON_RESOURCE_EXISTS: Final = "ErrResourceExists"
REASON_SET_RESTART_POLICY: Final = "SetPodTemplateRestartPolicy"

# --- Upstream spec values --------------------------------------------------------------------
#: Keys of ``spec.mpiReplicaSpecs`` and ``status.replicaStatuses``.
REPLICA_LAUNCHER: Final = "Launcher"
REPLICA_WORKER: Final = "Worker"

IMPL_OPENMPI: Final = "OpenMPI"
IMPL_INTEL: Final = "Intel"
IMPL_MPICH: Final = "MPICH"

CLEAN_POD_NONE: Final = "None"
CLEAN_POD_RUNNING: Final = "Running"
CLEAN_POD_ALL: Final = "All"

LAUNCHER_AT_STARTUP: Final = "AtStartup"
LAUNCHER_WAIT_FOR_WORKERS_READY: Final = "WaitForWorkersReady"

RESTART_ALWAYS: Final = "Always"
RESTART_ON_FAILURE: Final = "OnFailure"
RESTART_NEVER: Final = "Never"
RESTART_EXIT_CODE: Final = "ExitCode"

DEFAULT_SSH_AUTH_MOUNT_PATH: Final = "/root/.ssh"

# --- Our extensions: one prefix --------------------------------------------------------------
PREFIX: Final = "mpijob.io/"

#: On an MPIJob: ``"true"`` opts the job into topology-aware placement.
#: On a Node: the compact versioned JSON of the node's GPU topology, published by the agent.
GPU_TOPOLOGY: Final = PREFIX + "gpu-topology"
#: On a placed worker pod: comma-separated GPU indices on its node.
GPU_IDS: Final = PREFIX + "gpu-ids"
#: On a placed worker pod: comma-separated GPU UUIDs, when the topology knows them.
GPU_UUIDS: Final = PREFIX + "gpu-uuids"
#: On a placed worker pod: the job's ring bottleneck bandwidth, GB/s per direction.
RING_BANDWIDTH: Final = PREFIX + "ring-bandwidth"
#: On an MPIJob: a one-line summary of the placement decision, for people.
PLACEMENT: Final = PREFIX + "placement"
#: On an MPIJob: the placement decision as compact JSON (``{"v":1,"ring":..,"workers":[[node,
#: [gpu,..]],..]}``): the GPUs it holds, readable by a restarted operator before pods exist.
PLACEMENT_DECISION: Final = PREFIX + "placement-decision"

#: Node label that opts a node into topology-aware placement (the value ``topology``);
#: ``default`` leaves the node to ordinary scheduling. Kept as the established key.
NODE_GPU_SCHEDULE_LABEL: Final = "ack.node.gpu.schedule"
NODE_GPU_SCHEDULE_TOPOLOGY: Final = "topology"
NODE_GPU_SCHEDULE_DEFAULT: Final = "default"

#: Extended resource name of whole GPUs.
GPU_RESOURCE: Final = "nvidia.com/gpu"

# --- Local simulation (kwok Stages of the local cluster) -------------------------------------
#: On a pod: a Go duration ("5s"); kwok moves the Running pod to Succeeded after it.
SIM_SUCCEED_AFTER: Final = PREFIX + "sim-succeed-after"
#: On a pod: a Go duration; kwok moves the Running pod to Failed (exit code 1) after it.
SIM_FAIL_AFTER: Final = PREFIX + "sim-fail-after"
#: On a pod with SIM_FAIL_AFTER: the pod's ``status.reason`` when it fails (e.g. ``Evicted``).
SIM_FAIL_REASON: Final = PREFIX + "sim-fail-reason"
#: On a pod: a Go duration; the pod runs unready for that long, then becomes Ready.
SIM_READY_AFTER: Final = PREFIX + "sim-ready-after"
#: On a pod: a Go duration; once deleted, the pod stays terminating that long.
SIM_TERMINATE_AFTER: Final = PREFIX + "sim-terminate-after"

# --- Our gang admission (clusters without a gang scheduler) ----------------------------------
#: Condition type: False while the job waits for its whole gang to fit, True once admitted.
#: Upstream's condition types are untouched; this one sits beside them.
COND_GANG_ADMITTED: Final = "GangAdmitted"
#: ``GangAdmitted=False``: the job does not fit yet; the message says what is missing.
REASON_GANG_WAITING: Final = "GangWaiting"
#: ``GangAdmitted=True`` and the Normal Event posted at admission.
REASON_GANG_ADMITTED: Final = "GangAdmitted"
#: ``Failed=True`` (and ``GangAdmitted=False``) when ``scheduleTimeoutSeconds`` passed while
#: waiting; also the Warning Event's reason.
REASON_GANG_SCHEDULE_TIMEOUT: Final = "GangScheduleTimeout"
#: ``GangAdmitted=False`` and a Warning Event: the job fits, but the API server refuses to store
#: its placement decision on the MPIJob (e.g. its annotations are near their size limit).
REASON_DECISION_REFUSED: Final = "PlacementNotRecorded"
