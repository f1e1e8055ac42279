"""What a placed GPU share writes into its pod: the one function the admission webhook and the
GPU check (``hack/gpu/mps_check.py``) both call, so what was measured is what pods get.

Per container holding part of the share, the MPS client environment:

* ``NVIDIA_VISIBLE_DEVICES=<uuid>``: the ``nvidia`` container runtime shows that one GPU, so
  inside the container it is CUDA device 0;
* ``CUDA_MPS_PIPE_DIRECTORY``: that GPU's control daemon (one per GPU, started by the agent with
  ``CUDA_VISIBLE_DEVICES=<uuid>``, so the server's device 0 is the same GPU);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<N>G`` and, unless memory-only,
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<p>``. These are client-side limits: MPS lets a client
  lower, never raise, the daemon's limit, and a container that unsets them escapes them.

Per pod: the ``mpijob.io/gpu-share`` annotation (node, GPU index and UUID, share), a read-only
hostPath volume for the pipe directory (mounted at the same path, so host and container agree),
and a required node affinity on the chosen node, so the scheduler still checks the pod's other
resources. Nothing else: on a real H100 (driver 580) a client with its own ``/dev/shm`` and its
own mount, IPC, PID and UTS namespaces, the pipe directory read-only, reached its daemon
(``hack/gpu/mps_check.py``), so client pods need neither hostIPC, hostPID nor the host's shared
memory.

Pure; :func:`json_patch` turns :class:`PodEdits` into the JSON patch a mutating webhook returns,
and :func:`webhook_configurations` builds the two webhook configuration objects the operator
applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mpijob import keys
from mpijob.api.fractional import ContainerShare, Placed, read_request

PIPE_VOLUME: Final = "mpijob-mps-pipe"
#: The device index a client limit names: the container sees only its GPU, as device 0.
CLIENT_DEVICE: Final = 0


@dataclass(frozen=True)
class MpsDirectories:
    """Where one GPU's MPS control daemon listens and logs, on the host."""

    pipe: str
    log: str


def mps_directories(uuid: str, root: str = keys.MPS_ROOT) -> MpsDirectories:
    """The directories of the daemon serving GPU ``uuid`` (the agent creates them)."""
    return MpsDirectories(pipe=f"{root}/{uuid}/pipe", log=f"{root}/{uuid}/log")


def client_env(
    part: ContainerShare | tuple[int, int | None], uuid: str, root: str = keys.MPS_ROOT
) -> dict[str, str]:
    """The environment of one MPS client holding ``part`` (GiB, percent or None) of ``uuid``."""
    memory, percentage = (
        (part.memory_gib, part.percentage) if isinstance(part, ContainerShare) else part
    )
    env = {
        keys.ENV_NVIDIA_VISIBLE_DEVICES: uuid,
        keys.ENV_MPS_PIPE_DIRECTORY: mps_directories(uuid, root).pipe,
        keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT: f"{CLIENT_DEVICE}={memory}G",
    }
    if percentage is not None:
        env[keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] = str(percentage)
    return env


@dataclass(frozen=True)
class PodEdits:
    """Everything a placed share adds to a pod; containers are named by index."""

    annotations: dict[str, str]
    env: dict[int, dict[str, str]]
    volumes: tuple[dict[str, Any], ...]
    mounts: dict[int, tuple[dict[str, Any], ...]]
    node: str
    notes: tuple[str, ...] = field(default=())


def pod_edits(pod: Mapping[str, Any], placed: Placed, root: str = keys.MPS_ROOT) -> PodEdits:
    """The edits for ``pod`` (whose share was read valid) holding ``placed``."""
    spec = pod.get("spec") or {}
    parts = {part.name: part for part in read_request(spec).containers}
    dirs = mps_directories(placed.uuid, root)
    env: dict[int, dict[str, str]] = {}
    mounts: dict[int, tuple[dict[str, Any], ...]] = {}
    for index, container in enumerate(spec.get("containers") or []):
        part = parts.get(str(container.get("name") or ""))
        if part is None:
            continue
        env[index] = client_env(part, placed.uuid, root)
        mounts[index] = ({"name": PIPE_VOLUME, "mountPath": dirs.pipe, "readOnly": True},)
    # Directory, not DirectoryOrCreate: on a node whose agent has not started the daemon the pod
    # waits visibly (FailedMount) instead of running outside MPS.
    volumes = ({"name": PIPE_VOLUME, "hostPath": {"path": dirs.pipe, "type": "Directory"}},)
    return PodEdits(
        annotations={keys.GPU_SHARE: placed.dumps()},
        env=env,
        volumes=volumes,
        mounts=mounts,
        node=placed.node,
    )


