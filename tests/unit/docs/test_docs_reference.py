"""docs/reference.md: generated from keys.py and metrics.py, complete, and refused when a key is
not described."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import REGISTRY

from mpijob import keys
from mpijob import metrics as _metrics  # noqa: F401 - registers the operator's metrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def load_generator() -> ModuleType:
    """docs/generate_reference.py is a script: loaded as a module so a test can point it
    elsewhere."""
    spec = importlib.util.spec_from_file_location(
        "generate_reference", ROOT / "docs" / "generate_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    assert load_generator().render() == REFERENCE, "run: python docs/generate_reference.py"


def test_every_key_and_metric_is_in_the_reference() -> None:
    """Read from the imported modules, not from the source the generator parses, so a constant
    or metric its parsing skipped shows here."""
    missing = [
        name
        for name, value in vars(keys).items()
        if name.isupper() and f"`{value}` (`{name}`)" not in REFERENCE
    ]
    assert missing == []
    ours = [
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
        if family.name.startswith(("mpi_operator_", "mpijob_agent_"))
    ]
    assert len(ours) >= 20
    assert [name for name in ours if f"| `{name}` |" not in REFERENCE] == []


def fake_keys(tmp_path: Path, source: str) -> ModuleType:
    path = tmp_path / "keys.py"
    path.write_text(source)
    module = ModuleType("fake_keys")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def test_a_comment_describes_its_run_and_a_key_with_neither_stops_the_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "from typing import Final\n"
        "# --- Things -----\n"
        "#: Described together.\n"
        'A: Final = "a"\n'
        'B: Final = "b"\n'
        "\n"
        'C: Final = "c"\n'
        '"""Described alone."""\n'
        'D: Final = "d"\n'
        "\n"
        'E: Final = "e"\n'
    )
    generator = load_generator()
    module = fake_keys(tmp_path, source)
    monkeypatch.setattr(generator, "keys", module)
    monkeypatch.setattr(generator, "KEYS_SOURCE", Path(module.__file__ or ""))
    with pytest.raises(SystemExit) as refused:
        generator.read_keys()
    # B runs on under A's comment and C has its docstring; D, right under C's, and E have none.
    assert "describes D, E " in str(refused.value)

    module = fake_keys(
        tmp_path, source.replace('E: Final = "e"\n', "").replace('D: Final = "d"\n', "")
    )
    monkeypatch.setattr(generator, "keys", module)
    (section,) = generator.read_keys()
    assert section.title == "Things"
    assert [[c.name for c in g.members] for g in section.groups] == [["A", "B"], ["C"]]
    assert generator.render_group(section.groups[0]) == [
        "- `a` (`A`), `b` (`B`): Described together."
    ]
