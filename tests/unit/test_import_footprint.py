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


# The same imports with the collector paused, as `mpijob-operator run` loads them; then one that
# fails inside the pause.
PAUSED_IMPORTS = """
import gc, json
from mpijob import cli
cli._without_official_client()
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
with cli._collector_paused():
    from mpijob.handlers import startup
after = [gc.isenabled(), gc.get_freeze_count(), len(collections)]
try:
    with cli._collector_paused():
        import mpijob.no_such_module
except ImportError:
    pass
print(json.dumps(after + [gc.isenabled()]))
"""


def test_the_operator_loads_its_modules_without_collecting_then_freezes_them() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PAUSED_IMPORTS], capture_output=True, text=True, check=True
    )
    enabled, frozen, collections, enabled_after_failure = json.loads(out.stdout)
    assert collections == 0  # not one collection while Kopf, aiohttp, pydantic and ours load
    assert frozen > 50_000  # what they made: out of every later collection's way
    assert enabled
    assert enabled_after_failure  # an import that fails inside the pause resumes it too
