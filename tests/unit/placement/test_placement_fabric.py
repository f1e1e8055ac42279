"""The fabric model: levels, locations from labels, hop bandwidths, shipped fabrics, HyperNodes."""

from __future__ import annotations

import pytest

from mpijob.placement import fabric
from mpijob.placement.fabric import Fabric, Level, hop_gbps, shared_depth
from mpijob.placement.fabric_labels import (
    HOSTNAME_LABEL,
    fabric_from_hypernodes,
    fabric_from_spec,
    hypernode_labels,
    hypernode_tiers,
    source,
    tier_label,
    with_hypernodes,
)

pytestmark = pytest.mark.unit

NVL72 = fabric.load("nvl72")


def test_location_reads_labels_outermost_first_and_stops_at_the_first_missing_one() -> None:
    labels = {
        fabric.BLOCK_LABEL: "b1",
        fabric.SUBBLOCK_LABEL: "s4",
        fabric.CLIQUE_LABEL: "7f3e.2",
        "kubernetes.io/hostname": "gb-0",
    }
    assert NVL72.location(labels) == ("b1", "s4", "7f3e.2")
    # Without a leaf label the clique label is not believed: domains nest.
    assert NVL72.location({fabric.BLOCK_LABEL: "b1", fabric.CLIQUE_LABEL: "7f3e.2"}) == ("b1",)
    assert NVL72.location({}) == ()
    assert NVL72.location({fabric.BLOCK_LABEL: ""}) == ()


def test_hop_is_the_innermost_domain_shared_by_all_nodes() -> None:
    a, b = ("b1", "s1", "c1"), ("b1", "s1", "c2")
    assert shared_depth([a, a]) == 3
    assert hop_gbps(NVL72, [a, ("b1", "s1", "c1")]) == 900.0
    assert hop_gbps(NVL72, [a, b]) == 50.0
    assert hop_gbps(NVL72, [a, b, ("b1", "s2", "c3")]) == 25.0
    assert hop_gbps(NVL72, [a, ("b2", "s1", "c1")]) == 12.5
    # Same leaf name under two blocks is two leaves.
    assert shared_depth([("b1", "s1"), ("b2", "s1")]) == 0
    # A node without labels shares nothing.
    assert hop_gbps(NVL72, [a, ()]) == NVL72.outside_gbps


def test_shipped_fabrics_carry_their_documented_numbers() -> None:
    assert [(lv.name, lv.label, lv.gbps) for lv in NVL72.levels] == [
        ("block", "cloud.google.com/gce-topology-block", 25.0),
        ("leaf", "cloud.google.com/gce-topology-subblock", 50.0),
        ("clique", "nvidia.com/gpu.clique", 900.0),
    ]
    assert NVL72.level_names == ("block", "leaf", "clique", "node")
    assert fabric.load("hgx-h100-rail").level_names == ("block", "leaf", "node")
    seeds = fabric.load("dgx1-v100")
    assert seeds.levels == ()
    assert seeds.outside_gbps == 12.5  # today's --inter-node-bandwidth default
    with pytest.raises(ValueError, match="unknown fabric 'nvl36'"):
        fabric.load("nvl36")


def test_depths_and_names() -> None:
    assert NVL72.depth_of("block") == 1
    assert NVL72.depth_of("clique") == 3
    assert NVL72.depth_of("node") == 4
    assert NVL72.level_at(0) == "cluster"
    assert NVL72.level_at(2) == "leaf"
    with pytest.raises(ValueError, match="unknown fabric level 'rack'; known: block, leaf"):
        NVL72.depth_of("rack")


@pytest.mark.parametrize(
    ("levels", "outside", "problem"),
    [
        ((Level("a", "x", 10.0), Level("a", "y", 20.0)), 1.0, "level names must be unique"),
        ((Level("a", "x", 10.0), Level("b", "x", 20.0)), 1.0, "its own node label"),
        ((Level("node", "x", 10.0),), 1.0, "reserved"),
        ((Level("a", "x", 0.0),), 1.0, "positive"),
        ((Level("a", "x", 50.0), Level("b", "y", 20.0)), 1.0, "'b' .* slower"),
        ((Level("a", "x", 5.0),), 10.0, "'a' .* slower"),
    ],
)
def test_inconsistent_fabrics_are_refused(
    levels: tuple[Level, ...], outside: float, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        Fabric("bad", levels, outside)


def test_levels_from_settings_as_kueue_lists_them() -> None:
    configured = fabric_from_spec(
        {
            "levels": [
                {"name": "block", "nodeLabel": fabric.BLOCK_LABEL, "gbps": 25},
                {"name": "subblock", "nodeLabel": fabric.SUBBLOCK_LABEL, "gbps": 50},
                {"nodeLabel": HOSTNAME_LABEL},
            ],
            "outsideGbps": 10,
        }
    )
    assert configured.level_names == ("block", "subblock", "node")
    assert configured.outside_gbps == 10.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"levels": {}}, "fabric.levels: must be a list"),
        ({"levels": [{"name": "a", "gbps": 1}]}, r"fabric.levels\[0\].nodeLabel"),
        ({"levels": [{"name": "A b", "nodeLabel": "x", "gbps": 1}]}, r"levels\[0\].name"),
        ({"levels": [{"name": "a", "nodeLabel": "x", "gbps": "fast"}]}, r"levels\[0\].gbps"),
        ({"levels": [], "outsideGbps": -1}, "fabric.outsideGbps"),
        (
            {"levels": [{"name": "a", "nodeLabel": "x", "hyperNodeTier": 1, "gbps": 1}]},
            r"levels\[0\]: name a nodeLabel or a hyperNodeTier, not both",
        ),
        (
            {"levels": [{"name": "a", "hyperNodeTier": "one", "gbps": 1}]},
            r"levels\[0\].hyperNodeTier",
        ),
    ],
)
def test_bad_settings_name_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fabric_from_spec(spec)


