#!/usr/bin/env python3
"""``mpijob-launch``, the launch agent and server of jobs that run without sshd (``launch/``),
built on this machine for the operator's image (hack/operator_image.py) and the tests.

The binary is static (``CGO_ENABLED=0``) and reproducible (``-trimpath``, no VCS stamp, no
symbols), built as the ``Dockerfile``'s ``launch`` stage builds it, with the local Go
(``GOTOOLCHAIN=local``) and Go's caches inside the project's (hack/common.py ``go_env``). It lies
in ``~/.cache/mpijob-operator/bin/mpijob-launch-<digest>/``, named after a digest of its sources
(``go.mod``, ``go.sum``, the non-test ``*.go`` files) and the build flags, and is built only when
that entry is missing: a test edit rebuilds nothing.

Usage: python -m hack.launch_binary build | path
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hack import common, images

SOURCE = common.ROOT / "launch"
NAME = "mpijob-launch"
#: The build's settings, the Dockerfile's ``launch`` stage's too (-dwarf=false: no debug
#: information compiled that ``-s -w`` would strip again).
GOFLAGS = "-trimpath -buildvcs=false -gcflags=all=-dwarf=false"
LDFLAGS = "-s -w"


def say(msg: str) -> None:
    print(f"[launch-binary] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> SystemExit:
    return SystemExit(f"[launch-binary] error: {msg}")


def sources() -> list[Path]:
    """What the binary is made of: the module files and the Go files that are not tests."""
    go = sorted(p for p in SOURCE.glob("*.go") if not p.name.endswith("_test.go"))
    return [SOURCE / "go.mod", SOURCE / "go.sum", *go]


def digest() -> str:
    return images.recipe_digest(sources(), json.dumps([NAME, GOFLAGS, LDFLAGS]))


def path() -> Path:
    return common.cache_dir() / "bin" / f"{NAME}-{digest()}" / NAME


def build_env() -> dict[str, str]:
    env = common.go_env()
    env["GOFLAGS"] = f"{env['GOFLAGS']} {GOFLAGS}"
    env["CGO_ENABLED"] = "0"
    env["GOTOOLCHAIN"] = "local"
    return env


def build(dest: Path) -> None:
    """Builds into a folder beside ``dest`` and renames it into place: a build that fails or
    is interrupted leaves no entry that :func:`ensure` would take for a finished one."""
    if not shutil.which("go"):
        raise die(
            f"Go is needed to build {NAME}: install Go >= 1.26 (https://go.dev/doc/install) "
            "and re-run"
        )
    dest.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{NAME}-build-", dir=dest.parent.parent) as tmp:
        out = Path(tmp) / dest.parent.name
        out.mkdir()
        result = subprocess.run(
            ["go", "build", f"-ldflags={LDFLAGS}", "-o", str(out / NAME), "."],
            cwd=SOURCE,
            env=build_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise die(
                f"go build of {SOURCE} failed (exit {result.returncode}); it needs Go >= 1.26 "
                f"and golang.org/x/crypto from the Go module proxy (GOPROXY):\n"
                f"{result.stdout}{result.stderr}"
            )
        try:
            out.rename(dest.parent)
        except OSError:
            if not dest.exists():  # not another process's build of the same sources
                raise


def prune(keep: Path, count: int = 3) -> None:
    """Removes all but the ``count`` newest builds (``keep`` among them): one per edit of the
    sources would pile up."""
    olds = sorted(
        (p for p in keep.parent.glob(f"{NAME}-*") if p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in olds[count - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def ensure() -> Path:
    """The binary, built first when its sources changed (or it was never built)."""
    dest = path()
    if dest.exists():
        return dest
    t0 = time.monotonic()
    say(f"building {dest.parent.name}")
    build(dest)
    prune(dest.parent)
    size = dest.stat().st_size / 2**20
    say(f"built {dest} in {time.monotonic() - t0:.0f}s ({size:.1f} MiB)")
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cmd", choices=["build", "path"])
    args = parser.parse_args()
    if args.cmd == "build":
        print(ensure())
    else:
        dest = path()
        print(f"{dest}{'' if dest.exists() else '  (not built)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
