"""Which worker of which job a pod is: one strict reading (:func:`names.worker_index`).

A tenant may create pods in their namespace with any name that is free, any labels and an owner
reference to their own MPIJob; only a pod that agrees with the worker the operator creates in
every part is taken for it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from mpijob import keys
from mpijob.desired import names
from mpijob.desired.worker import build_worker
from support import jobs

pytestmark = pytest.mark.unit

NS, JOB, UID = "team", "train", "uid-train"


def built(index: int, *, replicas: int = 3) -> dict[str, Any]:
    """Worker ``index`` as the operator creates it."""
    job = jobs.parsed(jobs.body(JOB, NS, uid=UID, workers=replicas))
    return build_worker(job, index)


def index_of(pod: dict[str, Any], replicas: int | None = 3) -> int | None:
    return names.worker_index(pod, NS, JOB, UID, replicas)


def test_every_worker_the_operator_creates_is_read_back_as_its_index() -> None:
    assert [index_of(built(i)) for i in range(3)] == [0, 1, 2]
    job = jobs.parsed(jobs.body(JOB, NS, uid=UID, workers=3))
    assert [built(i)["metadata"]["name"] for i in range(3)] == names.worker_names(job)


def test_a_summary_as_the_informer_keeps_it_is_read_the_same() -> None:
    """Only metadata (name, namespace, labels, owner references) is read."""
    pod = built(2)
    summary = {"metadata": {k: pod["metadata"][k] for k in ("name", "namespace", "labels")}}
    summary["metadata"]["ownerReferences"] = pod["metadata"]["ownerReferences"]
    assert index_of(summary) == 2


def renamed(name: str) -> dict[str, Any]:
    pod = built(0)
    pod["metadata"]["name"] = name
    return pod


@pytest.mark.parametrize(
    "name",
    [
        "train-worker-00",  # a leading zero: parses as 0, is not the name of worker 0
        "train-worker-01",
        "train-worker-007",
        "train-worker-+1",
        "train-worker--1",
        "train-worker- 1",
        "train-worker-1 ",
        "train-worker-1_0",
        "train-worker-0x1",
        "train-worker-1e0",
        "train-worker-",
        "train-worker",
        "train-worker-0-worker-0",  # worker 0 of a job named train-worker-0
        "Train-worker-0",
        "train-launcher",
        "train",
    ],
)
def test_a_name_the_operator_does_not_give_is_no_worker(name: str) -> None:
    assert index_of(renamed(name)) is None


@pytest.mark.parametrize(
    "digits",
    [
        "\u0660",  # ARABIC-INDIC DIGIT ZERO: str.isdigit() and int() take it for 0
        "0\u0660",
        "\uff11",  # FULLWIDTH DIGIT ONE
        "\u09e7",  # BENGALI DIGIT ONE
        "\u00b2",  # SUPERSCRIPT TWO: isdigit() says yes, int() refuses it
        "\u2460",  # CIRCLED DIGIT ONE
    ],
)
def test_digits_other_than_ascii_make_no_index(digits: str) -> None:
    assert index_of(renamed(f"train-worker-{digits}")) is None


def test_an_index_beyond_the_replicas_is_no_worker_where_they_are_known() -> None:
    pod = built(3, replicas=4)
    assert index_of(pod, replicas=3) is None
    assert index_of(pod, replicas=4) == 3
    assert index_of(pod, replicas=None) == 3  # the caller does not know them: any index
    assert index_of(built(0), replicas=0) is None


def test_a_pod_of_another_namespace_is_no_worker() -> None:
    pod = built(0)
    pod["metadata"]["namespace"] = "elsewhere"
    assert index_of(pod) is None
    del pod["metadata"]["namespace"]
    assert index_of(pod) is None


def test_a_pod_controlled_by_another_uid_or_by_none_is_no_worker() -> None:
    assert names.worker_index(built(0), NS, JOB, "uid-successor") is None
    assert names.worker_index(built(0), NS, JOB, None) is None
    assert names.worker_index(built(0), NS, JOB, "") is None
    for change in (
        {"uid": "uid-other"},
        {"uid": ""},
        {"controller": False},  # an owner, but not the controller
        {"kind": "Job"},
        {"apiVersion": "kubeflow.org/v1"},
        {"name": "other"},  # the job's uid under another job's name
    ):
        pod = built(0)
        pod["metadata"]["ownerReferences"][0].update(change)
        assert index_of(pod) is None, change
    pod = built(0)
    del pod["metadata"]["ownerReferences"]
    assert index_of(pod) is None


@pytest.mark.parametrize(
    ("label", "value"),
    [
        (keys.LABEL_OPERATOR_NAME, None),
        (keys.LABEL_OPERATOR_NAME, "someone-else"),
        (keys.LABEL_JOB_NAME, None),
        (keys.LABEL_JOB_NAME, "other"),
        (keys.LABEL_JOB_ROLE, None),
        (keys.LABEL_JOB_ROLE, keys.ROLE_LAUNCHER),
    ],
)
def test_a_pod_without_the_operator_s_labels_is_no_worker(label: str, value: str | None) -> None:
    pod = built(0)
    labels = pod["metadata"]["labels"]
    if value is None:
        del labels[label]
    else:
        labels[label] = value
    assert index_of(pod) is None


def test_labels_the_operator_does_not_set_change_nothing() -> None:
    pod = built(1)
    pod["metadata"]["labels"]["team"] = "x"
    pod["metadata"]["annotations"] = {keys.GPU_IDS: "0,1,2,3,4,5,6,7"}
    assert index_of(pod) == 1


@pytest.mark.parametrize("body", [{}, {"metadata": None}, {"metadata": {"labels": None}}])
def test_a_pod_with_no_metadata_is_no_worker(body: dict[str, Any]) -> None:
    assert index_of(body) is None


# --- one reading --------------------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "mpijob"

#: Where a worker's name may be spelled: the reading itself, the constant, and the validation of
#: the longest hostname a job's workers will get (api/ sits below desired/ and reads no pod).
SPELLERS = {"desired/names.py", "keys.py", "api/validation.py"}


def spells_a_worker_name(tree: ast.AST) -> bool:
    """Whether code in ``tree`` (not its docstrings) spells ``-worker-`` or names the suffix."""
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "WORKER_SUFFIX":
            return True
        if isinstance(node, ast.Name) and node.id == "WORKER_SUFFIX":
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in prose
            and ("-worker-" in node.value or node.value == "-worker")
        ):
            return True
    return False


def test_only_the_names_module_reads_a_worker_from_its_name() -> None:
    """A second reading of ``<job>-worker-<i>`` (a prefix and ``isdigit()``, as placement's
    accounting and GPU shares had) takes a tenant's ``<job>-worker-00`` for worker 0; every
    reader asks :func:`names.worker_index` instead."""
    found, read = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module in SPELLERS or "_pb2" in module:
            continue
        read.append(module)
        if spells_a_worker_name(ast.parse(path.read_text(), filename=str(path))):
            found.append(module)
    assert {"gang/topology.py", "shares/service.py"} <= set(read)  # the package was read
    assert not found, f"these spell a worker's name; use mpijob.desired.names: {found}"


def test_the_check_finds_a_second_reading() -> None:
    second = ast.parse(
        "def index(pod, job):\n"
        "    name = pod['metadata']['name']\n"
        "    prefix = f'{job}{keys.WORKER_SUFFIX}-'\n"
        "    return int(name[len(prefix):]) if name[len(prefix):].isdigit() else None\n"
    )
    assert spells_a_worker_name(second)
    assert spells_a_worker_name(ast.parse("prefix = job + '-worker-'"))
    assert not spells_a_worker_name(ast.parse("name = names.worker_name(job, 0)"))
    assert not spells_a_worker_name(ast.parse('def f():\n    """``<job>-worker-<i>``."""'))
