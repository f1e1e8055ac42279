"""What each placed container really got: the agent's report of placements not honoured.

Every turn of the agent's loop, :meth:`GpuActual.step` lists the pods bound to its node, asks
the kubelet's pod-resources API what their containers hold (:mod:`podresources`) and compares it
with each unfinished pod's ``mpijob.io/gpu-uuids``:

- a **mismatch** (the device plugin ignored the placement, or a claim got other devices) becomes
  the pod annotation ``mpijob.io/gpu-actual`` (the UUIDs its containers hold, comma-separated),
  one count of ``mpijob_agent_placements_not_honoured_total{binding}`` and one Warning Event
  ``PlacementNotHonoured`` on the pod's MPIJob naming the pod, the recorded and the actual GPUs.
  The count follows only what this process saw (once per pod and set of GPUs): the annotation is
  the pod's to write too (anyone who may patch it), so it never moves or holds back the metric.
  It only spares an Event: a pod already annotated with the same GPUs gets none again, from this
  agent or the next one after a restart;
- a **match** removes a stale ``mpijob.io/gpu-actual``;
- a pod the kubelet does not know (not admitted yet, or gone) is left alone.

No pod-resources socket (the hostPath mount is missing, or the node has no kubelet) or a kubelet
that does not answer is one log line when it starts (and one when it ends), not one per pod and
turn; nothing here raises into the loop. DRA device names (``gpu-<minor>``) are turned into UUIDs
with the node's ResourceSlices, device-plugin indices with the topology the agent read through
NVML. The API calls go through a :class:`NodeKube` (:class:`mpijob.agent.publish.AgentKube` in a
pod, a fake in tests).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, Protocol

import grpc

from mpijob import keys, metrics
from mpijob.agent import podresources
from mpijob.agent.podresources import Check, Held, Verdict
from mpijob.objects import JSON
from mpijob.pods import pod_binding
from mpijob.pods.predicates import TERMINAL_PHASES

logger = logging.getLogger("mpijob.agent")


#: Event type of a placement not honoured.
WARNING: Final = "Warning"


class NodeKube(Protocol):
    """The API calls the check needs, all about the agent's own node."""

    def node_pods(self, node: str) -> list[JSON]:
        """Pods bound to ``node``, in every namespace."""

    def node_slices(self, node: str) -> list[JSON]:
        """ResourceSlices of ``node``; empty where ``resource.k8s.io/v1`` is not served."""

    def annotate_pod(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one annotation of a pod."""

    def post_event(self, involved: JSON, type_: str, reason: str, message: str) -> None:
        """Post an Event about ``involved`` (an object reference)."""


class GpuActual:
    """The agent's check of its node's placed pods (one instance per agent process)."""

    def __init__(
        self,
        kube: NodeKube,
        node: str,
        *,
        socket: str = podresources.SOCKET,
        timeout: float = podresources.TIMEOUT,
    ) -> None:
        self._kube = kube
        self._node = node
        self._socket = socket
        self._timeout = timeout
        self.index_uuids: dict[str, str] = {}
        """NVML index (as text) -> UUID of this node's GPUs; set by the loop from its reading."""
        self._unavailable: str | None = None
        """Why the kubelet could not be read at the last turn that needed it."""
        self._counted: dict[tuple[str, str, str], str] = {}
        """(namespace, name, uid) -> the GPUs counted for that pod by this process."""

    def step(self) -> list[Check]:
        """One check of every placed pod on the node; returns the checks. Never raises."""
        try:
            pods = [p for p in self._kube.node_pods(self._node) if _placed(p)]
        except Exception:
            logger.exception("Failed to list the pods of node=%s", self._node)
            return []
        if not pods:
            return []
        held, verdict, detail = self._read()
        if held is None:
            return podresources.compare(pods, None, unavailable=verdict, detail=detail)
        checks = podresources.compare(
            pods,
            held,
            index_uuids=self.index_uuids,
            device_uuids=self._device_uuids() if _claims_gpus(held) else None,
        )
        by_key = {_key(p): p for p in pods}
        present = {(*_key(p), _uid(p)) for p in pods}
        for gone in set(self._counted) - present:
            del self._counted[gone]
        for check in checks:
            try:
                self._act(check, by_key[(check.namespace, check.pod)])
            except Exception:
                logger.exception(
                    "Failed to record what pod %s/%s holds", check.namespace, check.pod
                )
        return checks

    def _read(self) -> tuple[Held | None, Verdict, str]:
        """What the kubelet says; logs only when its availability changes."""
        try:
            held = podresources.list_pods(self._socket, self._timeout)
        except podresources.SocketMissing:
            self._unreadable(
                f"no pod-resources socket at {self._socket}: cannot check what placed pods' "
                "containers hold (mount /var/lib/kubelet/pod-resources into the agent)"
            )
            return None, Verdict.SOCKET_MISSING, self._socket
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            text = error.details() if isinstance(error, grpc.Call) else str(error)
            detail = f"{code.name if code else 'error'}: {text}"
            self._unreadable(
                f"the kubelet's pod-resources API at {self._socket} did not answer ({detail}): "
                "cannot check what placed pods' containers hold"
            )
            return None, Verdict.UNREADABLE, detail
        if self._unavailable is not None:
            logger.info("The kubelet's pod-resources API answers again node=%s", self._node)
            self._unavailable = None
        return held, Verdict.MATCH, ""

    def _unreadable(self, why: str) -> None:
        if why != self._unavailable:
            logger.warning("%s node=%s", why, self._node)
            self._unavailable = why

    def _device_uuids(self) -> dict[str, str]:
        try:
            return podresources.device_uuids(self._kube.node_slices(self._node), self._node)
        except Exception:
            logger.exception("Failed to list the ResourceSlices of node=%s", self._node)
            return {}

    def _act(self, check: Check, pod: JSON) -> None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        written = annotations.get(keys.GPU_ACTUAL)
        if check.verdict is Verdict.MATCH and written is not None:
            self._kube.annotate_pod(check.namespace, check.pod, keys.GPU_ACTUAL, None)
            logger.info("%s (again): removed %s", check.message, keys.GPU_ACTUAL)
            return
        if check.verdict is not Verdict.MISMATCH:
            return
        actual = ",".join(check.actual)
        key = (check.namespace, check.pod, _uid(pod))
        if written != actual:
            self._kube.annotate_pod(check.namespace, check.pod, keys.GPU_ACTUAL, actual)
        if self._counted.get(key) == actual:
            return  # counted by this process already, whatever the annotation says now
        self._counted[key] = actual
        binding = pod_binding(pod)
        metrics.AGENT_PLACEMENTS_NOT_HONOURED.labels(binding=binding.value).inc()
        logger.warning("%s node=%s binding=%s", check.message, self._node, binding.value)
        job = _owning_job(pod)
        if job is None or written == actual:
            return  # no MPIJob, or reported by an earlier agent: no second Event
        self._kube.post_event(
            job, WARNING, keys.REASON_PLACEMENT_NOT_HONOURED, event_message(check)
        )


def event_message(check: Check) -> str:
    """The Event's text: the pod, the GPUs its placement recorded and those it holds."""
    return (
        f"Pod {check.pod} was placed on GPUs {','.join(check.recorded)} but its containers "
        f"hold {','.join(check.actual) or 'no GPU'} (reported by the node agent from the "
        "kubelet's pod-resources API)"
    )


def _placed(pod: JSON) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(annotations.get(keys.GPU_UUIDS)) and phase not in TERMINAL_PHASES


def _key(pod: JSON) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _claims_gpus(held: Held) -> bool:
    return any(
        device.driver == keys.NVIDIA_GPU_DRIVER
        for containers in held.values()
        for container in containers
        for device in container.claimed
    )


def _owning_job(pod: JSON) -> dict[str, Any] | None:
    """The reference of the MPIJob that owns ``pod`` (its workers' controller), if any."""
    meta = pod.get("metadata") or {}
    owners: Sequence[JSON] = meta.get("ownerReferences") or []
    for owner in owners:
        if owner.get("kind") == keys.KIND and owner.get("apiVersion") == keys.API_VERSION:
            return {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND,
                "name": owner.get("name"),
                "namespace": meta.get("namespace"),
                "uid": owner.get("uid"),
            }
    return None
