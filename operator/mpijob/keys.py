"""Every label, annotation, condition type, reason and name suffix the operator reads or writes.

Upstream (Kubeflow mpi-operator) keys are kept byte-for-byte so that a cluster can switch
operators without relabelling anything. Our own extensions live under one prefix, ``mpijob.io/``.
Imported by every layer; imports nothing.

A ``#:`` comment describes the constants right below it, up to the next blank line or comment; a
string under a constant describes that one alone. ``docs/reference.md`` is generated from them
(``docs/generate_reference.py``), so every constant here has one or the other.
"""

from typing import Final

# --- Upstream API identity -------------------------------------------------------------------
#: The MPIJob API exactly as upstream serves it (``mpijobs.kubeflow.org``, ``v2beta1``).
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
#: MultiKueue's ``managedBy``: valid, and such a job is left to MultiKueue (no child, no status).
MANAGED_BY_MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
#: Kueue's label naming the LocalQueue of a job it queues (read only: Kueue admits such a job by
#: unsuspending it).
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
#: Event source component, as upstream reports it.
EVENT_COMPONENT: Final = "mpi-job-controller"

# --- Upstream labels -------------------------------------------------------------------------
#: Upstream's labels on the children: the job's pods are selected by operator name, job name and
#: role; workers (and a launcher that runs as a worker) carry their replica index; the Service,
#: ConfigMap, Secret and launcher Job carry ``app: <job>``. ``replica-type`` is upstream's key,
#: which neither operator sets.
LABEL_OPERATOR_NAME: Final = "training.kubeflow.org/operator-name"
LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_JOB_ROLE: Final = "training.kubeflow.org/job-role"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_APP: Final = "app"

#: Values of ``training.kubeflow.org/job-role``.
ROLE_LAUNCHER: Final = "launcher"
ROLE_WORKER: Final = "worker"

# --- Gang scheduling (upstream) --------------------------------------------------------------
#: Upstream's gang-scheduling keys: the pod annotation naming its Volcano PodGroup and the
#: Volcano queue, Volcano's scheduler name, scheduler-plugins' pod label, and the PodGroup APIs of
#: both (one PodGroup per job, named after it).
VOLCANO_GROUP_NAME_ANNOTATION: Final = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_NAME_ANNOTATION: Final = "scheduling.volcano.sh/queue-name"
VOLCANO_SCHEDULER_NAME: Final = "volcano"
SCHED_PLUGINS_POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
VOLCANO_POD_GROUP_API_VERSION: Final = "scheduling.volcano.sh/v1beta1"
SCHED_PLUGINS_POD_GROUP_API_VERSION: Final = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_PLURAL: Final = "podgroups"
#: ``--gang-scheduling`` value of Kubernetes' own gang scheduling (the Workload API): a name no
#: scheduler-plugins profile is given, so no upstream setting means it by accident.
WORKLOAD_GANG_FLAG: Final = "workload-api"
#: The Workload API the native gang drives (beta in 1.37, behind ``GenericWorkload``): the job's
#: Workload and PodGroup, named after it; pods name the group in ``spec.schedulingGroup``.
WORKLOAD_API_VERSION: Final = "scheduling.k8s.io/v1beta1"
WORKLOAD_KIND: Final = "Workload"
#: The Workload's one PodGroup template, which the PodGroup names in its ``workloadRef``.
WORKLOAD_TEMPLATE: Final = "mpijob"
#: The PodGroup condition kube-scheduler sets: False (reason ``Unschedulable``, its message
#: saying why) until the gang first binds.
POD_GROUP_SCHEDULED_CONDITION: Final = "PodGroupInitiallyScheduled"
#: What the Volcano API server defaults an empty ``spec.queue`` to.
VOLCANO_DEFAULT_QUEUE: Final = "default"

