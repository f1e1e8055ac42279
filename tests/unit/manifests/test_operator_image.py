"""The image built for the real nodes (hack/operator_image.py) and the Dockerfile: one recipe."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml
from manifests_files import ROOT

from hack import operator_image

pytestmark = pytest.mark.unit

COMPONENTS = ROOT / "manifests" / "components"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    return [
        (op, rest)
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
        for op, rest in [line.split(maxsplit=1)]
    ]


def test_the_image_is_the_dockerfiles_debian_python_virtualenv_user_and_entrypoint() -> None:
    steps = instructions()
    bases = [rest.split()[0] for op, rest in steps if op == "FROM"]
    go_stage = f"golang:1.26-{operator_image.SUITE}"  # mpijob-launch only (tests/unit/launch)
    assert {f"debian:{operator_image.SUITE}-slim", go_stage} == set(bases)
    build_apt, runtime_apt = [
        rest for op, rest in steps if op == "RUN" and "apt-get install" in rest
    ]
    assert set(operator_image.PACKAGES) <= set(build_apt.split())
    kept = set(operator_image.PACKAGES) - set(operator_image.BUILD_ONLY)
    assert kept <= set(runtime_apt.split())
    assert not set(operator_image.BUILD_ONLY) & set(runtime_apt.split())
    assert f"python3 -m venv {operator_image.VENV}" in [rest for op, rest in steps if op == "RUN"]
    config = operator_image.CONFIG
    assert [rest for op, rest in steps if op == "USER"] == [config["User"]]
    assert [rest for op, rest in steps if op == "ENTRYPOINT"] == [
        '["' + '", "'.join(config["Entrypoint"]) + '"]'
    ]
    assert [rest for op, rest in steps if op == "CMD"] == ['["' + '", "'.join(config["Cmd"]) + '"]']
    (env,) = [rest for op, rest in steps if op == "ENV" and "PATH" in rest]
    for pair in config["Env"]:
        key, value = pair.split("=", 1)
        if key == "PATH":  # the virtualenv first, then the base image's PATH
            assert value.startswith(f"{operator_image.VENV}/bin:")
            pair = f"PATH={operator_image.VENV}/bin:$PATH"  # noqa: PLW2901
        assert pair in env.split()


def test_the_images_tag_follows_its_recipe() -> None:
    digest = operator_image.digest()
    assert operator_image.reference() == f"mpijob.local/mpijob-operator:{digest}"
    assert operator_image.archive_path().name == f"operator-{digest}.oci.tar"
    assert operator_image.digest_of(operator_image.archive_path()) == digest
    # The project's own sources are in the recipe; the README is not.
    names = {p.relative_to(ROOT).as_posix() for p in operator_image.sources()}
    assert "pyproject.toml" in names
    assert "operator/mpijob/cli.py" in names
    assert "README.md" not in names


def test_pins_hold_every_runtime_dependency_and_no_test_tool() -> None:
    pinned = {line.split("==")[0] for line in operator_image.pins()}
    assert {"kopf", "pydantic", "cryptography", "uvloop", "orjson", "grpcio"} <= pinned
    assert not {"pytest", "mypy", "ruff"} & pinned


def test_local_components_are_kustomize_components() -> None:
    for name in ("local-cluster", "upstream-names"):
        body = yaml.safe_load((COMPONENTS / name / "kustomization.yaml").read_text())
        assert body["kind"] == "Component", name
    renamed = yaml.safe_load((COMPONENTS / "upstream-names" / "kustomization.yaml").read_text())
    (patch,) = renamed["patches"]
    assert yaml.safe_load(patch["patch"]) == [
        {"op": "replace", "path": "/metadata/name", "value": "mpi-operator"}
    ]


def test_install_manifest_lives_where_the_readme_says() -> None:
    assert (ROOT / "deploy" / "mpi-operator.yaml").exists()
    assert (
        "kubectl apply --server-side -f deploy/mpi-operator.yaml"
        in (ROOT / "README.md").read_text()
    )


def test_both_recipes_give_the_runtime_uid_a_passwd_entry() -> None:
    """Kopf names the operator after its user (getpass): without an entry it exits at start."""
    runs = [rest for op, rest in instructions() if op == "RUN"]
    assert any("useradd" in r and "--uid 65532" in r for r in runs)
    assert any("useradd" in h and "--uid 65532" in h for h in operator_image.hooks(ROOT, ROOT))


def test_both_recipes_trim_the_same_and_leave_plotting_out() -> None:
    """What no runtime reads goes in both recipes, and the CLI's plotting is an extra."""
    runs = [" ".join(rest.split()) for op, rest in instructions() if op == "RUN"]
    assert operator_image.TRIM in runs
    assert any(shlex.quote(operator_image.TRIM) in h for h in operator_image.hooks(ROOT, ROOT))
    pinned = {line.split("==")[0] for line in operator_image.pins()}
    assert not {"matplotlib", "pillow", "fonttools"} & pinned


def test_both_recipes_ship_bytecode_compiled_the_same_way() -> None:
    """The image is read-only and runs with PYTHONDONTWRITEBYTECODE: without bytecode compiled
    at build time, every start would compile the whole import tree from source."""
    runs = [" ".join(rest.split()) for op, rest in instructions() if op == "RUN"]
    assert operator_image.COMPILE in runs
    hooks = operator_image.hooks(ROOT, ROOT)
    assert hooks[-1].endswith(shlex.quote(operator_image.COMPILE))  # after every removal
    assert "unchecked-hash" in operator_image.COMPILE
