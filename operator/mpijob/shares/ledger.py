"""The fractional-GPU ledger: which pod holds how much memory and compute of which GPU.

One ledger per operator, held under one lock by its caller, so that concurrent placements never
overcommit a GPU. Per opted-in node (``ack.node.gpu.schedule=core_mem``) it knows each GPU's
memory (GiB) and, per GPU, the shares held on it; every decision reads only this state.

Rules of :meth:`Ledger.place`: a share goes onto one GPU with enough free memory, free
percentage (memory-only shares take none) and room for its MPS clients (at most 48 per GPU); a
node holding memory-only shares takes no compute share and the reverse. Within a node,
``ack.node.gpu.placement=binpack`` picks the fitting GPU with the least memory left (fewest GPUs
in use), otherwise (spread, the default) the one with the most. Across nodes, binpack nodes come
first, fullest first; then spread nodes, emptiest first. Ties go to the lower name and index,
so a decision is deterministic. The caller's ``room`` check (the node's cpu, memory and pods,
:class:`mpijob.shares.node_room.NodeRoom`) is asked of candidate nodes in that order, only
of those whose GPUs could take the share.

:meth:`Ledger.place_all` places several shares (an MPIJob's workers) all or nothing, largest
first. :meth:`Ledger.rebuild` replaces every holding from ``(pod, Placed)`` facts read back from
the cluster after a restart; holdings on nodes or GPUs the ledger does not know (yet) are kept
and counted once the node is set. Cost per decision: one pass over the nodes on per-node
summaries, then over the GPUs of the candidates in order until one fits.

Pure; the I/O shell (:mod:`mpijob.shares.service`) feeds it nodes and pod facts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob import keys
from mpijob.placement import codec
from mpijob.pods.predicates import admits, tolerates
from mpijob.shares.request import PERCENT_MAX, Placed, Share, read_request


@dataclass(frozen=True)
class NodeGpu:
    """One GPU a node shares out."""

    index: int
    uuid: str
    memory_gib: int


@dataclass
class GpuState:
    """One GPU's capacity and what is held on it."""

    index: int
    uuid: str
    memory_gib: int
    holders: dict[str, Share] = field(default_factory=dict)
    memory_used: int = 0
    percentage_used: int = 0
    clients: int = 0

    @property
    def memory_free(self) -> int:
        return self.memory_gib - self.memory_used

    @property
    def percentage_free(self) -> int:
        return PERCENT_MAX - self.percentage_used

    def fits(self, share: Share) -> bool:
        return (
            share.memory_gib <= self.memory_free
            and (share.percentage or 0) <= self.percentage_free
            and self.clients + share.clients <= keys.MPS_MAX_CLIENTS
        )

    def add(self, pod: str, share: Share) -> None:
        self.holders[pod] = share
        self.memory_used += share.memory_gib
        self.percentage_used += share.percentage or 0
        self.clients += share.clients

    def remove(self, pod: str) -> None:
        share = self.holders.pop(pod)
        self.memory_used -= share.memory_gib
        self.percentage_used -= share.percentage or 0
        self.clients -= share.clients


@dataclass
class NodeState:
    """One opted-in node: its GPUs, its packing rule, and summaries kept for fast filtering."""

    name: str
    binpack: bool
    gpus: dict[int, GpuState]
    compute_pods: int = 0
    memory_only_pods: int = 0
    memory_free: int = 0
    max_memory_free: int = 0
    max_percentage_free: int = 0

    def summarise(self) -> None:
        self.memory_free = sum(g.memory_free for g in self.gpus.values())
        self.max_memory_free = max((g.memory_free for g in self.gpus.values()), default=0)
        self.max_percentage_free = max((g.percentage_free for g in self.gpus.values()), default=0)

    def admits_kind(self, share: Share) -> bool:
        """The no-mixing rule: memory-only and memory+compute shares never share a node."""
        return not self.memory_only_pods if share.with_compute else not self.compute_pods

    def best_gpu(self, share: Share) -> GpuState | None:
        fitting = [g for g in self.gpus.values() if g.fits(share)]
        if not fitting:
            return None
        if self.binpack:
            return min(fitting, key=lambda g: (g.memory_free, g.percentage_free, g.index))
        return min(fitting, key=lambda g: (-g.memory_free, -g.percentage_free, g.index))


