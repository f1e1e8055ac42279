"""Tables and text for the console: pure functions from views to rich renderables.

Rich prints colour and styles on a terminal and plain text when the output is piped, so the
same renderables serve both; the tables have no borders, so piped output reads like kubectl's
and splits on whitespace. Every value from the API goes in as :func:`~mpijob.console.terminal.text`
(the tables' ``str`` cells by :class:`~mpijob.console.terminal.Table`): its control characters
escaped, so a field stays on its line. Called by :mod:`mpijob.console.main`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from rich.console import Group, RenderableType
from rich.text import Text

from mpijob.console.jobs import FINAL_STATUSES, NONE, Instance, JobView
from mpijob.console.terminal import Table, text

STATUS_STYLES: Final = {
    "SUCCEEDED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "SUSPENDED": "magenta",
    "RESTARTING": "yellow",
    "FAILED": "bold red",
    "Running": "cyan",
    "Completed": "green",
    "Pending": "yellow",
    "Failed": "red",
}


def status_text(status: str) -> Text:
    """A job's status word, or a pod's (the kubelet's reason, which is not ours to trust)."""
    return text(status, style=STATUS_STYLES.get(status, ""))


def plain_table(*headers: str) -> Table:
    """A borderless table with bold headers, columns never wrapped."""
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True)
    return table


INSTANCE_HEADERS: Final = (
    "NAME",
    "STATUS",
    "AGE",
    "IS_CHIEF",
    "GPU(Requested)",
    "GPU(IDs)",
    "NODE",
)


#: After GPU(IDs), only when some worker has them: what its DRA claim got, what it holds.
ALLOCATED_HEADER: Final = "GPU(Allocated)"
ACTUAL_HEADER: Final = "GPU(Actual)"
#: Appended to an allocated or actual GPU set that is not the chosen one (piped output keeps it).
NOT_HONOURED_MARK: Final = "!"
NOT_HONOURED_NOTE: Final = (
    "! not the GPUs placement chose (GPU(IDs)): the placement was not honoured; "
    "the job's PlacementNotHonoured events name the pods"
)


def instance_table(view: JobView) -> Table:
    """Arena's columns; GPU(Allocated) and GPU(Actual) join them when some worker has them."""
    headers = list(INSTANCE_HEADERS)
    extra = [
        header
        for header, known in (
            (ALLOCATED_HEADER, view.allocated_known),
            (ACTUAL_HEADER, view.actual_known),
        )
        if known
    ]
    headers[-1:-1] = extra
    table = plain_table(*headers)
    for row in view.instances:
        cells = {ALLOCATED_HEADER: row.gpu_allocated, ACTUAL_HEADER: row.gpu_actual}
        table.add_row(
            row.name,
            status_text(row.status),
            row.age,
            "true" if row.is_chief else "false",
            str(row.gpus),
            row.gpu_ids,
            *(_gpu_set(cells[header], row) for header in extra),
            row.node,
        )
    return table


def _gpu_set(value: str, row: Instance) -> Text:
    """An allocated or actual GPU set: N/A when unknown, marked red when not the chosen one."""
    if not value:
        return Text(NONE)
    if set(value.split(",")) != set(row.gpu_ids.split(",")):
        return text(value + NOT_HONOURED_MARK, style="bold red")
    return text(value)


def job_details(view: JobView) -> RenderableType:
    """``mpijob get``: the job's fields, then its instances (arena get's layout)."""
    fields = Table.grid(padding=(0, 1))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(no_wrap=True)
    fields.add_row("Name:", view.name)
    fields.add_row("Status:", status_text(view.status))
    fields.add_row("Namespace:", view.namespace)
    fields.add_row("Priority:", view.priority)
    fields.add_row("Trainer:", view.trainer)
    fields.add_row("Duration:", view.duration)
    fields.add_row("GPUs:", str(view.gpus))
    if view.placement:
        fields.add_row("Placement:", view.placement)
    parts: list[RenderableType] = [fields]
    if view.why:
        parts.append(why_lines(view.why))
    parts.append(Text(""))
    if view.instances:
        parts += [Text("Instances:", style="bold"), instance_table(view)]
        if view.not_honoured:
            parts.append(Text(NOT_HONOURED_NOTE, style="red"))
    elif view.status in FINAL_STATUSES:
        # cleanPodPolicy and the launcher Job's TTL delete a finished job's pods; "yet" would
        # promise pods that are not coming.
        parts.append(Text("Instances: none left", style="bold"))
    else:
        parts.append(Text("Instances: none yet", style="bold"))
    return Group(*parts)


def why_lines(why: Sequence[str]) -> Table:
    """The ``Why:`` lines. Wrapped rather than cut (the message names the pod, container and
    reason), and in a column of their own: a wrapped line goes on under its message, indented,
    so no message can wrap into a line of its own choosing at the left margin."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="red", no_wrap=True)
    grid.add_column(style="red")
    for line in why:
        grid.add_row("Why:", line)
    return grid


LIST_HEADERS: Final = ("NAME", "STATUS", "TRAINER", "DURATION", "GPU(Requested)", "NODE")


def jobs_table(views: Sequence[JobView], *, namespaces: bool = False) -> Table:
    """``mpijob list``: one row per job; NODE is the launcher's.

    With ``namespaces`` (``list -A``) a NAMESPACE column comes first, as in ``kubectl get -A``.
    """
    headers = ("NAMESPACE", *LIST_HEADERS) if namespaces else LIST_HEADERS
    table = plain_table(*headers)
    for view in views:
        table.add_row(
            *((view.namespace,) if namespaces else ()),
            view.name,
            status_text(view.status),
            view.trainer,
            view.duration,
            str(view.gpus),
            view.launcher_node if view.instances else NONE,
        )
    return table
