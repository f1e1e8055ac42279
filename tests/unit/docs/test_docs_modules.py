"""The module map in docs/development.md: generated from the modules' docstrings, one row per
module, checked by ``make lint``, and refused when a module has no docstring."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DEVELOPMENT = (ROOT / "docs" / "development.md").read_text()


def load_generator() -> ModuleType:
    """docs/generate_modules.py is a script: loaded as a module so a test can point it
    elsewhere."""
    spec = importlib.util.spec_from_file_location(
        "generate_modules", ROOT / "docs" / "generate_modules.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_map_is_what_the_generator_writes() -> None:
    generator = load_generator()
    assert generator.splice(DEVELOPMENT, generator.render()) == DEVELOPMENT, "run: make modules"


def test_every_module_of_the_package_has_a_row() -> None:
    generator = load_generator()
    block = generator.render()
    package = ROOT / "operator" / "mpijob"
    modules = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    ]
    assert len(modules) > 100
    assert [m for m in modules if f"| [`{m}`](../operator/mpijob/{m}) |" not in block] == []
    assert "**`mpijob.platform`**: What is not a feature" in block


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_package_and_its_modules_by_their_first_sentences(tmp_path: Path) -> None:
    package = write(
        tmp_path / "pkg",
        {
            "__init__.py": '"""The package. Said once.\n\nMore."""\n',
            "b.py": '"""Reads a :class:`~pkg.a.Thing` (``x | y``), e.g. a pod.\n  Then more."""',
            "a.py": '"""One line without a stop"""\nimport os\n',
            "sub/__init__.py": '"""A sub-package: :mod:`pkg.sub.c`."""\n',
            "sub/c.py": '"""C.\n\nSecond paragraph."""\n',
        },
    )
    block = load_generator().render(package)
    assert block.splitlines()[2:] == [
        "**`pkg`**: The package.",
        "",
        "| Module | What it is |",
        "|---|---|",
        f"| [`a.py`]({package}/a.py) | One line without a stop |",
        f"| [`b.py`]({package}/b.py) | Reads a `Thing` (`x \\| y`), e.g. a pod. |",
        "",
        "**`pkg.sub`**: A sub-package: `pkg.sub.c`.",
        "",
        "| Module | What it is |",
        "|---|---|",
        f"| [`sub/c.py`]({package}/sub/c.py) | C. |",
        "",
        "<!-- end of the generated module map -->",
    ]


def test_a_module_without_a_docstring_stops_the_generator_naming_it(tmp_path: Path) -> None:
    package = write(
        tmp_path / "pkg",
        {
            "__init__.py": '"""The package."""\n',
            "fine.py": '"""Fine."""\n',
            "bare.py": "# a comment is no docstring\nVALUE = 1\n",
            "sub/__init__.py": "",
        },
    )
    with pytest.raises(SystemExit) as refused:
        load_generator().render(package)
    assert str(refused.value).endswith(": pkg.bare, pkg.sub")


def test_the_check_fails_on_a_stale_map_and_leaves_the_prose_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = load_generator()
    document = tmp_path / "development.md"
    stale = f"# Before\n\n{generator.BEGIN}\n| old | row |\n{generator.END}\n\nAfter.\n"
    document.write_text(stale)
    monkeypatch.setattr(generator, "DOCUMENT", document)
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    assert generator.main(["--check"]) == 1
    assert "stale: run make modules" in capsys.readouterr().err
    assert document.read_text() == stale
    assert generator.main([]) == 0
    written = document.read_text()
    assert written.startswith(f"# Before\n\n{generator.BEGIN}\n\n**`mpijob`**: ")
    assert written.endswith(f"{generator.END}\n\nAfter.\n")
    assert "| old | row |" not in written
    assert generator.main(["--check"]) == 0

    document.write_text("# No markers\n")
    with pytest.raises(SystemExit, match="lacks the module map's markers"):
        generator.main(["--check"])