class Ledger:
    """Every opted-in node's GPUs and every share held; callers serialise calls (one lock)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._held: dict[str, Placed] = {}
        self._on_node: dict[str, set[str]] = {}
        self._pending: dict[str, float] = {}

    # --- nodes -------------------------------------------------------------------------------

    def set_node(self, name: str, gpus: Sequence[NodeGpu], *, binpack: bool) -> None:
        """Add or update a node (its GPUs and packing rule); its holdings carry over."""
        state = NodeState(
            name,
            binpack,
            {g.index: GpuState(g.index, g.uuid, g.memory_gib) for g in gpus},
        )
        self._nodes[name] = state
        for pod in sorted(self._on_node.get(name, ())):
            self._count(state, pod, self._held[pod])
        state.summarise()

    def remove_node(self, name: str) -> None:
        """Forget a node that left or opted out; its holdings stay until their pods go."""
        self._nodes.pop(name, None)

    @property
    def nodes(self) -> dict[str, NodeState]:
        """The known nodes (read-only use: the console and metrics)."""
        return self._nodes

    # --- decisions ---------------------------------------------------------------------------

    def place(
        self,
        pod: str,
        share: Share,
        nodes: Collection[str] | None = None,
        *,
        pending_until: float | None = None,
        room: Callable[[str], bool] | None = None,
    ) -> Placed | str:
        """Hold ``share`` for ``pod`` on the best GPU; the reason it fits nowhere otherwise.

        ``nodes`` limits the choice (the pod's node selector, affinity and taints, as the caller
        checked them); ``room`` says whether a node has room for the pod's other requests
        (asked only of nodes whose GPUs could take the share, best first). A pod already
        holding a share gets it back.
        ``pending_until``: the hold lapses at that time (see :meth:`expire`) unless
        :meth:`confirm` or :meth:`hold` sees the pod first: an admitted pod the API server
        then refuses to store must not keep its share.
        """
        if pod in self._held:
            return self._held[pod]
        choice = self._choose(share, nodes, room)
        if isinstance(choice, str):
            return choice
        node, gpu = choice
        placed = Placed(node.name, gpu.index, gpu.uuid, share, claim=pod)
        self.hold(pod, placed)
        if pending_until is not None:
            self._pending[pod] = pending_until
        return placed

    def confirm(self, pod: str) -> None:
        """The pod of a pending hold exists: the hold no longer lapses."""
        self._pending.pop(pod, None)

    def expire(self, now: float) -> list[str]:
        """Release every pending hold whose time passed; the pods released."""
        lapsed = [pod for pod, until in self._pending.items() if until <= now]
        for pod in lapsed:
            self.release(pod)
        return lapsed

    def place_all(
        self,
        shares: Sequence[tuple[str, Share]],
        nodes: Collection[str] | None = None,
        *,
        pending_until: float | None = None,
        room: Callable[[str, int], bool] | None = None,
    ) -> list[Placed] | str:
        """Place every share or none (in the given order in the result); largest first.

        Shares already held are returned as they are; ``pending_until`` as for :meth:`place`,
        for the fresh ones; ``room(node, n)``: whether the node has room for one more pod when
        ``n`` fresh ones of this call already went there.
        """
        order = sorted(
            range(len(shares)),
            key=lambda i: (-shares[i][1].memory_gib, -(shares[i][1].percentage or 0), i),
        )
        placed: dict[int, Placed] = {}
        fresh: list[str] = []
        went: dict[str, int] = {}

        def room_now(node: str) -> bool:
            return room is None or room(node, went.get(node, 0))

        for i in order:
            pod, share = shares[i]
            was_held = pod in self._held
            result = self.place(pod, share, nodes, pending_until=pending_until, room=room_now)
            if isinstance(result, str):
                for earlier in fresh:
                    self.release(earlier)
                return f"{pod}: {result}"
            placed[i] = result
            if not was_held:
                fresh.append(pod)
                went[result.node] = went.get(result.node, 0) + 1
        return [placed[i] for i in range(len(shares))]

    def could_ever_fit(self, share: Share) -> bool:
        """Whether some known GPU could hold ``share`` were it empty (else: refuse at creation)."""
        if (share.percentage or 0) > PERCENT_MAX or share.clients > keys.MPS_MAX_CLIENTS:
            return False
        return any(
            gpu.memory_gib >= share.memory_gib
            for node in self._nodes.values()
            for gpu in node.gpus.values()
        )

    def _choose(
        self, share: Share, allowed: Collection[str] | None, room: Callable[[str], bool] | None
    ) -> tuple[NodeState, GpuState] | str:
        memory, percentage = share.memory_gib, share.percentage or 0
        candidates: list[tuple[tuple[int, int, str], NodeState]] = []
        kind_blocked = 0
        for node in self._nodes.values():
            if allowed is not None and node.name not in allowed:
                continue
            if not node.admits_kind(share):
                kind_blocked += 1
                continue
            if node.max_memory_free < memory or node.max_percentage_free < percentage:
                continue
            rank = (
                (0, node.memory_free, node.name)
                if node.binpack
                else (
                    1,
                    -node.memory_free,
                    node.name,
                )
            )
            candidates.append((rank, node))
        candidates.sort(key=lambda c: c[0])
        room_blocked = 0
        for _, node in candidates:
            gpu = node.best_gpu(share)
            if gpu is None:
                continue
            if room is not None and not room(node.name):
                room_blocked += 1
                continue
            return node, gpu
        return self._why_not(share, allowed, kind_blocked, room_blocked)

    def _why_not(
        self, share: Share, allowed: Collection[str] | None, kind_blocked: int, room_blocked: int
    ) -> str:
        considered = [n for n in self._nodes.values() if allowed is None or n.name in allowed]
        what = f"{share.memory_gib} GiB" + (
            f" and {share.percentage}%" if share.with_compute else " (memory only)"
        )
        if not considered:
            return (
                f"no opted-in node ({keys.NODE_GPU_SCHEDULE_LABEL}="
                f"{keys.NODE_GPU_SCHEDULE_CORE_MEM}) is eligible for {what}"
            )
        parts = [f"no GPU of {len(considered)} eligible node(s) has {what} free"]
        if room_blocked:
            parts = [
                f"no eligible node has both a GPU with {what} free and room for the pod's other"
                f" requests (cpu, memory, pods): {room_blocked} of {len(considered)} have the GPU"
                " but not the room"
            ]
        if kind_blocked:
            other = "memory-only" if share.with_compute else "memory+compute"
            parts.append(f"{kind_blocked} node(s) hold {other} shares, which never mix")
        return "; ".join(parts)

    # --- holdings ----------------------------------------------------------------------------

    def hold(self, pod: str, placed: Placed) -> None:
        """Record that ``pod`` holds ``placed`` (a decision, or a fact read back)."""
        if pod in self._held:
            self.release(pod)
        self._pending.pop(pod, None)
        self._held[pod] = placed
        self._on_node.setdefault(placed.node, set()).add(pod)
        node = self._nodes.get(placed.node)
        if node is not None:
            self._count(node, pod, placed)
            node.summarise()

    def release(self, pod: str) -> Placed | None:
        """Free ``pod``'s share (finished or deleted pod); what it held, if anything."""
        self._pending.pop(pod, None)
        placed = self._held.pop(pod, None)
        if placed is None:
            return None
        pods = self._on_node.get(placed.node)
        if pods is not None:
            pods.discard(pod)
            if not pods:
                del self._on_node[placed.node]
        node = self._nodes.get(placed.node)
        if node is not None:
            gpu = node.gpus.get(placed.gpu)
            if gpu is not None and pod in gpu.holders:
                gpu.remove(pod)
                if placed.share.with_compute:
                    node.compute_pods -= 1
                else:
                    node.memory_only_pods -= 1
            node.summarise()
        return placed

    def rebuild(self, facts: Iterable[tuple[str, Placed]]) -> None:
        """Replace every holding with ``facts`` (pods read back from the cluster); nodes stay."""
        self._held.clear()
        self._on_node.clear()
        self._pending.clear()
        for node in self._nodes.values():
            for gpu in node.gpus.values():
                gpu.holders.clear()
                gpu.memory_used = gpu.percentage_used = gpu.clients = 0
            node.compute_pods = node.memory_only_pods = 0
        for pod, placed in facts:
            self._held[pod] = placed
            self._on_node.setdefault(placed.node, set()).add(pod)
            target = self._nodes.get(placed.node)
            if target is not None:
                self._count(target, pod, placed)
        for node in self._nodes.values():
            node.summarise()

    def overcommitted(self) -> list[str]:
        """GPUs holding more than they have (``node/index``): empty unless facts disagreed."""
        return [
            f"{node.name}/{gpu.index}"
            for node in self._nodes.values()
            for gpu in node.gpus.values()
            if gpu.memory_free < 0 or gpu.percentage_free < 0 or gpu.clients > keys.MPS_MAX_CLIENTS
        ]

    def held(self, pod: str) -> Placed | None:
        """What ``pod`` holds, if anything."""
        return self._held.get(pod)

    def __len__(self) -> int:
        return len(self._held)

    def capacity(self, share: Share) -> int:
        """How many shares like ``share`` every known GPU together takes, were all empty: the
        most workers of one MPIJob that could ever hold one each (hostile sizes stop here)."""
        per_gpu_percent = PERCENT_MAX // share.percentage if share.percentage else PERCENT_MAX
        per_gpu_clients = keys.MPS_MAX_CLIENTS // max(share.clients, 1)
        return sum(
            min(gpu.memory_gib // max(share.memory_gib, 1), per_gpu_percent, per_gpu_clients)
            for node in self._nodes.values()
            for gpu in node.gpus.values()
        )

    @staticmethod
    def _count(node: NodeState, pod: str, placed: Placed) -> None:
        """Count a holding on a GPU the node has; one naming a GPU it lacks counts for
        nothing, not even for the no-mixing rule (it can hold nothing real)."""
        gpu = node.gpus.get(placed.gpu)
        if gpu is None:
            return
        gpu.add(pod, placed.share)
        if placed.share.with_compute:
            node.compute_pods += 1
        else:
            node.memory_only_pods += 1


def believed(pod: Mapping[str, Any]) -> Placed | None:
    """The share record of ``pod`` the ledger may count; None for none or one not believed.

    A record counts only when it names exactly the share the pod's own containers request: a
    pod that requests none (a record written by hand on a plain pod) or another size holds
    nothing. The record itself is written by the webhook at creation (it replaces any the
    tenant sent) and, in the fractional-gpus overlay, changeable by the operator alone (the
    ValidatingAdmissionPolicy ``mpijob-gpu-share-records``).
    """
    meta = pod.get("metadata") or {}
    record = Placed.loads((meta.get("annotations") or {}).get(keys.GPU_SHARE))
    if record is None:
        return None
    request = read_request(pod.get("spec"))
    if request.errors or request.share != record.share:
        return None
    return record


def read_node(node: Mapping[str, Any]) -> tuple[list[NodeGpu], bool] | None:
    """A Node object's GPUs and whether it binpacks; None unless it opted in and advertises.

    Each GPU gets the node's ``aliyun.com/gpu-mem`` divided evenly by ``aliyun.com/gpu-count``
    (the agent advertises per-GPU memory rounded down, and a node's GPUs are one model); the
    UUIDs come from the agent's topology annotation, in index order, when it is there.
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(keys.NODE_GPU_SCHEDULE_LABEL) != keys.NODE_GPU_SCHEDULE_CORE_MEM:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        count = int(str(allocatable.get(keys.GPU_COUNT_RESOURCE, "0")))
        memory = int(str(allocatable.get(keys.GPU_MEM_RESOURCE, "0")))
    except ValueError:
        return None
    if count < 1 or memory < count:
        return None
    uuids = _uuids((meta.get("annotations") or {}).get(keys.GPU_TOPOLOGY))
    gpus = [
        NodeGpu(index, uuids[index] if index < len(uuids) else "", memory // count)
        for index in range(count)
    ]
    return gpus, labels.get(keys.NODE_GPU_PLACEMENT_LABEL) == keys.NODE_GPU_PLACEMENT_BINPACK


def _uuids(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        topology = codec.loads(text)
    except ValueError:
        return []
    return [gpu.uuid or "" for gpu in topology.gpus]


def node_facts(node: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`eligible_nodes` reads of a Node: its name, labels and taints."""
    meta = node.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name") or "", "labels": dict(meta.get("labels") or {})},
        "spec": {"taints": list((node.get("spec") or {}).get("taints") or [])},
    }


def eligible_nodes(
    spec: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]
) -> list[str] | None:
    """The nodes (of ``nodes``, name to :func:`node_facts`) a pod with ``spec`` may run on: its
    node selector and required node affinity admit them and it tolerates their ``NoSchedule``
    and ``NoExecute`` taints. None when every node qualifies (the common case, checked first).

    The ledger only places a share where the scheduler can then bind the pod; a pod pinned to a
    node it cannot run on would stay Pending while holding its share. The node's other
    allocatable resources (cpu, memory, pods) are the ``room`` check of :meth:`Ledger.place`.
    """
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    tainted = any((n.get("spec") or {}).get("taints") for n in nodes.values())
    if not spec.get("nodeSelector") and not affinity and not tainted:
        return None
    return [name for name, node in nodes.items() if admits(spec, node) and tolerates(spec, node)]
