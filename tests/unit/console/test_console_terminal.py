"""What the ``mpijob`` command prints of text a tenant (or anyone else) wrote into the API:
escaped, so no control character reaches the terminal raw and no field forges a line.

Every command that prints API text runs against a fake API whose every printed field carries
:func:`hostile` text (escape sequences, CR/LF, bidi overrides, rich markup), piped and on a
terminal."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from mpijob import keys
from mpijob.console import kube, main, plot, terminal
from mpijob.console import topology as view
from mpijob.console.kube import ConsoleError
from mpijob.placement import codec, topologies
from mpijob.shares.request import Placed, Share
from support.console_objects import condition, decision_body, job_body, pod_body

pytestmark = pytest.mark.unit

#: Characters a terminal obeys, written out here rather than taken from the code under test:
#: C0 but LF (the CLI's own line break), DEL, C1, the bidi marks, embeddings, overrides and
#: isolates, zero-width characters, the line and paragraph separators, the BOM, the tags.
RAW = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
    "\U000e0000-\U000e007f]"
)
#: The only sequences allowed on a terminal: the colours and styles the CLI adds (SGR).
OWN_STYLES = re.compile(r"\x1b\[[0-9;]*m")


def hostile(tag: str) -> str:
    """What a hostile writer puts in a field named ``tag``: a colour, a cursor moved up and its
    line erased, a window title, an OSC 8 hyperlink, CR/LF and a tab that start a forged row,
    BEL, a C1 CSI, a bidi override and isolate, a zero-width space, a line separator, a tag
    character and rich markup for a hyperlink."""
    return (
        f"{tag}\x1b[31m\x1b[1A\x1b[2K\x1b]0;owned\x07\x1b]8;;https://evil.example\x1b\\"
        f"\r\nFORGED {tag}\trow\x07\x9b2J\u202egnp.exe\u2066\u200b\u2028\U000e0041"
        f"[link=https://evil.example]{tag}[/link]"
    )


def escaped(tag: str) -> str:
    """:func:`hostile` as it must be printed: every character visible, on one line."""
    return (
        f"{tag}\\x1b[31m\\x1b[1A\\x1b[2K\\x1b]0;owned\\x07\\x1b]8;;https://evil.example\\x1b\\"
        f"\\r\\nFORGED {tag}\\trow\\x07\\x9b2J\\u202egnp.exe\\u2066\\u200b\\u2028\\U000e0041"
        f"[link=https://evil.example]{tag}[/link]"
    )


def assert_inert(out: str, *tags: str) -> None:
    """Nothing in ``out`` a terminal would obey; no forged line; each tagged field printed
    whole, escaped and on one line, its markup as text."""
    assert not RAW.search(out), repr(out)
    assert not re.search(r"^\s*FORGED", out, re.MULTILINE), out
    for tag in tags:
        assert escaped(tag) in out, f"{tag} not printed escaped:\n{out}"


class HostileApi:
    """Stands in for :class:`mpijob.console.kube.Api`: one job, its pods, claims, decision, a
    node and a log, every field the CLI prints written by :func:`hostile`."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        failed = {**condition("Failed"), "reason": hostile("reason"), "message": hostile("why")}
        left = {**condition("WorkersLeftRunning"), "message": hostile("left")}
        job = job_body("vgg16", workers=2, priority_class=hostile("priority"))
        job["status"]["conditions"] = [failed, left]
        job["metadata"]["name"] = hostile("job")
        job["metadata"]["namespace"] = hostile("namespace")
        self.job = job
        self.decision = decision_body(job, hostile("placement"))
        launcher = pod_body(hostile("launcher"), role=keys.ROLE_LAUNCHER, gpus=0)
        launcher["spec"]["nodeName"] = hostile("node")
        failed_pod = pod_body("vgg16-worker-0", phase="Failed", gpu_ids=hostile("ids"))
        failed_pod["status"]["reason"] = hostile("podreason")
        waiting = pod_body("vgg16-worker-1", gpu_ids="0", phase="Pending")
        waiting["status"]["containerStatuses"] = [
            {"name": "w", "state": {"waiting": {"reason": hostile("waiting")}}}
        ]
        waiting["metadata"]["annotations"][keys.GPU_CLAIM] = "vgg16-worker-1-gpus"
        waiting["metadata"]["annotations"][keys.GPU_ACTUAL] = hostile("actual")
        self.pods = [launcher, failed_pod, waiting]
        for pod in self.pods:
            pod["metadata"]["namespace"] = job["metadata"]["namespace"]
            pod["metadata"]["labels"][keys.LABEL_JOB_NAME] = job["metadata"]["name"]
        result = {"driver": keys.NVIDIA_GPU_DRIVER, "pool": "p", "device": hostile("device")}
        self.claim = {
            "metadata": {"name": "vgg16-worker-1-gpus"},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    def get_job(self, name: str) -> dict[str, Any]:
        return self.job

    def list_jobs(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        return [self.job]

    def job_pods(
        self, job: str | None = None, *, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        return self.pods

    def get_decision(self, name: str) -> dict[str, Any]:
        return self.decision

    def job_claims(self, job: str) -> list[dict[str, Any]]:
        return [self.claim]

    def node(self, name: str) -> dict[str, Any]:
        return NODES.get(name, {"metadata": {}})

    def node_pods(self, node: str) -> tuple[list[dict[str, Any]], bool]:
        return NODE_PODS, False

    def logs(self, pod: str, *, follow: bool) -> Iterator[str]:
        yield from LOG

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "metadata": {**body["metadata"], "name": hostile("created")}}

    def delete_job(self, name: str) -> None:
        pass


NODES: dict[str, dict[str, Any]] = {}
NODE_PODS: list[dict[str, Any]] = []
LOG: list[str] = []


@pytest.fixture(autouse=True)
def hostile_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    NODES.clear()
    NODE_PODS.clear()
    LOG.clear()
    monkeypatch.setattr(main, "Api", lambda _kubeconfig, namespace: HostileApi(namespace or "ns"))
    # Wide enough that no cell is cut: each field must be seen whole, escaped.
    monkeypatch.setattr(main, "PIPED_WIDTH", 20_000)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def on_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Print as on a colour terminal (CliRunner's output is no terminal)."""

    def console(*, stderr: bool = False) -> Console:
        return Console(stderr=stderr, force_terminal=True, color_system="256", width=20_000)

    monkeypatch.setattr(main, "make_console", console)


# --- the escaping -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b", "\\x1b"),
        ("\n", "\\n"),
        ("\r", "\\r"),
        ("\t", "\\t"),
        ("\x00", "\\x00"),
        ("\x07", "\\x07"),
        ("\x08", "\\x08"),
        ("\x7f", "\\x7f"),
        ("\x85", "\\x85"),  # C1 NEL: a line break to some terminals
        ("\x9b", "\\x9b"),  # C1 CSI: ESC [ to some terminals
        ("\u202e", "\\u202e"),  # right-to-left override
        ("\u2066", "\\u2066"),  # left-to-right isolate
        ("\u200b", "\\u200b"),  # zero-width space
        ("\ufeff", "\\ufeff"),
        ("\u2028", "\\u2028"),  # line separator
        ("\u2029", "\\u2029"),  # paragraph separator
        ("\U000e0041", "\\U000e0041"),  # a tag character: invisible text
        ("\ud800", "\\ud800"),  # a lone surrogate, which UTF-8 cannot even write
    ],
)
def test_every_character_a_terminal_may_obey_is_escaped(raw: str, shown: str) -> None:
    assert terminal.escape(f"a{raw}b") == f"a{shown}b"


def test_printable_text_of_any_script_is_left_as_it_is() -> None:
    text = "vgg16 élan 日本語 مرحبا 🙂 \\x1b [bold] ~"
    assert terminal.escape(text) == text


def test_what_is_kept_is_kept_and_nothing_else() -> None:
    assert terminal.escape("a\n\tb\x1b\r", keep="\n\t") == "a\n\tb\\x1b\\r"


def test_text_is_never_read_as_markup() -> None:
    assert terminal.text("[link=https://evil.example]x[/link]").plain == (
        "[link=https://evil.example]x[/link]"
    )


def test_a_table_escapes_its_str_cells_and_keeps_its_own_styles() -> None:
    table = terminal.Table()
    table.add_column("A")
    table.add_column("B")
    table.add_row(hostile("cell"), terminal.text("ok", style="green"))
    console = Console(force_terminal=True, color_system="256", width=1000, record=True)
    with console.capture() as captured:
        console.print(table)
    out = captured.get()
    assert OWN_STYLES.search(out)  # the green, the bold header
    assert_inert(OWN_STYLES.sub("", out), "cell")


def test_a_log_keeps_its_lines_and_tabs_and_escapes_the_rest() -> None:
    chunks = ["step 1\tok\r", "\nstep 2 \x1b[2K\rFORGED", " \u202e\n", "end\r"]
    assert "".join(terminal.escape_log(chunks)) == (
        # The CRLF split between two chunks is one line end; a bare CR is shown.
        "step 1\tok\nstep 2 \\x1b[2K\\rFORGED \\u202e\nend\\r"
    )


def test_a_log_character_split_between_two_chunks_is_decoded_whole() -> None:
    """The API streams bytes; a chunk may end in the middle of a character."""
    data = "GPU 0: ✓ done\n".encode()
    cut = data.index("✓".encode()) + 1
    api = kube.Api.__new__(kube.Api)
    api.namespace = "ns"

    class Response:
        def stream(self, _size: int) -> Iterator[bytes]:
            yield from (data[:cut], data[cut:])

        def release_conn(self) -> None:
            pass

    class Core:
        def read_namespaced_pod_log(self, *_args: Any, **_kwargs: Any) -> Response:
            return Response()

    api._core = Core()
    assert "".join(api.logs("p", follow=False)) == "GPU 0: ✓ done\n"


# --- every command that prints API text -----------------------------------------------------

GET_FIELDS = (
    "job",
    "namespace",
    "priority",
    "placement",
    "reason",
    "why",
    "left",
    "launcher",
    "node",
    "podreason",
    "ids",
    "waiting",
    "device",
    "actual",
)


def test_get_prints_every_field_escaped() -> None:
    code, out, err = run("get", "vgg16")
    assert code == 0, err
    assert_inert(out, *GET_FIELDS)
    lines = out.splitlines()
    # The fields, the three Why lines, a blank line, Instances:, the header, three pods and
    # the note of a placement not honoured: nothing more.
    assert len(lines) == 8 + 2 + 1 + 1 + 1 + 3 + 1, out
    assert [line.split()[0] for line in lines[-5:-1]] == [
        "NAME",
        escaped("launcher").split()[0],
        "vgg16-worker-0",
        "vgg16-worker-1",
    ]


def test_get_on_a_terminal_sends_no_sequence_but_its_own_colours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_terminal(monkeypatch)
    code, out, err = run("get", "vgg16")
    assert code == 0, err
    assert OWN_STYLES.search(out)  # it is a terminal: the status is coloured
    assert_inert(OWN_STYLES.sub("", out), *GET_FIELDS)
    # Rich markup in a field is no hyperlink (OSC 8) either.
    assert "\x1b]" not in out


def test_a_why_line_too_long_for_the_terminal_wraps_under_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message that wraps cannot choose what starts a line at the left margin: padded to
    the width, its row-like words would start a line of their own."""
    monkeypatch.setattr(main, "PIPED_WIDTH", 80)
    forged = "x" * 60 + " forged-worker-9 Running 1m false 1 0 gpu-node-0"
    failed = {**condition("Failed"), "reason": "BackoffLimitExceeded", "message": forged}
    api = HostileApi("ns")
    api.job = job_body(conditions=[failed])
    monkeypatch.setattr(main, "Api", lambda _kubeconfig, _namespace: api)
    code, out, _ = run("get", "vgg16")
    assert code == 0
    wrapped = [line for line in out.splitlines() if "forged-worker-9" in line]
    assert len(wrapped) == 1, out
    assert wrapped[0].startswith("     forged-worker-9 Running"), out


@pytest.mark.parametrize("flags", [(), ("-A",)])
def test_list_prints_every_field_escaped(flags: tuple[str, ...]) -> None:
    code, out, err = run("list", *flags)
    assert code == 0, err
    assert_inert(out, "job", "node", *(("namespace",) if flags else ()))
    assert len(out.splitlines()) == 2  # the header and the one job


def test_logs_keep_the_containers_lines_and_escape_the_rest() -> None:
    """A log's lines and tabs are the container's own; what would move the cursor back over
    them, recolour them or reorder them is shown."""
    LOG.extend(["epoch 1\tloss 0.3\r\n", "\x1b[1A\x1b[2K\u202e", "\rrewritten\n", "done\n"])
    code, out, err = run("logs", "vgg16")
    assert code == 0, err
    assert not RAW.search(out.replace("\t", "")), repr(out)
    assert out.splitlines() == [
        "epoch 1\tloss 0.3",
        "\\x1b[1A\\x1b[2K\\u202e\\rrewritten",
        "done",
    ]


def test_submit_prints_the_created_name_escaped() -> None:
    code, out, err = run("submit", "--name=vgg16", "--image=i", "--", "hostname")
    assert code == 0, err
    assert_inert(out, "created")
    assert out == f"mpijob.kubeflow.org/{escaped('created')} created\n"


def test_delete_prints_its_argument_escaped() -> None:
    code, out, _ = run("delete", hostile("arg"))
    assert code == 0
    assert out == f"mpijob.kubeflow.org/{escaped('arg')} deleted\n"


def test_an_error_quoting_the_api_is_one_escaped_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An API error's message may quote what was written (a validation error quotes it)."""

    def refused(self: HostileApi, name: str) -> dict[str, Any]:
        raise ConsoleError(f"cannot read: {hostile('apierror')}")

    monkeypatch.setattr(HostileApi, "get_job", refused)
    code, out, err = run("get", "vgg16")
    assert (code, out) == (1, "")
    assert_inert(err, "apierror")
    assert err == f"error: cannot read: {escaped('apierror')}\n"


def gpu_pod(name: str, namespace: str, job: str, ids: str) -> dict[str, Any]:
    pod = pod_body(name, namespace=namespace, gpu_ids=ids)
    pod["metadata"]["labels"][keys.LABEL_JOB_NAME] = job
    return pod


def test_topology_prints_the_nodes_and_pods_text_escaped() -> None:
    """The topology's name (the node's annotation), the jobs and pods holding its GPUs, and
    each GPU's shares."""
    topology = topologies.load("dgx1-v100")
    annotation = codec.dumps(topology).replace('"dgx1-v100"', f'"{_json(hostile("model"))}"')
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM}
    allocatable = {keys.GPU_COUNT_RESOURCE: "8", keys.GPU_MEM_RESOURCE: "256"}
    NODES["n"] = {
        "metadata": {"name": "n", "labels": labels, "annotations": {keys.GPU_TOPOLOGY: annotation}},
        "status": {"allocatable": allocatable},
    }
    NODE_PODS.append(gpu_pod("w", hostile("podns"), hostile("holder"), "0,1"))
    share = Placed("n", 2, "GPU-2", Share(4, 25), claim="c").dumps()
    sharing = pod_body(hostile("sharer"), namespace="ns")
    sharing["metadata"]["annotations"] = {keys.GPU_SHARE: share}
    NODE_PODS.append(sharing)
    code, out, err = run("topology", "n")
    assert code == 0, err
    assert_inert(out, "model", "podns", "holder", "sharer")
    assert out.splitlines()[0].startswith(f"Node n: {escaped('model')}, 8 GPUs")


