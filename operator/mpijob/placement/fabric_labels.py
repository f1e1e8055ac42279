"""Where a fabric's levels come from: a settings mapping (Kueue-style label levels) or Volcano
HyperNode objects. Pure functions over plain dicts; the handlers read the objects.

* :func:`fabric_from_spec`: ``{"levels": [{"name", "nodeLabel", "gbps"}, ...],
  "outsideGbps": ...}``, outermost level first as a Kueue Topology lists them. A level on
  ``kubernetes.io/hostname`` is the node itself and is skipped (placement always knows nodes).
  A level may name ``hyperNodeTier: <n>`` instead of a node label: its domains are the
  HyperNodes of that tier.
* :func:`hypernode_labels`: Volcano's ``topology.volcano.sh/v1alpha1`` HyperNodes (tier 1 the
  innermost; members are Nodes or HyperNodes, matched by ``exactMatch.name``,
  ``regexMatch.pattern`` or ``labelMatch`` with ``matchLabels`` and ``matchExpressions``)
  turned into one made-up label per tier on each node (:func:`with_hypernodes` sets them and
  drops any the node carries itself), so
  :meth:`~mpijob.placement.fabric.Fabric.location` reads them like any label;
  :func:`fabric_from_hypernodes` gives levels for every tier the HyperNodes use.

Read by the handlers (node labels, HyperNodes) and the benchmark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mpijob import keys
from mpijob.placement.bandwidth import DEFAULT_INTER_NODE_GBPS
from mpijob.placement.fabric import Fabric, Level

#: The label that names a node; a Topology level on it is the node level.
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"


def fabric_from_spec(spec: Mapping[str, Any], *, name: str = "configured") -> Fabric:
    """A fabric from settings; ValueError naming the field when something is wrong."""
    raw_levels = spec.get("levels", [])
    if not isinstance(raw_levels, list):
        raise ValueError("fabric.levels: must be a list of {name, nodeLabel, gbps}")
    levels = []
    for index, raw in enumerate(raw_levels):
        where = f"fabric.levels[{index}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: must be a mapping with name, nodeLabel and gbps")
        label = raw.get("nodeLabel")
        tier = raw.get("hyperNodeTier")
        if tier is not None:
            if label is not None:
                raise ValueError(f"{where}: name a nodeLabel or a hyperNodeTier, not both")
            if isinstance(tier, bool) or not isinstance(tier, int) or tier < 0:
                raise ValueError(f"{where}.hyperNodeTier: a HyperNode tier (0 or more) is required")
            label = tier_label(tier)
        if not isinstance(label, str) or not label:
            raise ValueError(
                f"{where}.nodeLabel: a node label key (or a hyperNodeTier) is required"
            )
        if label == HOSTNAME_LABEL:
            continue
        level_name = raw.get("name")
        if not isinstance(level_name, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", level_name):
            raise ValueError(f"{where}.name: a lower-case name such as 'clique' is required")
        levels.append(Level(level_name, label, _gbps(raw.get("gbps"), f"{where}.gbps")))
    outside = spec.get("outsideGbps", DEFAULT_INTER_NODE_GBPS)
    return Fabric(name, tuple(levels), _gbps(outside, "fabric.outsideGbps"))


def _gbps(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where}: a positive number of GB/s per direction is required")
    return float(value)


def tier_label(tier: int) -> str:
    """The made-up node label carrying a node's HyperNode of ``tier``."""
    return f"{keys.PREFIX}hypernode-tier-{tier}"