# --- Child names (upstream) ------------------------------------------------------------------
#: Children's names, as upstream: ``<job>-config`` (hostfile ConfigMap), ``<job>-ssh`` (Secret),
#: ``<job>-launcher`` (batch Job), ``<job>-worker-<i>`` (pods); the headless Service is ``<job>``.
CONFIG_SUFFIX: Final = "-config"
SSH_SUFFIX: Final = "-ssh"
#: ``<job>-launch``: the launch keys of a job launched by the operator's agent (no sshd).
LAUNCH_SUFFIX: Final = "-launch"
LAUNCHER_SUFFIX: Final = "-launcher"
WORKER_SUFFIX: Final = "-worker"

# --- Upstream condition types and reasons ----------------------------------------------------
#: Upstream's condition types on an MPIJob, set and cleared as upstream sets them.
COND_CREATED: Final = "Created"
COND_RUNNING: Final = "Running"
COND_RESTARTING: Final = "Restarting"
COND_SUCCEEDED: Final = "Succeeded"
COND_SUSPENDED: Final = "Suspended"
COND_FAILED: Final = "Failed"

#: Upstream's condition reasons, also the reasons of the Events posted with them;
#: ``ValidationError`` is the Warning Event of an invalid job.
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
#: Warning Event: a same-named object the job does not control is in the way (never overwritten).
REASON_RESOURCE_EXISTS: Final = "ErrResourceExists"
#: Warning Event (upstream): the launcher template's ``restartPolicy`` is overridden by the
#: replica spec's.
REASON_SET_RESTART_POLICY: Final = "SetPodTemplateRestartPolicy"

# --- Our finish conditions -------------------------------------------------------------------
#: Condition type on a finished job whose cleanPodPolicy (upstream's default ``None``) keeps
#: worker pods Running or Pending: True while any is left, with the pods and the GPUs they hold
#: in its message; False once none is. Upstream's condition types are untouched.
COND_WORKERS_LEFT_RUNNING: Final = "WorkersLeftRunning"
#: ``WorkersLeftRunning=True``: it is the job's ``cleanPodPolicy`` that keeps them.
REASON_CLEAN_POD_POLICY: Final = "CleanPodPolicyKeepsWorkers"
#: ``WorkersLeftRunning=False``: no worker pod of the finished job runs any more.
REASON_WORKERS_GONE: Final = "WorkersGone"
#: Warning Event, once, when a finished job's workers are left running (its message is the
#: condition's).
REASON_WORKERS_LEFT_RUNNING: Final = "WorkersLeftRunning"
#: Warning Event on the MPIJob: a worker's container ended with a non-zero exit code (or the
#: kubelet stopped the pod) while the job runs; the message names the pod, the container, the
#: reason and the exit code, and says whether the kubelet restarts it. Once per failure; the
#: same text each time, so a crash loop counts up one Event.
REASON_WORKER_FAILED: Final = "WorkerFailed"

# --- Upstream spec values --------------------------------------------------------------------
#: Keys of ``spec.mpiReplicaSpecs`` and ``status.replicaStatuses``.
REPLICA_LAUNCHER: Final = "Launcher"
REPLICA_WORKER: Final = "Worker"

#: ``spec.mpiImplementation`` values.
IMPL_OPENMPI: Final = "OpenMPI"
IMPL_INTEL: Final = "Intel"
IMPL_MPICH: Final = "MPICH"

#: ``spec.runPolicy.cleanPodPolicy`` values (upstream's default is ``None``).
CLEAN_POD_NONE: Final = "None"
CLEAN_POD_RUNNING: Final = "Running"
CLEAN_POD_ALL: Final = "All"

#: ``spec.launcherCreationPolicy`` values.
LAUNCHER_AT_STARTUP: Final = "AtStartup"
LAUNCHER_WAIT_FOR_WORKERS_READY: Final = "WaitForWorkersReady"

#: ``restartPolicy`` values of a replica spec.
RESTART_ALWAYS: Final = "Always"
RESTART_ON_FAILURE: Final = "OnFailure"
RESTART_NEVER: Final = "Never"
RESTART_EXIT_CODE: Final = "ExitCode"

#: Default ``spec.sshAuthMountPath``: where the SSH Secret is mounted.
DEFAULT_SSH_AUTH_MOUNT_PATH: Final = "/root/.ssh"

