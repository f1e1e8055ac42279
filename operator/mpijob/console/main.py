"""``mpijob`` and ``kubectl mpijob``: submit MPIJobs and inspect them, arena style.

A thin click shell: each command reads through :mod:`mpijob.console.kube`, computes with the
pure modules and prints with rich (colour and tables on a terminal, plain text when piped).
Errors print one line on stderr and exit 1. What came from the API (and the user's own words
printed back) is printed as :func:`~mpijob.console.terminal.text`: escaped, never markup.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from mpijob import keys
from mpijob.console import jobs, render, submit, terminal
from mpijob.console.kube import Api, ConsoleError

F = TypeVar("F", bound=Callable[..., Any])

#: Piped output is never cut to a terminal's width: it is read by programs, not people.
PIPED_WIDTH = 500


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=PIPED_WIDTH)
    return console


def cluster_options(command: F) -> F:
    """``--namespace`` and ``--kubeconfig``, as kubectl spells them."""
    command = click.option(
        "--kubeconfig",
        envvar="KUBECONFIG",
        metavar="PATH",
        help="Kubeconfig to use. Default: $KUBECONFIG, ~/.kube/config, then in-cluster.",
    )(command)
    return click.option(
        "--namespace",
        "-n",
        metavar="NS",
        help="Namespace of the job. Default: the kubeconfig context's, else 'default'.",
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Submit and inspect MPIJobs (kubeflow.org/v2beta1).

    Also installed as the kubectl plugin `kubectl mpijob`.
    """


def _annotated(pods: list[dict[str, Any]], key: str) -> bool:
    return any(key in ((p.get("metadata") or {}).get("annotations") or {}) for p in pods)


def _uuid_index(api: Api, node: str) -> dict[str, int]:
    """GPU UUID -> index from the node's topology annotation; empty when it cannot be read."""
    from mpijob.placement import codec

    try:
        annotation = ((api.node(node).get("metadata") or {}).get("annotations") or {}).get(
            keys.GPU_TOPOLOGY
        )
        topology = codec.loads(annotation) if annotation else None
    except (ConsoleError, ValueError):
        return {}
    return {g.uuid: g.index for g in topology.gpus if g.uuid} if topology else {}


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except ConsoleError as exc:
        # The message may quote the API server's, which may quote what a tenant wrote.
        error = Text.assemble(("error:", "red"), " ", terminal.text(exc))
        make_console(stderr=True).print(error, highlight=False)
        sys.exit(1)


@main.command(name="submit", context_settings={"ignore_unknown_options": True})
@click.option("--name", required=True, help="Name of the MPIJob.")
@click.option("--image", required=True, help="Image of the launcher and the workers.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Workers.")
@click.option(
    "--gpus", default=0, show_default=True, type=click.IntRange(0), help="GPUs per worker."
)
@click.option(
    "--gang",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    help="Schedule launcher and workers all at once (schedulingPolicy.minAvailable).",
)
@click.option(
    "--gputopology",
    type=click.BOOL,
    is_flag=False,
    flag_value=True,
    default=False,
    help=f'Place the GPUs of the workers topology-aware ({keys.GPU_TOPOLOGY}: "true").',
)
@click.option(
    "--implementation",
    type=click.Choice([keys.IMPL_OPENMPI, keys.IMPL_INTEL, keys.IMPL_MPICH]),
    default=keys.IMPL_OPENMPI,
    show_default=True,
    help="MPI implementation of the image.",
)
@click.option("--cpu", metavar="QUANTITY", help="CPU limit of each worker, e.g. 4.")
@click.option("--memory", metavar="QUANTITY", help="Memory limit of each worker, e.g. 16Gi.")
@click.option(
    "--annotation",
    "annotations",
    multiple=True,
    metavar="KEY=VALUE",
    help="Annotation of the launcher and worker pods (repeatable).",
)
@click.option("--dry-run", is_flag=True, help="Print the MPIJob's YAML; create nothing.")
@click.option("--wait", is_flag=True, help="Wait until the job is Running or has finished.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds --wait waits at most.",
)
@cluster_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def submit_command(
    command: tuple[str, ...],
    namespace: str | None,
    kubeconfig: str | None,
    annotations: tuple[str, ...],
    dry_run: bool,
    wait: bool,
    timeout: float,
    **flags: Any,
) -> None:
    """Create an MPIJob running COMMAND under mpirun, one rank per GPU (or per worker).

    A COMMAND that is already mpirun (quoted as one argument or not) is run as it is. Arena's
    form `submit mpijob ...` (or `submit mpi ...`) is accepted: the job type comes first.

    \b
    mpijob submit --name vgg16 --workers 4 --gpus 1 --gang --gputopology \\
        --image horovod/horovod -- python pytorch_synthetic_benchmark.py --model vgg16
    """
    command = submit.without_job_type(command)

    def action() -> None:
        try:
            pairs = submit.parse_pairs(annotations)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--annotation") from None
        options = submit.SubmitOptions(
            command=command, namespace=namespace, annotations=pairs, **flags
        )
        manifest = submit.build_mpijob(options)
        out = make_console()
        if note := submit.gang_note(options):
            make_console(stderr=True).print(f"[yellow]note:[/] {note}", highlight=False)
        if dry_run:
            out.out(submit.to_yaml(manifest), end="", highlight=False)
            return
        api = Api(kubeconfig, namespace)
        created = api.create_job(manifest)
        out.print(terminal.text(f"mpijob.kubeflow.org/{created['metadata']['name']} created"))
        if wait:
            wait_for_job(api, options.name, timeout, out)

    _run(action)


