"""The Kubernetes minor of the local cluster: one variable, resolved alike in Python and shell."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hack import common

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.unit


def shell(minor: str | None, *names: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({"K8S_VERSION": minor} if minor is not None else {})
    echo = " ".join(f'"${{{n}}}"' for n in names)
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source hack/versions.sh; echo {echo}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("minor", [None, "1.35", "1.36", "1.37"])
def test_python_and_shell_pick_the_same_pins(
    minor: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if minor is None:
        monkeypatch.delenv("K8S_VERSION", raising=False)
    else:
        monkeypatch.setenv("K8S_VERSION", minor)
    pins = common.versions()
    names = ("K8S_VERSION", "KUBE_VERSION", "CONTROLLER_RUNTIME_VERSION", "SCHED_PLUGINS_VERSION")
    out = shell(minor, *names)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [pins[n] for n in names]
    # The chosen minor's Kubernetes, of that minor.
    assert pins["KUBE_VERSION"].startswith(pins["K8S_VERSION"] + ".")


def test_the_default_is_the_newest_supported_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("K8S_VERSION", raising=False)
    pins = common.versions()
    assert pins["K8S_VERSION"] == pins["K8S_VERSIONS"].split()[-1] == "1.37"


def test_every_supported_minor_has_its_per_minor_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("K8S_VERSION", raising=False)
    raw = common.versions()
    per_minor = {k.rsplit("_", 2)[0] for k in raw if k.endswith(("_1_35", "_1_36", "_1_37"))}
    for minor in raw["K8S_VERSIONS"].split():
        suffix = "_" + minor.replace(".", "_")
        assert {k for k in raw if k.endswith(suffix)} == {p + suffix for p in per_minor}


@pytest.mark.parametrize("minor", ["1.34", "1.37.2", "latest"])
def test_an_unsupported_minor_is_refused_naming_the_choices(
    minor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K8S_VERSION", minor)
    with pytest.raises(SystemExit) as e:
        common.versions()
    assert f"K8S_VERSION={minor}" in str(e.value)
    assert "1.35 1.36 1.37" in str(e.value)
    out = shell(minor, "KUBE_VERSION")
    assert out.returncode == 2
    assert out.stdout == ""
    assert f"K8S_VERSION={minor}: the local cluster runs one of 1.35 1.36 1.37" in out.stderr