def _hypernode(name: str, tier: int, *members: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"tier": tier, "members": list(members)}}


def test_hypernodes_become_one_location_per_node() -> None:
    hypernodes = [
        _hypernode("s0", 1, {"type": "Node", "selector": {"exactMatch": {"name": "node-0"}}}),
        _hypernode("s1", 1, {"type": "Node", "selector": {"regexMatch": {"pattern": "node-[12]"}}}),
        _hypernode(
            "s2", 1, {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "r3"}}}}
        ),
        _hypernode(
            "s4",
            2,
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "s0"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "s1"}}},
        ),
        _hypernode("s5", 2, {"type": "HyperNode", "selector": {"exactMatch": {"name": "s2"}}}),
    ]
    nodes = {"node-0": {}, "node-1": {}, "node-2": {}, "node-3": {"rack": "r3"}, "node-9": {}}
    labels = hypernode_labels(hypernodes, nodes)
    built = fabric_from_hypernodes(hypernodes, {1: 50.0, 2: 25.0}, outside_gbps=12.5)
    assert built.level_names == ("tier-2", "tier-1", "node")
    assert labels["node-0"] == {tier_label(1): "s0", tier_label(2): "s4"}
    where = {node: built.location(found) for node, found in labels.items()}
    assert where == {
        "node-0": ("s4", "s0"),
        "node-1": ("s4", "s1"),
        "node-2": ("s4", "s1"),
        "node-3": ("s5", "s2"),
        "node-9": (),
    }
    assert hop_gbps(built, [where["node-1"], where["node-2"]]) == 50.0
    assert hop_gbps(built, [where["node-0"], where["node-1"]]) == 25.0
    assert hop_gbps(built, [where["node-0"], where["node-3"]]) == 12.5
    with pytest.raises(ValueError, match="no bandwidth given for HyperNode tier 2"):
        fabric_from_hypernodes(hypernodes, {1: 50.0})


def test_levels_on_hypernode_tiers_read_the_hypernodes_not_the_nodes_own_labels() -> None:
    built = fabric_from_spec(
        {
            "levels": [
                {"name": "spine", "hyperNodeTier": 2, "gbps": 25},
                {"name": "rack", "hyperNodeTier": 1, "gbps": 900},
                {"nodeLabel": "kubernetes.io/hostname"},
            ],
            "outsideGbps": 12.5,
        }
    )
    assert built.level_names == ("spine", "rack", "node")
    assert hypernode_tiers(built) == (2, 1)
    assert hypernode_tiers(fabric.load("nvl72")) == ()
    assert source(built.levels[1].label) == "tier 1"
    assert source(fabric.CLIQUE_LABEL) == fabric.CLIQUE_LABEL
    hypernodes = [
        _hypernode(
            "rack-a",
            1,
            {
                "type": "Node",
                "selector": {
                    "labelMatch": {
                        "matchLabels": {"pool": "gb"},
                        "matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["a"]},
                            {"key": "cordoned", "operator": "DoesNotExist"},
                        ],
                    }
                },
            },
        ),
        _hypernode(
            "rack-b",
            1,
            {"type": "Node", "selector": {"regexMatch": {"pattern": "^b-"}}},
            {"type": "Node", "selector": {"regexMatch": {"pattern": "([unclosed"}}},
        ),
        _hypernode(
            "spine-0", 2, {"type": "HyperNode", "selector": {"regexMatch": {"pattern": "rack-"}}}
        ),
    ]
    # A node's own mpijob.io/hypernode-tier-* label is never believed: only HyperNodes place it.
    forged = {tier_label(1): "rack-b", tier_label(2): "spine-0"}
    nodes = {
        "a-0": {"pool": "gb", "rack": "a"},
        "a-1": {"pool": "gb", "rack": "a", "cordoned": "yes"},
        "b-0": {},
        "c-0": forged,
    }
    labels = with_hypernodes(nodes, hypernodes)
    where = {node: built.location(own) for node, own in labels.items()}
    assert where == {
        "a-0": ("spine-0", "rack-a"),
        "a-1": (),
        "b-0": ("spine-0", "rack-b"),
        "c-0": (),
    }
    assert labels["a-0"]["rack"] == "a", "the node's other labels stay"
    # No HyperNodes at all (Volcano's CRD absent): no node is in a domain of those levels.
    assert {built.location(own) for own in with_hypernodes(nodes, []).values()} == {()}
