"""What the operator's process holds before any work: the packages it must not import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# The command's own steps, in a fresh interpreter: what `mpijob-operator run` imports.
OPERATOR_IMPORTS = """
import json, sys
from mpijob import cli
cli._without_official_client()
import kopf
from mpijob.handlers import startup
print(json.dumps(sorted(m for m in ("kubernetes", "networkx", "numpy") if sys.modules.get(m))))
"""


def test_the_operator_imports_neither_the_official_client_nor_the_numeric_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-c", OPERATOR_IMPORTS], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
