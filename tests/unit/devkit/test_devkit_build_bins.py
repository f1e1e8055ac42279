"""hack/build-bins.sh's driver: what it builds side by side, what a failure says, what it refuses.

Go is a stub on PATH that knows its version and nothing else, so every real build fails at its
first download: what is checked is the driver around the builds, not Go.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hack import common

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "hack" / "build-bins.sh"

GO_STUB = """#!/bin/sh
case "$*" in
  "env GOVERSION") echo go1.26.1 ;;
  "env GOPROXY") echo https://proxy.invalid ;;
  *) echo "stub go: no module proxy here ($*)" >&2; exit 1 ;;
esac
"""

pytestmark = pytest.mark.unit


def run(
    tmp_path: Path, *components: str, gocache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "go").write_text(GO_STUB)
    (stub / "go").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "REAL_NODES": "0"}
    env.pop("GOCACHE", None)
    if gocache:
        env["GOCACHE"] = str(gocache)
    return subprocess.run(
        [str(SCRIPT), *components], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPIJOB_CACHE", str(tmp_path / "cache"))


def built(name: str) -> None:
    """Marks a binary as built, where the driver's check for it looks."""
    path = common.binaries()[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_what_is_built_is_not_built_again_and_the_run_says_so(tmp_path: Path) -> None:
    built("etcd")
    out = run(tmp_path, "etcd")
    assert out.returncode == 0, out.stderr
    assert "etcd ready (0 s)" in out.stderr
    assert "all ready in" in out.stderr


def test_a_failed_build_shows_the_end_of_its_log_and_the_one_beside_it_still_runs(
    tmp_path: Path,
) -> None:
    built("etcd")
    out = run(tmp_path, "kwok", "etcd")
    assert out.returncode != 0
    assert "kwok failed after" in out.stderr
    log = tmp_path / "cache" / "logs" / "kwok.log"
    assert f"the end of {log}" in out.stderr
    # The tail of the log, shown where the person waiting looks: the stub's refusal.
    assert "stub go: no module proxy here" in out.stderr
    assert "stub go: no module proxy here" in log.read_text()
    assert "etcd ready" in out.stderr
    assert "a build failed" in out.stderr
    assert "all ready" not in out.stderr


def test_an_unknown_component_is_refused_before_anything_builds(tmp_path: Path) -> None:
    out = run(tmp_path, "etcd", "kubelets")
    assert out.returncode != 0
    assert "unknown component 'kubelets'" in out.stderr
    assert "etcd" not in out.stderr.split("unknown component")[0]
    assert not (tmp_path / "cache" / "logs").exists()


def test_compiled_packages_are_not_kept_after_a_build_unless_the_go_cache_is_the_users(
    tmp_path: Path,
) -> None:
    built("etcd")
    ours = tmp_path / "cache" / "go-build"
    (ours / "00").mkdir(parents=True)
    assert run(tmp_path, "etcd").returncode == 0
    assert not ours.exists()

    theirs = tmp_path / "users-go-build"
    (theirs / "00").mkdir(parents=True)
    assert run(tmp_path, "etcd", gocache=theirs).returncode == 0
    assert (theirs / "00").is_dir()


def test_a_failed_build_keeps_the_compiled_packages_for_the_next_try(tmp_path: Path) -> None:
    ours = tmp_path / "cache" / "go-build"
    (ours / "00").mkdir(parents=True)
    assert run(tmp_path, "kwok").returncode != 0
    assert (ours / "00").is_dir()
