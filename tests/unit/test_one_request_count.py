"""One count of a pod's GPUs: the scheduler's effective request, in one module.

How many GPUs (and which extended resources) a pod or a pod template takes is read only by
:mod:`mpijob.pods.predicates` (``effective_requests``, ``effective_gpus``, ``template_gpus``,
``container_gpus``), as the scheduler reads it: the largest init container against the app
containers, sidecars and overhead. A second reading (the app containers only, say) would let
placement reserve fewer GPUs than the scheduler hands the pod. ``make lint`` runs this file: any
function elsewhere that reads ``nvidia.com/gpu`` out of a container's ``limits`` or ``requests``
fails it, unless listed below with why it is no count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "mpijob"

#: The one module that counts.
COUNTER = "pods/predicates.py"

#: Functions that touch a container's ``nvidia.com/gpu`` entries without counting them.
NOT_A_COUNT = {
    # Moves a placed worker's GPUs from its containers' requests to a claim (a rewrite).
    ("desired/claims.py", "use_claim"),
    # The GPU pod index keeps each container's GPU entries as they are, for predicates to count.
    ("handlers/watches.py", "_gpu_requests"),
    # A filter: whether a pod names the resource at all (then predicates counts it).
    ("handlers/watches.py", "requests_gpus"),
    # Writes the limits of the job `mpijob submit` builds.
    ("console/submit.py", "build_mpijob"),
    # Validates a GPU share: a share's pod may not also ask for whole GPUs (no count).
    ("shares/request.py", "read_request"),
}

GPU_NAMES = {"GPU_RESOURCE"}
GPU_TEXT = "nvidia.com/gpu"
SECTIONS = {"limits", "requests"}


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _reads_gpu_requests(function: ast.AST) -> bool:
    gpu = sections = False
    for node in ast.walk(function):
        if (isinstance(node, ast.Attribute) and node.attr in GPU_NAMES) or (
            isinstance(node, ast.Name) and node.id in GPU_NAMES
        ):
            gpu = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            gpu = gpu or node.value == GPU_TEXT
            sections = sections or node.value in SECTIONS
    return gpu and sections


def offenders() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == COUNTER or "_pb2" in module:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in _functions(tree):
            if (module, function.name) in NOT_A_COUNT:
                continue
            if _reads_gpu_requests(function):
                found.append(f"{module}:{function.lineno} {function.name}")
    return found


def test_only_the_predicates_module_counts_a_pods_gpus() -> None:
    found = offenders()
    assert not found, (
        "these read nvidia.com/gpu from a container's limits or requests; count a pod's GPUs "
        "with mpijob.pods.predicates (effective_gpus, template_gpus, container_gpus): "
        + ", ".join(found)
    )


def test_the_check_finds_a_second_count() -> None:
    """The check itself can fail: an app-containers-only count, as there used to be."""
    second = ast.parse(
        "def gpu_count(template):\n"
        "    return sum(int(c['resources']['limits'][keys.GPU_RESOURCE])\n"
        "               for c in template['spec']['containers'])\n"
    )
    assert [f.name for f in _functions(second) if _reads_gpu_requests(f)] == ["gpu_count"]


def test_the_listed_exceptions_still_exist() -> None:
    """An exception whose function is gone or renamed is dropped from the list, not kept."""
    for module, name in NOT_A_COUNT:
        tree = ast.parse((PACKAGE / module).read_text())
        assert any(f.name == name for f in _functions(tree)), (module, name)