def fabric_from_hypernodes(
    hypernodes: Sequence[Mapping[str, Any]],
    tier_gbps: Mapping[int, float],
    *,
    outside_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> Fabric:
    """Levels for the tiers the HyperNodes use, outermost (highest tier) first."""
    tiers = sorted({_tier(hypernode) for hypernode in hypernodes}, reverse=True)
    missing = [tier for tier in tiers if tier not in tier_gbps]
    if missing:
        raise ValueError(f"no bandwidth given for HyperNode tier {missing[0]}")
    levels = tuple(Level(f"tier-{tier}", tier_label(tier), tier_gbps[tier]) for tier in tiers)
    return Fabric("hypernodes", levels, outside_gbps)


def source(label: str) -> str:
    """Where a level's domains come from, in words: the node label, or ``tier <n>`` (of
    HyperNodes)."""
    prefix = tier_label(0)[:-1]
    if label.startswith(prefix) and label[len(prefix) :].isdigit():
        return f"tier {label[len(prefix) :]}"
    return label


def hypernode_tiers(fabric: Fabric) -> tuple[int, ...]:
    """The HyperNode tiers a fabric's levels read (none: it needs no HyperNodes)."""
    prefix = tier_label(0)[:-1]
    return tuple(
        int(level.label[len(prefix) :])
        for level in fabric.levels
        if level.label.startswith(prefix) and level.label[len(prefix) :].isdigit()
    )


def with_hypernodes(
    labels: Mapping[str, Mapping[str, str]], hypernodes: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, str]]:
    """Each node's labels (node name -> labels) with its HyperNode per tier as made-up labels;
    a tier label the node carries itself is dropped: only HyperNodes say where a node is."""
    prefix = tier_label(0)[:-1]
    found = hypernode_labels(hypernodes, labels)
    return {
        node: {k: v for k, v in own.items() if not k.startswith(prefix)} | found[node]
        for node, own in labels.items()
    }


def hypernode_labels(
    hypernodes: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """For each node (name -> labels), one label per tier naming its HyperNode there.

    A member that matches nothing, an unreadable selector or pattern, and a cycle of
    HyperNodes are skipped: the nodes they would place are in no domain at that tier.
    """
    by_name = {str(h.get("metadata", {}).get("name", "")): h for h in hypernodes}
    parent: dict[str, str] = {}  # HyperNode -> the HyperNode holding it
    leaf_of: dict[str, str] = {}  # node -> the lowest-tier HyperNode holding it
    for name, hypernode in sorted(by_name.items(), key=lambda item: (_tier(item[1]), item[0])):
        for member in hypernode.get("spec", {}).get("members", []) or []:
            kind = member.get("type", "Node")
            selector = member.get("selector", {}) or {}
            if kind == "HyperNode":
                children: dict[str, Mapping[str, str]] = {c: {} for c in by_name if c != name}
                for child in _selected(selector, children):
                    parent.setdefault(child, name)
            else:
                for node in _selected(selector, nodes):
                    leaf_of.setdefault(node, name)
    out: dict[str, dict[str, str]] = {}
    for node in nodes:
        tiers: dict[str, str] = {}
        current = leaf_of.get(node)
        seen: set[str] = set()
        while current is not None and current not in seen:
            seen.add(current)
            tiers[tier_label(_tier(by_name[current]))] = current
            current = parent.get(current)
        out[node] = tiers
    return out


def _tier(hypernode: Mapping[str, Any]) -> int:
    tier = hypernode.get("spec", {}).get("tier")
    if isinstance(tier, bool) or not isinstance(tier, int):
        name = hypernode.get("metadata", {}).get("name")
        raise ValueError(f"HyperNode {name!r}: spec.tier must be an integer")
    return tier


def _selected(
    selector: Mapping[str, Any], candidates: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The names among ``candidates`` (name -> labels) that a member's selector picks."""
    exact = selector.get("exactMatch")
    if exact:
        name = exact.get("name")
        return [name] if name in candidates else []
    pattern = selector.get("regexMatch")
    if pattern:
        try:
            # Go's regexp.MatchString, as Volcano calls it, finds the pattern anywhere.
            compiled = re.compile(str(pattern.get("pattern", "")))
        except re.error:
            return []
        return [name for name in candidates if compiled.search(name)]
    match = selector.get("labelMatch")
    if match:
        wanted = match.get("matchLabels") or {}
        expressions = match.get("matchExpressions") or []
        if not wanted and not expressions:
            return []
        return [
            name
            for name, labels in candidates.items()
            if all(labels.get(k) == v for k, v in wanted.items())
            and all(_expression(e, labels) for e in expressions)
        ]
    return []


def _expression(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector requirement, as Kubernetes evaluates it; an unknown operator fails."""
    key, operator = str(expression.get("key")), expression.get("operator")
    values = expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False
