"""The fabric level a job asks for, from its annotations, and the errors that name the fix."""

from __future__ import annotations

import pytest

from mpijob import keys
from mpijob.api.fabric import FabricLevel, fabric_level

pytestmark = pytest.mark.unit

LEVELS = ("block", "leaf", "clique", "node")


def test_no_annotation_no_level() -> None:
    assert fabric_level({"other": "x"}, LEVELS) == (None, [])


def test_required_and_preferred_levels() -> None:
    assert fabric_level({keys.FABRIC_REQUIRED_LEVEL: "clique"}, LEVELS) == (
        FabricLevel("clique", required=True),
        [],
    )
    assert fabric_level({keys.FABRIC_PREFERRED_LEVEL: "leaf"}, LEVELS) == (
        FabricLevel("leaf", required=False),
        [],
    )


def test_unknown_level_lists_the_fabric_levels() -> None:
    level, errors = fabric_level({keys.FABRIC_REQUIRED_LEVEL: "rack"}, LEVELS)
    assert level is None
    assert [str(e) for e in errors] == [
        "metadata.annotations[mpijob.io/fabric-required-level]: Unsupported value: "
        '"rack": supported values: "block", "clique", "leaf", "node"'
    ]


def test_empty_value_says_what_to_write() -> None:
    _, errors = fabric_level({keys.FABRIC_PREFERRED_LEVEL: ""}, LEVELS)
    assert [str(e) for e in errors] == [
        "metadata.annotations[mpijob.io/fabric-preferred-level]: Required value: "
        "name a fabric level, one of: block, leaf, clique, node"
    ]


def test_both_annotations_are_refused_naming_both() -> None:
    level, errors = fabric_level(
        {keys.FABRIC_REQUIRED_LEVEL: "clique", keys.FABRIC_PREFERRED_LEVEL: "clique"}, LEVELS
    )
    assert level is None
    assert len(errors) == 1
    assert "set only one of mpijob.io/fabric-required-level" in str(errors[0])
    assert "mpijob.io/fabric-preferred-level (span domains" in str(errors[0])