# --- Our extensions: one prefix --------------------------------------------------------------
#: The prefix of every annotation, label and scheduling gate of ours.
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
#: On an MPIJob: a fabric level (``clique``, ``leaf``, ... or ``node``) one domain of which must
#: hold all the job's workers; the job waits, saying why, until one has room.
FABRIC_REQUIRED_LEVEL: Final = PREFIX + "fabric-required-level"
#: On an MPIJob: a fabric level one domain of which should hold the job; when none has room the
#: job spans domains and its placement says which level it could not keep.
FABRIC_PREFERRED_LEVEL: Final = PREFIX + "fabric-preferred-level"
#: On an MPIJob: how ``mpirun`` starts the ranks in the workers. ``sshd`` (the default, as
#: upstream): through ssh and an sshd in the worker image, with an SSH Secret. ``agent``: through
#: the operator's launch agent, with no sshd in any image and no SSH Secret (docs/launch.md).
LAUNCH: Final = PREFIX + "launch"
LAUNCH_SSHD: Final = "sshd"
LAUNCH_AGENT: Final = "agent"
# --- Multi-node NVLink: ComputeDomains of NVIDIA's DRA driver ------------------------------
#: A job placed on several nodes of one NVLink clique gets a ComputeDomain (IMEX daemons and
#: channels, run by the driver), owned by the MPIJob; its workers claim a channel through the
#: ResourceClaimTemplate the driver creates for it.
COMPUTE_DOMAIN_API_VERSION: Final = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_KIND: Final = "ComputeDomain"
COMPUTE_DOMAIN_PLURAL: Final = "computedomains"
#: ``<job>-compute-domain``; its channel ResourceClaimTemplate ``<job>-compute-domain-channel``.
COMPUTE_DOMAIN_SUFFIX: Final = "-compute-domain"
CHANNEL_TEMPLATE_SUFFIX: Final = "-channel"
#: The channel's entry in a worker's ``spec.resourceClaims`` and its containers' claims.
CHANNEL_CLAIM: Final = "mpijob-imex-channel"
#: Volcano's HyperNodes (cluster-scoped): a fabric level may read its domains from one tier.
HYPERNODE_API_VERSION: Final = "topology.volcano.sh/v1alpha1"
HYPERNODE_PLURAL: Final = "hypernodes"

# --- Placement decisions: the operator's own record (crds/mpijob.io_placementdecisions.yaml) ---
#: A PlacementDecision lives in its MPIJob's namespace under the job's name. Only the operator
#: writes it (the user roles grant no write), so placement believes it; annotations a user can
#: write on MPIJobs and pods are never believed for GPU accounting.
DECISION_GROUP: Final = "mpijob.io"
DECISION_VERSION: Final = "v1alpha1"
DECISION_API_VERSION: Final = f"{DECISION_GROUP}/{DECISION_VERSION}"
DECISION_KIND: Final = "PlacementDecision"
DECISION_PLURAL: Final = "placementdecisions"

