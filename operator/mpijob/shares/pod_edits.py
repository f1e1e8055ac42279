"""What a GPU share writes into its pod: the functions the share webhook, the placement of a
waiting pod and the GPU check (``bench/gpu/mps_check.py``) all call, so what was measured is
what pods get.

Per container holding part of the share, the MPS client environment (:func:`container_env`),
the same whichever GPU the pod gets, because a pod admitted while no GPU has room is placed
later and a pod's environment cannot change after creation:

* ``NVIDIA_VISIBLE_DEVICES``: read from the pod's ``mpijob.io/gpu-share-uuid`` annotation
  (downward API) when the container starts; the ``nvidia`` container runtime shows that one
  GPU, so inside the container it is CUDA device 0;
* ``CUDA_MPS_PIPE_DIRECTORY=<root>/$(NVIDIA_VISIBLE_DEVICES)/pipe``: that GPU's control daemon
  (one per GPU, started by the agent with ``CUDA_VISIBLE_DEVICES=<uuid>``, so the server's
  device 0 is the same GPU);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<N>G`` and, unless memory-only,
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<p>``. These are client-side limits: MPS lets a client
  lower, never raise, the daemon's limit, and a container that unsets them escapes them.

Per pod: the MPS root mounted read-only at the same path as on the host (host and container
agree on every pipe path), from the node agent's CSI driver (:func:`mps_volume`: the pod's own
GPU's pipe directory alone, and no hostPath), and then either its placement
(:func:`placement_edits`: the ``mpijob.io/gpu-share`` record, the UUID annotation, a required
node affinity on the chosen node, so the scheduler still checks the pod's other resources) or,
when no GPU has room now,
the scheduling gate ``mpijob.io/gpu-share`` and the reason it waits (:func:`waiting_edits`).
The gate keeps the pod Pending (``SchedulingGated``) and away from the scheduler until the
operator places it: node affinity may be added to a gated pod, and the annotations are read at
container start. Nothing else: on a real H100 (driver 580) a client with its own ``/dev/shm``
and its own mount, IPC, PID and UTS namespaces, the pipe directory read-only, reached its
daemon (``bench/gpu/mps_check.py``), so client pods need neither hostIPC, hostPID nor the host's
shared memory.

Pure; :func:`json_patch` turns :class:`PodEdits` into the JSON patch a mutating webhook returns
(or the operator sends to place a waiting pod), and :func:`webhook_configurations` builds the
two webhook configuration objects the operator applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mpijob import keys
from mpijob.shares.request import ContainerShare, Placed, read_request

MPS_VOLUME: Final = "mpijob-mps"
#: The device index a client limit names: the container sees only its GPU, as device 0.
CLIENT_DEVICE: Final = 0
#: Downward-API path of the UUID annotation.
UUID_FIELD: Final = f"metadata.annotations['{keys.GPU_SHARE_UUID}']"
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class MpsDirectories:
    """Where one GPU's MPS control daemon listens and logs, on the host."""

    pipe: str
    log: str


def mps_directories(uuid: str, root: str = keys.MPS_ROOT) -> MpsDirectories:
    """The directories of the daemon serving GPU ``uuid`` (the agent creates them)."""
    return MpsDirectories(pipe=f"{root}/{uuid}/pipe", log=f"{root}/{uuid}/log")


def container_env(part: ContainerShare, root: str = keys.MPS_ROOT) -> list[dict[str, Any]]:
    """The env entries of one container holding ``part``, in order (the pipe directory names
    the variable before it)."""
    uuid = f"$({keys.ENV_NVIDIA_VISIBLE_DEVICES})"
    entries: list[dict[str, Any]] = [
        {
            "name": keys.ENV_NVIDIA_VISIBLE_DEVICES,
            "valueFrom": {"fieldRef": {"fieldPath": UUID_FIELD}},
        },
        {"name": keys.ENV_MPS_PIPE_DIRECTORY, "value": mps_directories(uuid, root).pipe},
        {
            "name": keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT,
            "value": f"{CLIENT_DEVICE}={part.memory_gib}G",
        },
    ]
    if part.percentage is not None:
        entries.append(
            {"name": keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE, "value": str(part.percentage)}
        )
    return entries