def test_topology_of_a_node_with_an_unreadable_annotation_says_so_escaped() -> None:
    NODES["n"] = {"metadata": {"annotations": {keys.GPU_TOPOLOGY: hostile("annotation")}}}
    code, out, err = run("topology", "n")
    assert (code, out) == (1, "")
    assert not RAW.search(err), repr(err)
    assert len(err.splitlines()) == 1


def test_topology_of_an_unpublished_node_names_it_escaped() -> None:
    code, _, err = run("topology", hostile("nodearg"))
    assert code == 1
    assert_inert(err, "nodearg")


def test_the_picture_escapes_its_title_and_legend(tmp_path: Path) -> None:
    topology = topologies.load("dgx1-v100")
    usage = view.gpu_usage([gpu_pod("w", "ns", hostile("legend"), "0")])
    fig = plot.draw(topology, usage, hostile("title"))
    texts = [fig.axes[0].get_title()]
    legend = fig.axes[0].get_legend()
    assert legend is not None
    texts += [t.get_text() for t in legend.get_texts()]
    assert texts == [escaped("title"), f"ns/{escaped('legend')}", "free"]


def _json(value: str) -> str:
    """``value`` as the inside of a JSON string."""
    return json.dumps(value)[1:-1]


def test_the_hostile_fields_reach_the_output_unescaped_without_the_escaping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test's own check: with the escaping undone, ``get`` fails it (raw ESC, a forged
    line), so the tests above can fail."""
    monkeypatch.setattr(terminal, "escape", lambda value, **_: value)
    code, out, _ = run("get", "vgg16")
    assert code == 0
    with pytest.raises(AssertionError):
        assert_inert(out, *GET_FIELDS)
    assert "\x1b[31m" in out
    assert re.search(r"^\s*FORGED why", out, re.MULTILINE)