# --- Nodes opted into placement, and whole GPUs -----------------------------------------
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
#: Condition type of a job gang-scheduled by Kubernetes itself (``--gang-scheduling=workload-api``):
#: False while kube-scheduler has not bound the gang (reason ``GangWaiting``, its message
#: quoting the scheduler's), True once ``minCount`` of its pods are bound.
COND_GANG_SCHEDULED: Final = "GangScheduled"
#: ``GangScheduled=True`` and the Normal Event posted when the gang binds.
REASON_GANG_SCHEDULED: Final = "GangScheduled"
#: ``GangAdmitted=False`` and a Warning Event: the job fits, but its PlacementDecision cannot be
#: stored (the API server refuses it, or an earlier same-named job's decision is still held).
REASON_DECISION_REFUSED: Final = "PlacementNotRecorded"
#: Warning Event (dra binding): a worker's pinned GPUs could not be allocated (another claim
#: took one between the decision and the binding); the job's pods, claims and decision are
#: removed and it is placed anew.
REASON_GPUS_TAKEN: Final = "PlacementGPUsTaken"
#: Warning Event and ``GangAdmitted=False`` reason: a node of the job's placement was deleted, or
#: a worker on a node that was cordoned, or not Ready for 60 s (while most of the pool is Ready),
#: is gone; the job's workers and decision are removed and it is placed anew on healthy GPUs.
REASON_NODE_LOST: Final = "PlacementNodeLost"
#: Warning Event and ``GangAdmitted=False`` reason: the API server refused a placed worker's
#: pod (a ResourceQuota, a template it finds invalid): the job's workers and decision are
#: removed, and it waits ``--placement-release-seconds`` before it is queued again.
REASON_WORKERS_REFUSED: Final = "PlacementWorkersRefused"
#: Warning Event and ``GangAdmitted=False`` reason: a placed worker stayed unschedulable for
#: ``--placement-release-seconds``: released as for ``PlacementWorkersRefused``.
REASON_WORKERS_UNSCHEDULABLE: Final = "PlacementWorkersUnschedulable"
#: Normal Event once per admission (annotations binding): the operator chose the GPUs, but the
#: device plugin picks the ones each container gets.
REASON_DEVICE_PLUGIN_PICKS: Final = "DevicePluginPicksGPUs"
#: ``GangAdmitted=False`` and a Warning Event: the job's GPUs would take its namespace past a
#: ResourceQuota (the message names it); it waits, holding nothing and blocking no one else.
REASON_GPU_QUOTA_EXCEEDED: Final = "GPUQuotaExceeded"
#: ``GangAdmitted=False`` and a Warning Event: no node the worker template may go to could hold
#: one worker even empty, in a resource it advertises (cpu, memory, pods, ephemeral-storage, an
#: extended resource; the message names it and the most any node has); it waits, holding nothing
#: and blocking no one else.
REASON_NO_NODE_FITS: Final = "NoNodeFitsWorker"

# --- Binding placed GPUs to the pod (DRA) ----------------------------------------------------
#: The DRA API group version that can pin exact devices (GA and served by default since 1.34).
DRA_API_VERSION: Final = "resource.k8s.io/v1"
#: NVIDIA's DRA driver: both its driver name and the DeviceClass of its full GPUs.
NVIDIA_GPU_DRIVER: Final = "gpu.nvidia.com"
#: Qualified name of the standard PCI bus id attribute of a DRA device.
DRA_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
#: Qualified name of the standard PCIe root complex attribute of a DRA device.
DRA_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
#: On a worker pod whose GPUs a ResourceClaim pins: the claim's name. Its presence says the
#: operator replaced the pod's ``nvidia.com/gpu`` request with that claim.
GPU_CLAIM: Final = PREFIX + "gpu-claim"
#: On a worker pod: the GPU UUIDs the kubelet reports its containers hold (node agent), when
#: they differ from ``mpijob.io/gpu-uuids``.
GPU_ACTUAL: Final = PREFIX + "gpu-actual"
#: Warning Event on the MPIJob, posted by the node agent once per pod and set of GPUs: a
#: worker's containers hold other GPUs than its placement recorded.
REASON_PLACEMENT_NOT_HONOURED: Final = "PlacementNotHonoured"
#: Event source component of the node agent.
AGENT_COMPONENT: Final = "mpijob-agent"

# --- Namespaces' GPU quotas (ResourceQuota resource names) -----------------------------------
#: What the API server charges for a pod's ``nvidia.com/gpu`` requests (an extended resource is
#: quota'd only under the ``requests.`` prefix).
QUOTA_GPU_REQUESTS: Final = "requests." + GPU_RESOURCE
#: What it charges for the devices a ResourceClaim asks of NVIDIA's GPU DeviceClass.
QUOTA_GPU_CLAIM_DEVICES: Final = NVIDIA_GPU_DRIVER + ".deviceclass.resource.k8s.io/devices"