def json_patch(pod: Mapping[str, Any], edits: PodEdits) -> list[dict[str, Any]]:
    """RFC 6902 operations applying ``edits`` to ``pod`` as it is (our names replace theirs)."""
    ops: list[dict[str, Any]] = []
    meta = pod.get("metadata") or {}
    if "annotations" not in meta or meta.get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in edits.annotations.items():
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value})
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    for index, variables in edits.env.items():
        ops += _merge_list(
            f"/spec/containers/{index}/env",
            containers[index].get("env"),
            [{"name": k, "value": v} for k, v in variables.items()],
            key="name",
        )
    for index, wanted in edits.mounts.items():
        ops += _merge_list(
            f"/spec/containers/{index}/volumeMounts",
            containers[index].get("volumeMounts"),
            list(wanted),
            key="mountPath",
        )
    ops += _merge_list("/spec/volumes", spec.get("volumes"), list(edits.volumes), key="name")
    ops += _pin_to_node(spec, edits.node)
    return ops


def _merge_list(
    path: str, current: Any, wanted: list[dict[str, Any]], *, key: str
) -> list[dict[str, Any]]:
    """Ops making ``wanted`` items present: same ``key`` replaced in place, others appended."""
    if not isinstance(current, list) or not current:
        return [{"op": "add", "path": path, "value": wanted}]
    where = {item.get(key): i for i, item in enumerate(current) if isinstance(item, Mapping)}
    ops: list[dict[str, Any]] = []
    for item in wanted:
        if item[key] in where:
            ops.append({"op": "replace", "path": f"{path}/{where[item[key]]}", "value": item})
        else:
            ops.append({"op": "add", "path": f"{path}/-", "value": item})
    return ops


def _pin_to_node(spec: Mapping[str, Any], node: str) -> list[dict[str, Any]]:
    """A required affinity on ``metadata.name``, ANDed into every term the pod already has."""
    field_term = {"key": "metadata.name", "operator": "In", "values": [node]}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        affinity = dict(spec.get("affinity") or {})
        node_affinity = dict(affinity.get("nodeAffinity") or {})
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchFields": [field_term]}]
        }
        affinity["nodeAffinity"] = node_affinity
        return [{"op": "add", "path": "/spec/affinity", "value": affinity}]
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    ops = []
    for index, term in enumerate(terms):
        fields = [*(term.get("matchFields") or []), field_term]
        ops.append(
            {"op": "add", "path": f"{base}/nodeSelectorTerms/{index}/matchFields", "value": fields}
        )
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# --- The admission webhooks' configuration ------------------------------------------------------

#: Name of both webhook configuration objects.
WEBHOOK_CONFIGURATION: Final = "mpijob-gpu-share"
#: Kopf serves each webhook handler at ``/<handler id>``.
MUTATE_ID: Final = "gpu-share-mutate"
VALIDATE_ID: Final = "gpu-share-validate"
#: Seconds the API server waits for a decision. Decisions take well under 10 ms
#: (``make bench-fractional``); a stalled operator must not hold pod creation for the 30 s
#: maximum.
WEBHOOK_TIMEOUT_SECONDS: Final = 5

_LIMITS = "has(c.resources) && has(c.resources.limits) && "
#: CEL: only pods naming a share reach the webhook, so with ``failurePolicy: Fail`` an operator
#: that is down blocks those pods alone (they would otherwise run without placement or limits).
MATCH_SHARE_PODS: Final = " || ".join(
    f"(has(object.spec.{field}) && object.spec.{field}.exists(c, {_LIMITS}"
    f"('{keys.GPU_MEM_RESOURCE}' in c.resources.limits ||"
    f" '{keys.GPU_CORE_PERCENTAGE_RESOURCE}' in c.resources.limits)))"
    for field in ("containers", "initContainers")
)


def webhook_configurations(
    *,
    service_namespace: str,
    service_name: str,
    port: int,
    ca_bundle: str,
    exempt_namespaces: Sequence[str],
    url: str = "",
) -> list[dict[str, Any]]:
    """The Mutating and Validating webhook configurations for pod creation.

    ``failurePolicy: Fail`` (a share pod admitted without placement would run unlimited),
    ``matchConditions`` restricting calls to share pods, ``namespaceSelector`` exempting
    ``exempt_namespaces`` (the operator's own and ``kube-system``: the operator must never
    wait on itself), ``timeoutSeconds`` 5, ``sideEffects: NoneOnDryRun`` (a dry run holds
    nothing), no reinvocation. ``url`` replaces the Service (API servers that cannot reach
    Service IPs).
    """

    def webhook(handler: str, name: str) -> dict[str, Any]:
        client: dict[str, Any] = {
            "service": {
                "namespace": service_namespace,
                "name": service_name,
                "port": port,
                "path": f"/{handler}",
            }
        }
        if url:
            client = {"url": f"{url.rstrip('/')}/{handler}"}
        return {
            "name": f"{name}.gpu-share.mpijob.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {**client, "caBundle": ca_bundle},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": sorted(set(exempt_namespaces)),
                    }
                ]
            },
            "matchConditions": [{"name": "asks-for-a-gpu-share", "expression": MATCH_SHARE_PODS}],
        }

    meta = {"name": WEBHOOK_CONFIGURATION, "labels": {"app.kubernetes.io/name": "mpijob-operator"}}
    mutating = webhook(MUTATE_ID, "place")
    mutating["reinvocationPolicy"] = "Never"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": dict(meta),
            "webhooks": [mutating],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": dict(meta),
            "webhooks": [webhook(VALIDATE_ID, "validate")],
        },
    ]
