"""The scheduler's predicates, as the operator needs them: the one module for each.

* A pod's effective requests (:func:`effective_requests`), summed as the scheduler sums them,
  per resource the larger of

  - what runs together: every app container, plus every sidecar (an init container with
    ``restartPolicy: Always``, which keeps running beside them), and
  - each regular init container's request plus the sidecars declared before it (already
    running while it runs),

  plus the pod's ``overhead`` (RuntimeClass). A container's limit stands for a missing request,
  as the API server defaults it. Quantities are exact; a malformed amount counts as none (the
  API server refuses it before any pod exists). :func:`pod_requests` adds the one ``pods`` slot
  every pod takes (NodeResourcesFit).
* Node eligibility: a pod spec's ``nodeSelector`` and required node affinity
  (:func:`admits`, NodeAffinity) and its tolerations of ``NoSchedule``/``NoExecute`` taints
  (:func:`tolerates`, TaintToleration).
* Terminal pod phases (:data:`TERMINAL_PHASES`, :func:`terminal`): a pod that ended holds
  nothing of its node.

Used wherever a pod is weighed against a node: the room a node has left for a GPU share
(:mod:`mpijob.shares.node_room`) and the nodes a share may go to (:mod:`mpijob.shares.ledger`),
the nodes a gang may be placed on and the GPUs a pod no decision placed holds
(:mod:`mpijob.gang.topology`), and the GPUs a namespace's pods hold against its quota
(:mod:`mpijob.gang.quota`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from mpijob import keys
from mpijob.pods.quantity import Quantity

Requests = dict[str, Decimal]

#: Every pod takes one of these of its node's allocatable.
PODS = "pods"

#: Phases of a pod that has ended: its containers run no more and it holds nothing.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def terminal(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` (or a summary of one) has ended."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def effective_requests(spec: Mapping[str, Any]) -> Requests:
    """What a pod with ``spec`` requests of its node, per resource (no ``pods`` entry)."""
    sidecars: Requests = {}
    init_peak: Requests = {}
    for container in spec.get("initContainers") or []:
        own = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
            own = dict(sidecars)  # while it starts, it and the sidecars before it run
        else:
            own = _sum(own, sidecars)
        for name, amount in own.items():
            init_peak[name] = max(init_peak.get(name, Decimal(0)), amount)
    running = dict(sidecars)
    for container in spec.get("containers") or []:
        _add(running, container_requests(container))
    total = {
        name: max(running.get(name, Decimal(0)), init_peak.get(name, Decimal(0)))
        for name in running.keys() | init_peak.keys()
    }
    _add(total, amounts(spec.get("overhead")))
    return total


def pod_requests(spec: Mapping[str, Any]) -> Requests:
    """What a pod with ``spec`` takes of a node (:func:`effective_requests`), its one ``pods``
    slot included."""
    total = effective_requests(spec)
    total[PODS] = total.get(PODS, Decimal(0)) + 1
    return total


def effective_gpus(spec: Mapping[str, Any]) -> int:
    """Whole GPUs (``nvidia.com/gpu``) a pod with ``spec`` holds on its node: the one count of
    a pod's or a template's GPUs, for placement, holdings, quotas, the node room and the CLI
    (``make lint`` keeps it the only one: ``tests/unit/test_one_request_count.py``)."""
    return int(effective_requests(spec).get(keys.GPU_RESOURCE, Decimal(0)))


def template_gpus(template: Mapping[str, Any] | None) -> int:
    """Whole GPUs one pod of a pod ``template`` (or a pod) holds (:func:`effective_gpus`)."""
    return effective_gpus(((template or {}).get("spec")) or {})


def container_gpus(container: Mapping[str, Any]) -> int:
    """Whole GPUs one container asks for (:func:`container_requests`): for what is per
    container (a ResourceClaim's request per GPU container); a pod's count is
    :func:`effective_gpus`."""
    return int(container_requests(container).get(keys.GPU_RESOURCE, Decimal(0)))


def container_requests(container: Mapping[str, Any]) -> Requests:
    """One container's requests, its limits standing for missing ones."""
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return amounts(merged)


def amounts(values: Mapping[str, Any] | None) -> Requests:
    """Exact amounts of a resource list; malformed ones left out."""
    out: Requests = {}
    for name, text in (values or {}).items():
        try:
            out[name] = _parsed(text) if isinstance(text, str) else Quantity.parse(text).value
        except (ValueError, TypeError):
            continue
    return out


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Decimal:
    """A quantity's exact value: the same few strings ("8", "64Gi") come from thousands of
    templates, weighed in each admission pass."""
    return Quantity.parse(text).value


def _sum(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Requests:
    out = dict(a)
    _add(out, b)
    return out


def _add(total: Requests, more: Mapping[str, Decimal]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Decimal(0)) + amount


# --- node eligibility ---------------------------------------------------------------------------


def admits(spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a pod spec's ``nodeSelector`` and required node affinity admit ``node``.

    Terms are ORed, expressions within a term ANDed, as the scheduler reads them; taints are
    :func:`tolerates`'.
    """
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    selector: Mapping[str, str] = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": str(meta.get("name") or "")}
    return any(
        all(_matches(labels, e) for e in term.get("matchExpressions") or [])
        and all(_matches(fields, e) for e in term.get("matchFields") or [])
        and (term.get("matchExpressions") or term.get("matchFields"))
        for term in terms
    )


def _matches(values: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key, op = expression.get("key", ""), expression.get("operator", "")
    wanted = [str(v) for v in expression.get("values") or []]
    present = key in values
    match op:
        case "In":
            return present and values[key] in wanted
        case "NotIn":
            return not present or values[key] not in wanted
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            try:
                have, bound = int(values[key]), int(wanted[0])
            except (KeyError, IndexError, ValueError):
                return False
            return have > bound if op == "Gt" else have < bound
    return False


def tolerates(spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a pod spec tolerates every ``NoSchedule`` and ``NoExecute`` taint of ``node``
    (``PreferNoSchedule`` only steers the scheduler)."""
    taints = (node.get("spec") or {}).get("taints") or []
    if not taints:
        return True
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    return all(_tolerated(taint, tolerations) for taint in taints)


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    effect = taint.get("effect")
    if effect not in ("NoSchedule", "NoExecute"):
        return True
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != effect:
            continue
        operator = toleration.get("operator") or "Equal"
        if not toleration.get("key"):
            if operator == "Exists":
                return True
            continue
        if toleration.get("key") != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
