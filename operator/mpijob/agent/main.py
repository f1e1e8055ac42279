"""``mpijob-agent``: the node agent that publishes the node's GPU topology (a DaemonSet).

Every ``--interval`` seconds it reads the topology through NVML and, when the annotation text
changed, patches ``mpijob.io/gpu-topology`` on its Node (``NODE_NAME``, from the downward API);
then it checks what the placed pods on its node really hold through the kubelet's pod-resources
API and reports placements not honoured (:mod:`~mpijob.agent.gpu_actual`; ``--no-check-pods``
turns that off).
Without a driver, a GPU or a working NVML it logs why and publishes nothing: with ``--once`` it
exits 0, otherwise it tries again at the next interval (drivers are often installed after the
agent starts). A failed API patch is logged; ``--once`` then exits 1, the loop retries.
``--dry-run`` prints the annotation instead; ``--simulate NAME`` reads a shipped topology
through the fake NVML (each GPU ``--simulate-memory`` MiB), for local clusters whose nodes
have no GPU.

``--share-gpus`` (``core_mem`` nodes) adds a step to every turn (:class:`~mpijob.agent.share.
ShareStep`): one MPS control daemon per GPU started or checked, then the GPU-share extended
resources patched into the node status. ``--no-mps`` advertises without daemons (simulated
nodes); a dry run starts no daemon and prints the status patch.
"""

from __future__ import annotations

import logging
import select
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import click

from mpijob import keys
from mpijob.agent import fake_nvml, nvml_reader, podresources
from mpijob.agent.gpu_actual import GpuActual
from mpijob.placement import codec, topologies

logger = logging.getLogger("mpijob.agent")

Annotate = Callable[[str, str, str], None]


class PodCheck(Protocol):
    """What the loop needs of :class:`~mpijob.agent.gpu_actual.GpuActual`."""

    index_uuids: dict[str, str]

    def step(self) -> object: ...