def wait_for_job(api: Api, name: str, timeout: float, out: Console) -> None:
    """Show the job's status until it is Running or finished; ConsoleError on timeout."""
    start = time.monotonic()
    last = None
    with out.status(terminal.text(f"Waiting for MPIJob {name}")) as spinner:
        while True:
            status = jobs.job_status(api.get_job(name))
            elapsed = jobs.human_duration(time.monotonic() - start)
            if status != last:
                out.print(Text(f"{elapsed:>6}  "), render.status_text(status), sep="")
                last = status
            if status == "RUNNING" or status in jobs.FINAL_STATUSES:
                return
            if time.monotonic() - start >= timeout:
                raise ConsoleError(f"MPIJob {name} is still {status} after {timeout:.0f}s")
            spinner.update(terminal.text(f"Waiting for MPIJob {name}: {status} for {elapsed}"))
            time.sleep(1.0)


@main.command()
@click.argument("name")
@click.option(
    "--type",
    "-T",
    "job_type",
    metavar="TYPE",
    help="Arena's job type; only mpijob (or mpi) is known here.",
)
@cluster_options
def get(name: str, namespace: str | None, kubeconfig: str | None, job_type: str | None) -> None:
    """Show one MPIJob and its instances (pods, GPUs, nodes).

    GPUs is what the job's spec requests, so a finished job whose pods are gone still shows it;
    each instance's GPU(Requested) and GPU(IDs) are those of that live pod. GPU(Allocated) (what
    the scheduler gave a worker's DRA claim) and GPU(Actual) (what the node agent found its
    containers hold, when that differs) appear when some worker has them; a set that is not
    the chosen GPU(IDs) ends in "!".
    """
    if job_type is not None and job_type.lower() not in submit.JOB_TYPES:
        raise click.BadParameter(
            f"{job_type!r}: this command knows MPIJobs only (mpijob or mpi)", param_hint="--type"
        )

    def action() -> None:
        api = Api(kubeconfig, namespace)
        job = api.get_job(name)
        pods = api.job_pods(name)
        view = jobs.job_view(
            job,
            pods,
            datetime.now(UTC),
            decision=api.get_decision(name),
            claims=api.job_claims(name) if _annotated(pods, keys.GPU_CLAIM) else (),
            uuid_index={
                node: _uuid_index(api, node)
                for node in {
                    str((p.get("spec") or {}).get("nodeName"))
                    for p in pods
                    if _annotated([p], keys.GPU_ACTUAL)
                }
            },
        )
        make_console().print(render.job_details(view), highlight=False)

    _run(action)


@main.command(name="list")
@cluster_options
@click.option(
    "--all-namespaces",
    "-A",
    is_flag=True,
    help="List the MPIJobs of every namespace, with a NAMESPACE column first "
    "(needs the right to list MPIJobs and pods cluster-wide). Not with --namespace.",
)
def list_(namespace: str | None, kubeconfig: str | None, all_namespaces: bool) -> None:
    """List the MPIJobs of a namespace, or of every namespace with -A.

    GPU(Requested) is what each job's spec requests; NODE is its launcher's node.
    """
    if all_namespaces and namespace:
        raise click.UsageError(
            "--namespace and --all-namespaces cannot be used together: "
            "-A lists every namespace, -n one of them"
        )

    def action() -> None:
        api = Api(kubeconfig, namespace)
        views = jobs.job_views(
            api.list_jobs(all_namespaces=all_namespaces),
            api.job_pods(all_namespaces=all_namespaces),
            datetime.now(UTC),
        )
        out = make_console()
        if not views:
            where = "any namespace" if all_namespaces else f"namespace {api.namespace}"
            out.print(terminal.text(f"No MPIJobs in {where}."))
            return
        out.print(render.jobs_table(views, namespaces=all_namespaces), highlight=False)

    _run(action)


