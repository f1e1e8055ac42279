"""The import contract on Kopf's private API covers every private package of the installed Kopf,
and allows them to one module only."""

from __future__ import annotations

import configparser
from pathlib import Path

import kopf
import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def contract() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config["importlinter:contract:kopf-private"]


def lines(value: str) -> set[str]:
    return {line.strip() for line in value.splitlines() if line.strip()}


def test_every_private_package_of_the_installed_kopf_is_forbidden() -> None:
    installed = {
        f"kopf.{p.name}"
        for p in Path(kopf.__file__).parent.iterdir()
        if p.name.startswith("_") and not p.name.startswith("__") and (p / "__init__.py").exists()
    }
    assert {"kopf._cogs", "kopf._core"} <= installed  # what kopf_tuning imports, found here
    assert lines(contract()["forbidden_modules"]) == installed


def test_only_kopf_tuning_is_let_through() -> None:
    section = contract()
    assert lines(section["source_modules"]) == {"mpijob"}
    allowed = lines(section["ignore_imports"])
    assert allowed
    assert {rule.split(" -> ")[0] for rule in allowed} == {"mpijob.platform.kopf_tuning"}
