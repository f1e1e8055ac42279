"""The test lanes' table (tests/support/lanes.py) matches the integration tests as they are."""

from __future__ import annotations

import re
from pathlib import Path

from support import lanes

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_integration_module_has_a_lane_and_every_entry_a_module() -> None:
    files = {p.name for p in INTEGRATION.glob("test_*.py")}
    assert set(lanes.MODULES) == files


def test_every_test_named_apart_from_its_module_exists_and_differs() -> None:
    for key, where in lanes.TESTS.items():
        module, name = key.split("::")
        name = name.split("[", 1)[0]
        assert re.search(rf"^def {name}\(", (INTEGRATION / module).read_text(), re.M), key
        assert where != lanes.MODULES[module], key


def test_a_lane_is_read_from_an_id_with_parameters_and_a_suffix() -> None:
    module, name = next(iter(lanes.TESTS)).split("::")
    assert (
        lanes.lane(f"tests/integration/{module}::{name}[p-1]@x") == lanes.TESTS[f"{module}::{name}"]
    )
    assert lanes.lane("tests/integration/test_kueue.py::test_x") == lanes.EXCLUSIVE
    assert lanes.lane("tests/integration/test_gang.py::test_x[a]") == lanes.GPUS
    assert lanes.lane("tests/unit/test_lanes.py::test_x") is None
    assert lanes.lane("tests/integration/test_new.py::test_x") is None


def test_one_case_of_a_parametrized_test_may_have_a_lane_of_its_own() -> None:
    test = "tests/integration/test_examples.py::test_example_reaches_its_end_state"
    assert lanes.lane(f"{test}[pi.yaml]@x") == lanes.FREE
    assert lanes.lane(f"{test}[pytorch-vgg16.yaml]") == lanes.GPUS