def resolve_env(
    entries: Sequence[Mapping[str, Any]], annotations: Mapping[str, str]
) -> dict[str, str]:
    """What a container's process sees of ``entries``, by the kubelet's rules for the forms
    :func:`container_env` uses: a ``fieldRef`` to an annotation (empty when absent) and
    ``$(NAME)`` of a variable defined earlier (left as written otherwise)."""
    env: dict[str, str] = {}
    for entry in entries:
        if "valueFrom" in entry:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            match = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
            if match is None:
                raise ValueError(f"unsupported fieldRef {path}")
            env[entry["name"]] = annotations.get(match.group(1), "")
        else:
            value = str(entry.get("value", ""))
            env[entry["name"]] = _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), value)
    return env


def client_env(
    part: ContainerShare | tuple[int, int | None], uuid: str, root: str = keys.MPS_ROOT
) -> dict[str, str]:
    """The environment an MPS client holding ``part`` (GiB, percent or None) of ``uuid`` sees."""
    if not isinstance(part, ContainerShare):
        part = ContainerShare("", *part)
    return resolve_env(container_env(part, root), {keys.GPU_SHARE_UUID: uuid})


@dataclass(frozen=True)
class PodEdits:
    """What a share changes in a pod; containers are named by index."""

    annotations: Mapping[str, str | None] = field(default_factory=dict)
    """None: the annotation is removed."""
    env: Mapping[int, list[dict[str, Any]]] = field(default_factory=dict)
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: Mapping[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    node: str = ""
    """Pin the pod to this node (required node affinity)."""
    gate: bool | None = None
    """True: add the ``mpijob.io/gpu-share`` scheduling gate; False: remove it."""
    runtime_class: str = ""
    """Set ``spec.runtimeClassName`` (at admission only: the field cannot change later)."""

    def __or__(self, other: PodEdits) -> PodEdits:
        return PodEdits(
            annotations={**self.annotations, **other.annotations},
            env={**self.env, **other.env},
            volumes=self.volumes + other.volumes,
            mounts={**self.mounts, **other.mounts},
            node=other.node or self.node,
            gate=self.gate if other.gate is None else other.gate,
            runtime_class=other.runtime_class or self.runtime_class,
        )


def share_edits(pod: Mapping[str, Any], root: str = keys.MPS_ROOT) -> PodEdits:
    """The environment and MPS mount of ``pod`` (whose share was read valid), whatever its GPU."""
    spec = pod.get("spec") or {}
    parts = {part.name: part for part in read_request(spec).containers}
    env: dict[int, list[dict[str, Any]]] = {}
    mounts: dict[int, tuple[dict[str, Any], ...]] = {}
    for index, container in enumerate(spec.get("containers") or []):
        part = parts.get(str(container.get("name") or ""))
        if part is None:
            continue
        env[index] = container_env(part, root)
        mounts[index] = ({"name": MPS_VOLUME, "mountPath": root, "readOnly": True},)
    return PodEdits(env=env, volumes=(mps_volume(),), mounts=mounts)


def mps_volume() -> dict[str, Any]:
    """The pod's MPS volume: inline ephemeral, of the node agent's CSI driver, not a hostPath
    (which a Pod Security ``baseline`` namespace refuses). The agent shows the pod its own GPU's
    pipe directory alone, at ``<root>/<uuid>/pipe``, read from the pod's share record on the API
    server, never from the volume's attributes (:mod:`mpijob.agent.csi`); on a node whose agent
    does not serve it, or for a pod it did not place, the pod waits visibly (FailedMount)
    instead of running outside MPS."""
    return {"name": MPS_VOLUME, "csi": {"driver": keys.MPS_CSI_DRIVER, "readOnly": True}}


def runtime_class_edits(pod: Mapping[str, Any], runtime_class: str) -> PodEdits:
    """The RuntimeClass a share pod gets when it names none (``--gpu-share-runtime-class``).

    The share's GPU reaches the container as ``NVIDIA_VISIBLE_DEVICES``, which only the nvidia
    container runtime reads: under another runtime the container would see no GPU at all. A pod
    that names a class keeps it (its author knows the nodes), and an empty setting adds nothing
    (nodes whose default runtime is nvidia's). The API server re-runs its own admission after a
    webhook's change, so the class's overhead and node scheduling apply as if written by hand,
    and a class that does not exist refuses the pod, naming it.
    """
    if not runtime_class or (pod.get("spec") or {}).get("runtimeClassName"):
        return PodEdits()
    return PodEdits(runtime_class=runtime_class)


def placement_edits(placed: Placed) -> PodEdits:
    """What places a pod's share on ``placed``: at admission, or later for a waiting pod."""
    return PodEdits(
        annotations={
            keys.GPU_SHARE: placed.dumps(),
            keys.GPU_SHARE_UUID: placed.uuid,
            keys.GPU_SHARE_WAITING: None,
        },
        node=placed.node,
        gate=False,
    )


def waiting_edits(reason: str) -> PodEdits:
    """What holds a pod back until a GPU has room for its share (and drops any record or
    UUID the pod was sent with: those are the operator's to write)."""
    return PodEdits(
        annotations={
            keys.GPU_SHARE_WAITING: reason,
            keys.GPU_SHARE: None,
            keys.GPU_SHARE_UUID: None,
        },
        gate=True,
    )


#: Why a share pod waits from its creation until the operator's placement pass has looked at it:
#: the webhook gates every share pod and places none (a hold made at admission would outlive a
#: pod the API server then refuses, or an AdmissionReview that never was a pod).
ADMITTED: Final = "the operator places its GPU share once the pod exists"


def waiting_patch(pod: Mapping[str, Any], reason: str) -> list[dict[str, Any]]:
    """The JSON patch writing why a gated pod still waits; it fails as a whole when the pod is
    no longer behind our gate (placed since it was read), so a placed pod never shows a reason."""
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    if keys.GPU_SHARE_GATE not in gates:
        return []
    where = f"/spec/schedulingGates/{gates.index(keys.GPU_SHARE_GATE)}/name"
    return [
        {"op": "test", "path": where, "value": keys.GPU_SHARE_GATE},
        *json_patch(pod, PodEdits(annotations={keys.GPU_SHARE_WAITING: reason})),
    ]


def pod_edits(
    pod: Mapping[str, Any],
    placed: Placed | str,
    root: str = keys.MPS_ROOT,
    runtime_class: str = "",
) -> PodEdits:
    """At admission: the share's environment and mount, its runtime class
    (:func:`runtime_class_edits`), and its placement or (``placed`` is why none is possible now)
    the gate it waits behind."""
    then = placement_edits(placed) if isinstance(placed, Placed) else waiting_edits(placed)
    return share_edits(pod, root) | runtime_class_edits(pod, runtime_class) | then


def json_patch(pod: Mapping[str, Any], edits: PodEdits) -> list[dict[str, Any]]:
    """RFC 6902 operations applying ``edits`` to ``pod`` as it is (our names replace theirs)."""
    ops: list[dict[str, Any]] = []
    meta = pod.get("metadata") or {}
    current = meta.get("annotations") or {}
    adding = {k: v for k, v in edits.annotations.items() if v is not None}
    if adding and meta.get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in edits.annotations.items():
        where = f"/metadata/annotations/{_escape(key)}"
        if value is not None:
            ops.append({"op": "add", "path": where, "value": value})
        elif key in current:
            ops.append({"op": "remove", "path": where})
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    for index, entries in edits.env.items():
        ours = {e["name"] for e in entries}
        theirs = [e for e in containers[index].get("env") or [] if e.get("name") not in ours]
        # Replaced whole: ours go last and in order, after any of theirs they may refer to.
        ops.append(
            {"op": "add", "path": f"/spec/containers/{index}/env", "value": theirs + entries}
        )
    for index, wanted in edits.mounts.items():
        ops += _merge_list(
            f"/spec/containers/{index}/volumeMounts",
            containers[index].get("volumeMounts"),
            list(wanted),
            key="mountPath",
        )
    if edits.volumes:
        ops += _merge_list("/spec/volumes", spec.get("volumes"), list(edits.volumes), key="name")
    if edits.runtime_class:
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": edits.runtime_class})
    if edits.node:
        ops += _pin_to_node(spec, edits.node)
    if edits.gate is not None:
        ops += _gate(spec, add=edits.gate)
    return ops


def _gate(spec: Mapping[str, Any], *, add: bool) -> list[dict[str, Any]]:
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    ours = keys.GPU_SHARE_GATE
    if add:
        if ours in gates:
            return []
        if not gates:
            return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ours}]}]
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ours}}]
    if ours not in gates:
        return []
    where = f"/spec/schedulingGates/{gates.index(ours)}"
    # The test fails the whole patch if the gate moved or went since the pod was read.
    return [
        {"op": "test", "path": f"{where}/name", "value": ours},
        {"op": "remove", "path": where},
    ]


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
    """A required affinity on ``metadata.name``, ANDed into every term the pod already has (the
    one change of node affinity a gated pod allows: requirements added, none changed)."""
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


# --- The share webhook's configurations ---------------------------------------------------------

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