@main.command()
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the launcher ends.")
@cluster_options
def logs(name: str, follow: bool, namespace: str | None, kubeconfig: str | None) -> None:
    """Print the launcher's log (where mpirun's output goes).

    Its control characters are printed escaped (\\x1b, \\r), all but its line breaks and tabs:
    the log is the job's to write and the terminal is yours. `kubectl logs` prints it raw.
    """

    def action() -> None:
        api = Api(kubeconfig, namespace)
        job = api.get_job(name)
        launchers = [
            p
            for p in api.job_pods(name)
            if p["metadata"].get("labels", {}).get(keys.LABEL_JOB_ROLE) == keys.ROLE_LAUNCHER
        ]
        if not launchers:
            raise ConsoleError(
                f"MPIJob {api.namespace}/{name} has no launcher pod yet "
                f"(status {jobs.job_status(job)})"
            )
        newest = max(launchers, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        # The container's output is the tenant's: its lines stay lines, nothing else is obeyed.
        for chunk in terminal.escape_log(api.logs(newest["metadata"]["name"], follow=follow)):
            click.echo(chunk, nl=False)

    _run(action)


@main.command()
@click.argument("name")
@cluster_options
def delete(name: str, namespace: str | None, kubeconfig: str | None) -> None:
    """Delete an MPIJob (its pods, launcher and other children go with it)."""

    def action() -> None:
        api = Api(kubeconfig, namespace)
        api.delete_job(name)
        make_console().print(terminal.text(f"mpijob.kubeflow.org/{name} deleted"))

    _run(action)


@main.command()
@click.argument("node")
@click.option(
    "--png",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Also draw the NVLink graph, with each job's GPUs coloured, into this PNG file.",
)
@cluster_options
def topology(node: str, png: Path | None, namespace: str | None, kubeconfig: str | None) -> None:
    """Show a node's GPU links and which job holds which GPU (and its GPU shares)."""
    from mpijob.console import topology as view
    from mpijob.placement import codec

    def action() -> None:
        api = Api(kubeconfig, namespace)
        body = api.node(node)
        annotations = body.get("metadata", {}).get("annotations") or {}
        annotation = annotations.get(keys.GPU_TOPOLOGY)
        pods, cluster_wide = api.node_pods(node)
        shares = view.shares_table(body, view.share_usage(pods))
        if not annotation and shares is None:
            raise ConsoleError(
                f"node {node} has no {keys.GPU_TOPOLOGY} annotation: its GPU topology is not "
                "published (is mpijob-agent running on it?)"
            )
        out = make_console()
        topo = None
        if annotation:
            try:
                topo = codec.loads(annotation)
            except ValueError as exc:
                raise ConsoleError(f"node {node}: unreadable {keys.GPU_TOPOLOGY}: {exc}") from None
            usage = view.gpu_usage(pods)
            out.print(terminal.text(view.summary(node, topo, usage)))
            out.print()
            out.print(view.matrix_table(topo, usage), highlight=False)
            out.print()
            out.print(view.LEGEND, style="dim", highlight=False)
        if shares is not None:
            if topo is not None:
                out.print()
            else:
                out.print(terminal.text(f"Node {node}"))
            out.print(shares, highlight=False)
        if not cluster_wide:
            out.print(
                terminal.text(
                    f"Only namespace {api.namespace} was searched for pods (no right to list all).",
                    style="yellow",
                )
            )
        if png is not None and topo is not None:
            try:
                from mpijob.console import plot
            except ModuleNotFoundError as e:  # matplotlib: the package's "plot" extra
                raise click.ClickException(
                    f"--png needs {e.name}: pip install 'mpijob-operator[plot]'"
                ) from None

            plot.write_png(png, topo, view.gpu_usage(pods), node=node)
            out.print(terminal.text(f"Wrote {png}"))

    _run(action)