# --- Fractional GPUs (shares of one GPU, limited by CUDA MPS) --------------------------------
#: Extended resources a pod asks for in a container's limits, and a node advertises (kept as
#: the established names so that manifests written for that scheme work unchanged).
GPU_MEM_RESOURCE: Final = "aliyun.com/gpu-mem"
"""GiB of GPU memory; on a node, the total over its GPUs."""
GPU_CORE_PERCENTAGE_RESOURCE: Final = "aliyun.com/gpu-core.percentage"
"""Percent of one GPU's compute (multiples of 5, 5..100); on a node, 100 per GPU."""
GPU_COUNT_RESOURCE: Final = "aliyun.com/gpu-count"
"""On a node: how many GPUs it shares out."""
#: Value of NODE_GPU_SCHEDULE_LABEL that opts a node into shares with memory and compute limits.
NODE_GPU_SCHEDULE_CORE_MEM: Final = "core_mem"
#: Node label choosing how shares are packed onto the node's GPUs.
NODE_GPU_PLACEMENT_LABEL: Final = "ack.node.gpu.placement"
NODE_GPU_PLACEMENT_BINPACK: Final = "binpack"
"""Fill the GPUs already in use first (fewest GPUs)."""
NODE_GPU_PLACEMENT_SPREAD: Final = "spread"
"""The least used GPU first (the default when the label is absent)."""
#: On a pod holding a share: compact JSON ``{"v":1,"node":..,"gpu":<index>,"uuid":..,
#: "mem":<GiB>,"core":<percent or null>}``; what the ledger is rebuilt from after a restart.
GPU_SHARE: Final = PREFIX + "gpu-share"
#: On a pod holding a share: its GPU's UUID alone, read by the containers' environment
#: (a downward-API ``fieldRef``), so that a pod placed after creation gets it at start.
GPU_SHARE_UUID: Final = PREFIX + "gpu-share-uuid"
#: On a share pod admitted before any GPU had room for it: why it waits (removed once placed).
GPU_SHARE_WAITING: Final = PREFIX + "gpu-share-waiting"
#: The scheduling gate holding such a pod back from the scheduler until its share is placed.
GPU_SHARE_GATE: Final = PREFIX + "gpu-share"
#: Normal Events on a share pod: it waits behind the gate (the message says why), then its
#: share is placed (node, GPU) and the gate removed.
REASON_GPU_SHARE_WAITING: Final = "GPUShareWaiting"
REASON_GPU_SHARE_PLACED: Final = "GPUSharePlaced"
#: Warning Event: someone else removed the gate of a waiting pod; it runs without a share.
REASON_GPU_SHARE_GATE_REMOVED: Final = "GPUShareGateRemoved"
#: MPS clients one GPU serves at most (Volta and later); one more fails context creation.
MPS_MAX_CLIENTS: Final = 48
#: Host directory under which the agent keeps one MPS control daemon's pipe and log directory
#: per GPU (``<root>/<gpu-uuid>/pipe``, ``.../log``).
MPS_ROOT: Final = "/run/mpijob/mps"
#: The node agent's CSI driver: share pods carry an inline ephemeral volume of it, mounted at
#: MPS_ROOT, which shows the container its own GPU's pipe directory alone (no hostPath, so a
#: Pod Security ``baseline`` namespace admits the pod).
MPS_CSI_DRIVER: Final = "mps.mpijob.io"
#: Environment of an MPS client (NVIDIA's names).
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_ACTIVE_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PINNED_DEVICE_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"


def own_annotations() -> frozenset[str]:
    """Every annotation of the operator's own (each ``mpijob.io/`` name of this module): a
    closed set, so whatever keeps an object's annotations (the caches, Kopf's record of a
    streamed object) keeps at most these, however many a tenant puts on its objects."""
    return frozenset(
        value
        for name, value in globals().items()
        if not name.startswith("_")
        and isinstance(value, str)
        and value.startswith(PREFIX)
        and value != PREFIX
    )


#: The longest value of an annotation of the operator's own that a cache keeps. Its own are
#: short (a GPU set, eight UUIDs, a claim's name, a share); a longer one was not written by it.
MAX_OWN_VALUE: Final = 1024
