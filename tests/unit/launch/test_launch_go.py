"""mpijob-launch's own Go tests (option parsing, key loading, what the server offers, signals)
and its formatting, run with the suite so they are not left to whoever remembers `go test`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hack import launch_binary

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def go() -> str:
    found = shutil.which("go")
    if found is None:
        pytest.skip("Go is not installed: launch/'s Go tests cannot run (hack/launch_binary.py)")
    return found


def test_go_tests_pass(go: str) -> None:
    out = subprocess.run(
        [go, "test", "-count=1", "./..."],
        cwd=launch_binary.SOURCE,
        env=launch_binary.build_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_go_sources_are_gofmt_clean(go: str) -> None:
    gofmt = shutil.which("gofmt") or str(Path(go).resolve().parent / "gofmt")
    out = subprocess.run(
        [gofmt, "-l", "."], cwd=launch_binary.SOURCE, capture_output=True, text=True, check=True
    )
    assert out.stdout == ""
