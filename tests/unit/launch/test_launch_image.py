"""mpijob-launch in the operator's image: both recipes build it the same way and put it where
the pods copy it from, and its sources decide the image's tag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack import launch_binary, operator_image
from mpijob.desired import launch

pytestmark = pytest.mark.unit

ROOT = Path(operator_image.ROOT)


def dockerfile_steps() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    return [
        (op, " ".join(rest.split()))
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
        for op, rest in [line.split(maxsplit=1)]
    ]


def test_both_recipes_put_the_binary_where_the_pods_copy_it_from() -> None:
    assert operator_image.LAUNCH_BINARY == launch.IMAGE_BINARY
    copies = [rest for op, rest in dockerfile_steps() if op == "COPY" and "--from=launch" in rest]
    assert copies == [f"--from=launch /mpijob-launch {launch.IMAGE_BINARY}"]
    hooks = operator_image.hooks(Path("/wheels"), Path("/built/mpijob-launch"))
    installs = [h for h in hooks if h.endswith(f'"$1{launch.IMAGE_BINARY}"')]
    assert installs == [
        f'install -m 0755 -o root -g root /built/mpijob-launch "$1{launch.IMAGE_BINARY}"'
    ]


def test_both_recipes_build_it_static_with_the_same_flags() -> None:
    (build,) = [rest for op, rest in dockerfile_steps() if op == "RUN" and "go build" in rest]
    assert "CGO_ENABLED=0" in build
    assert f'GOFLAGS="{launch_binary.GOFLAGS}"' in build
    assert f'-ldflags="{launch_binary.LDFLAGS}"' in build
    env = launch_binary.build_env()
    assert env["CGO_ENABLED"] == "0"
    assert env["GOTOOLCHAIN"] == "local"
    assert launch_binary.GOFLAGS in env["GOFLAGS"]
    assert "-trimpath" in launch_binary.GOFLAGS
    assert launch_binary.LDFLAGS == "-s -w"


def test_the_binarys_sources_are_in_the_images_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {p.name for p in launch_binary.sources()}
    assert {"go.mod", "go.sum", "main.go", "serve.go", "agent.go"} <= names
    assert not {n for n in names if n.endswith("_test.go")}  # a test edit rebuilds nothing
    before = operator_image.digest()
    monkeypatch.setattr(launch_binary, "digest", lambda: "another-build-of-launch")
    assert operator_image.digest() != before
