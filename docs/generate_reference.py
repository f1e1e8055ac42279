#!/usr/bin/env python3
"""Writes docs/reference.md from the operator's own key and metric definitions.

Sources, read as code and not copied by hand, so the reference cannot drift from them:

- ``operator/mpijob/keys.py``: every label, annotation, condition type, reason, Event and name the
  operator reads or writes. A ``#:`` comment describes the constants right below it, up to the
  next blank line or comment; a string under a constant describes that one alone. A constant
  with neither stops the generator, naming it.
- ``operator/mpijob/metrics.py``: every metric, with its type, labels and help text as
  Prometheus serves them.

Values come from importing the two modules (they are pure: no I/O at import); comments, sections
and order come from their source. ``--check`` exits 1 when the committed file differs from what
this script writes (``make lint`` runs it); ``make reference`` rewrites it.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Final

from mpijob import keys, metrics

ROOT: Final = Path(__file__).resolve().parents[1]
OUTPUT: Final = ROOT / "docs" / "reference.md"
KEYS_SOURCE: Final = ROOT / "operator" / "mpijob" / "keys.py"
METRICS_SOURCE: Final = ROOT / "operator" / "mpijob" / "metrics.py"

SECTION: Final = re.compile(r"^# -+ (?P<title>.+?) -+$")
METRIC_CLASSES: Final = frozenset({"Counter", "Gauge", "Histogram", "Summary"})


@dataclass
class Constant:
    name: str
    value: object
    doc: str = ""


@dataclass
class Group:
    """Constants under one ``#:`` comment (or one constant with no comment above it)."""

    comment: str
    members: list[Constant] = field(default_factory=list)


@dataclass
class Section:
    title: str
    groups: list[Group] = field(default_factory=list)


def markdown(text: str) -> str:
    """reST inline literals as Markdown code, on one line."""
    return " ".join(text.replace("``", "`").split())


def module_source(path: Path, module: ModuleType) -> str:
    # The imported module must be the file read here, or values and comments would disagree.
    if module.__file__ is None or Path(module.__file__).resolve() != path:
        raise SystemExit(f"{module.__name__} is imported from {module.__file__}, not {path}")
    return path.read_text()


def section_at(lines: list[str], lineno: int) -> str:
    """The title of the last ``# --- title ---`` line above ``lineno`` (1-based)."""
    for line in reversed(lines[: lineno - 1]):
        if match := SECTION.match(line.strip()):
            return match["title"]
    return ""


def comment_above(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` block ending right above ``lineno``; None when that line is no such comment."""
    block: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        block.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    return " ".join(block) if block else None


def assigned_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name):
            return target.id
    return None


def read_keys() -> list[Section]:
    source = module_source(KEYS_SOURCE, keys)
    lines = source.splitlines()
    body = ast.parse(source).body
    sections: list[Section] = []
    undocumented: list[str] = []
    previous_end = -1  # last line of the previous constant (or of its docstring)
    for i, node in enumerate(body):
        name = assigned_name(node)
        if name is None or name.startswith("_"):
            continue
        constant = Constant(name, getattr(keys, name))
        following = body[i + 1] if i + 1 < len(body) else None
        end = node.end_lineno or node.lineno
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
            and following.lineno == end + 1
        ):
            constant.doc = markdown(following.value.value)
            end = following.end_lineno or following.lineno
        title = section_at(lines, node.lineno)
        if not sections or sections[-1].title != title:
            sections.append(Section(title))
        groups = sections[-1].groups
        comment = comment_above(lines, node.lineno)
        if comment is None and groups and previous_end == node.lineno - 1:
            groups[-1].members.append(constant)  # the run under the last comment goes on
        else:
            groups.append(Group(markdown(comment or ""), [constant]))
        if not groups[-1].comment and not constant.doc:
            undocumented.append(name)
        previous_end = end
    if undocumented:
        raise SystemExit(
            "keys.py: no #: comment or docstring describes "
            + ", ".join(undocumented)
            + " (docs/generate_reference.py says how they are read)"
        )
    return sections


@dataclass
class Metric:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


def read_metrics() -> list[tuple[str, list[Metric]]]:
    source = module_source(METRICS_SOURCE, metrics)
    lines = source.splitlines()
    out: list[tuple[str, list[Metric]]] = []
    for node in ast.parse(source).body:
        name = assigned_name(node)
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if name is None or not isinstance(value, ast.Call):
            continue
        if not (isinstance(value.func, ast.Name) and value.func.id in METRIC_CLASSES):
            continue
        (described,) = getattr(metrics, name).describe()
        labels_node = next((k.value for k in value.keywords if k.arg == "labelnames"), None)
        if labels_node is None and len(value.args) > 2:
            labels_node = value.args[2]
        labels = tuple(ast.literal_eval(labels_node)) if labels_node is not None else ()
        # A counter is served with the _total suffix, which the client adds.
        exported = described.name + ("_total" if described.type == "counter" else "")
        title = section_at(lines, node.lineno)
        if not out or out[-1][0] != title:
            out.append((title, []))
        out[-1][1].append(Metric(exported, described.type, labels, described.documentation))
    return out


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code(value: object) -> str:
    return f"`{value}`"


def render_group(group: Group) -> list[str]:
    def item(c: Constant) -> str:
        return f"{code(c.value)} (`{c.name}`)"

    if len(group.members) == 1:
        (only,) = group.members
        text = " ".join(t for t in (group.comment, only.doc) if t)
        return [f"- {item(only)}: {text}"]
    if not any(c.doc for c in group.members):
        return [f"- {', '.join(item(c) for c in group.members)}: {group.comment}"]
    out = [f"- {group.comment}"]
    for c in group.members:
        out.append(f"  - {item(c)}" + (f": {c.doc}" if c.doc else ""))
    return out


HEADER: Final = """\
<!-- Generated by docs/generate_reference.py from operator/mpijob/keys.py and
operator/mpijob/metrics.py; edit those, then run `make reference`. -->

# Reference: keys, conditions, Events and metrics

Every label, annotation, condition type, reason, Event, resource name and metric the operator
reads or writes, with what it means, in the order and words of its definition in
[keys.py](../operator/mpijob/keys.py) and [metrics.py](../operator/mpijob/metrics.py).
Upstream's keys (`training.kubeflow.org/*`, `scheduling.k8s.io/group-name`,
`scheduling.x-k8s.io/pod-group`, `scheduling.volcano.sh/queue-name`) and metric names are kept
byte-for-byte; ours live under one prefix, `mpijob.io/`. Each entry is the value, then the
constant's name in `mpijob.keys`.
"""

METRICS_INTRO: Final = """\
## Metrics

Served on `/metrics` of `--monitoring-port` (default 8080), beside the process collector's
`process_*`; the node agent serves the same registry on its health port (8081). No metric has a
per-job label except upstream's `mpi_operator_job_info`. Histograms are served as `_bucket`,
`_sum` and `_count` series. What the dashboard and alerts make of them:
[monitoring.md](monitoring.md).
"""


def render() -> str:
    out = [HEADER.rstrip("\n")]
    for section in read_keys():
        out += ["", f"## {section.title[:1].upper()}{section.title[1:]}", ""]
        for group in section.groups:
            out += render_group(group)
    out += ["", METRICS_INTRO]
    for title, group in read_metrics():
        out += [f"### {title[:1].upper()}{title[1:]}", ""]
        out += ["| Metric | Type | Labels | Help |", "|---|---|---|---|"]
        for m in group:
            labels = ", ".join(code(label) for label in m.labels)
            out.append(f"| {code(m.name)} | {m.kind} | {labels} | {cell(m.help)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: run python docs/generate_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