def run(
    nvml: nvml_reader.Nvml,
    *,
    node: str,
    annotate: Annotate | None,
    once: bool,
    interval: float,
    echo: Callable[[str], None] = click.echo,
    sleep: Callable[[float], object] = time.sleep,
    beat: Callable[[], None] = lambda: None,
    check: PodCheck | None = None,
    steps: Sequence[Callable[[], bool]] = (),
) -> int:
    """The agent's loop; returns the exit code (only with ``once``). No ``annotate``: dry run.

    ``beat`` is called on every turn of the loop (the health endpoint's proof of life);
    ``check``, when given, checks the node's placed pods after each reading of the topology;
    ``steps`` run after that on every turn, and one returning False fails ``once``. A ``sleep``
    that returns true (a stop signal arrived) ends the loop with 0: the agent stops.
    """
    published: str | None = None
    while True:
        beat()
        failed = False
        try:
            topology = nvml_reader.discover(nvml)
            text = codec.dumps(topology)
        except nvml_reader.NoTopology as reason:
            logger.warning("Published no GPU topology: %s node=%s", reason, node)
        else:
            if check is not None:
                check.index_uuids = {str(g.index): g.uuid for g in topology.gpus if g.uuid}
            if annotate is None:
                echo(text)
            elif text != published:
                try:
                    annotate(node, keys.GPU_TOPOLOGY, text)
                except Exception:
                    logger.exception("Failed to patch the GPU topology node=%s", node)
                    if once:
                        return 1
                else:
                    published = text
                    logger.info("Published the GPU topology node=%s bytes=%d", node, len(text))
        if check is not None:
            check.step()
        for step in steps:
            failed = not step() or failed
        if once:
            return 1 if failed else 0
        if sleep(interval):
            logger.info("Stopped on a signal node=%s", node)
            return 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    help="Node to annotate; defaults to $NODE_NAME (set it from spec.nodeName).",
)
@click.option("--once", is_flag=True, help="Publish once and exit instead of looping.")
@click.option(
    "--interval",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="Seconds between two readings of the topology.",
)
@click.option("--dry-run", is_flag=True, help="Print the annotation JSON; do not patch the Node.")
@click.option(
    "--health-port",
    type=click.IntRange(min=0),
    default=8081,
    show_default=True,
    help="Port of /healthz (OK while the loop keeps turning); 0 turns it off.",
)
@click.option(
    "--simulate",
    type=click.Choice(topologies.NAMES),
    help="Publish this shipped topology through a fake NVML (nodes without GPUs).",
)
@click.option(
    "--simulate-memory",
    type=click.IntRange(min=1),
    default=fake_nvml.H100_MEMORY >> 20,
    show_default=True,
    metavar="MIB",
    help="With --simulate: each GPU's total memory in MiB, as NVML reports it (a T4: 15360).",
)
@click.option(
    "--check-pods/--no-check-pods",
    default=True,
    show_default=True,
    help="After each reading, compare the GPUs the kubelet says each placed pod holds with "
    "its mpijob.io/gpu-uuids and report mismatches (annotation mpijob.io/gpu-actual, metric, "
    "Event on the MPIJob). Not with --dry-run.",
)
@click.option(
    "--pod-resources-socket",
    default=podresources.SOCKET,
    show_default=True,
    help="The kubelet's pod-resources socket (mount its folder read-only into the agent).",
)
@click.option(
    "--share-gpus",
    is_flag=True,
    help="Advertise aliyun.com/gpu-count, gpu-mem and gpu-core.percentage in the node status"
    " and run one MPS control daemon per GPU (nodes labelled ack.node.gpu.schedule=core_mem).",
)
@click.option(
    "--mps/--no-mps",
    default=True,
    show_default=True,
    help="With --share-gpus: start the MPS daemons before advertising (off for --simulate).",
)
@click.option(
    "--mps-root",
    default=keys.MPS_ROOT,
    show_default=True,
    help="Host directory of the daemons' pipe, log and shared-memory directories.",
)
def main(
    node_name: str | None,
    once: bool,
    interval: float,
    dry_run: bool,
    health_port: int,
    simulate: str | None,
    simulate_memory: int,
    check_pods: bool,
    pod_resources_socket: str,
    share_gpus: bool,
    mps: bool,
    mps_root: str,
) -> None:
    """Publish this node's GPU topology as the mpijob.io/gpu-topology annotation."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not node_name and not dry_run:
        raise click.UsageError("set NODE_NAME or --node-name (or use --dry-run)")
    # In its container the agent is PID 1, which the kernel sends no default SIGTERM action:
    # without a handler every rollout or node drain would wait out the grace period (30 s). It
    # is set before start-up: a pod deleted while it starts (an upgrade, an uninstall) is told
    # then, once, and the first sleep ends the loop. (--once never sleeps.)
    sleep = time.sleep if once else _StoppableSleep(signal.SIGTERM, signal.SIGINT)
    node = node_name or "local"
    annotate: Annotate | None = None
    check: GpuActual | None = None
    if not dry_run:
        from mpijob.agent.publish import AgentKube, NodeAnnotator  # keeps dry runs client-free

        annotate = NodeAnnotator()
        if check_pods:
            check = GpuActual(AgentKube(node), node, socket=pod_resources_socket)
    last = [time.monotonic()]
    if health_port and not once:
        from mpijob import metrics

        # A reading takes well under a second; two missed turns mean the loop is stuck.
        def turning() -> bool:
            return time.monotonic() - last[0] < 2 * interval + 30

        metrics.serve(health_port, {"/healthz": turning, "/readyz": turning})
    nvml = _nvml(simulate, node, simulate_memory)
    steps = []
    if share_gpus:
        steps.append(
            _share_step(nvml, node, dry_run, mps and not simulate and not dry_run, mps_root)
        )
    raise SystemExit(
        run(
            nvml,
            node=node,
            annotate=annotate,
            once=once,
            interval=interval,
            sleep=sleep,
            beat=lambda: last.__setitem__(0, time.monotonic()),
            check=check,
            steps=steps,
        )
    )


class _StoppableSleep:
    """A sleep that returns True as soon as one of ``signals`` arrives, even one that came while
    the loop was busy. The handlers do nothing in Python: the interpreter writes each signal to a
    socket the sleep waits on. (A handler that sets a threading.Event deadlocks when the signal
    lands while the loop holds that Event's lock; a blocked signal mask would be inherited by the
    MPS daemon the agent starts.)"""

    def __init__(self, *signals: signal.Signals) -> None:
        self._wake, self._woken = socket.socketpair()
        for end in (self._wake, self._woken):
            end.setblocking(False)
        signal.set_wakeup_fd(self._woken.fileno(), warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, lambda *_: None)

    def __call__(self, seconds: float) -> bool:
        ready, _, _ = select.select([self._wake], [], [], seconds)
        return bool(ready)


def _share_step(nvml: Any, node: str, dry_run: bool, mps: bool, root: str) -> Callable[[], bool]:
    from mpijob.agent.mps import MpsDaemon
    from mpijob.agent.share import PatchStatus, ShareStep

    patch: PatchStatus | None = None
    if not dry_run:
        from mpijob.agent.publish import NodeStatusPatcher

        patch = NodeStatusPatcher()
    return ShareStep(
        nvml,
        node=node,
        patch=patch,
        daemon=(lambda uuid: MpsDaemon(uuid, root=root)) if mps else None,
        echo=click.echo,
    )


def _nvml(simulate: str | None, node: str, memory_mib: int) -> Any:
    if simulate:
        return fake_nvml.FakeNvml(
            topologies.for_node(simulate, node), product=simulate, memory=memory_mib << 20
        )
    import pynvml

    return pynvml
