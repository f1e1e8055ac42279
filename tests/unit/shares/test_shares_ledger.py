"""The fractional-GPU ledger: per-GPU fit, binpack and spread, no mixing, 48 clients,
all-or-nothing, release and rebuild."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mpijob import keys
from mpijob.placement import codec, topologies
from mpijob.shares.ledger import Ledger, NodeGpu, read_node
from mpijob.shares.request import Placed, Share


def gpus(count: int = 4, memory: int = 15) -> list[NodeGpu]:
    return [NodeGpu(i, f"GPU-{i}", memory) for i in range(count)]


def ledger(*nodes: tuple[str, bool], count: int = 4, memory: int = 15) -> Ledger:
    out = Ledger()
    for name, binpack in nodes:
        out.set_node(name, gpus(count, memory), binpack=binpack)
    return out


def placed(result: Placed | str) -> Placed:
    assert isinstance(result, Placed), result
    return result


def test_binpack_puts_three_thirty_percent_pods_on_one_gpu_and_the_fourth_on_another() -> None:
    book = ledger(("bin", True))
    where = [placed(book.place(f"p{i}", Share(2, 30))).gpu for i in range(4)]
    assert where[:3] == [where[0]] * 3
    assert where[3] != where[0]


def test_spread_puts_them_on_different_gpus() -> None:
    book = ledger(("spread", False))
    where = [placed(book.place(f"p{i}", Share(2, 30))).gpu for i in range(4)]
    assert sorted(where) == [0, 1, 2, 3]


def test_memory_and_percentage_are_both_per_gpu() -> None:
    book = ledger(("n", True), count=2, memory=15)
    placed(book.place("big", Share(14, 10)))
    placed(book.place("busy", Share(1, 90)))  # fits beside "big" only by memory: 1 GiB left
    result = placed(book.place("third", Share(1, 5)))
    assert result.gpu == 1  # GPU 0 has 0 GiB left


def test_a_share_no_gpu_has_room_for_is_refused_with_a_reason() -> None:
    book = ledger(("n", False), count=1, memory=15)
    placed(book.place("a", Share(10, 50)))
    reason = book.place("b", Share(6, 10))
    assert isinstance(reason, str)
    assert "no GPU of 1 eligible node(s) has 6 GiB and 10% free" in reason


def test_memory_only_and_compute_never_share_a_node() -> None:
    book = ledger(("a", True), ("b", True))
    compute = placed(book.place("compute", Share(2, 30)))
    memory_only = placed(book.place("memory", Share(2)))
    assert memory_only.node != compute.node
    reason = book.place("more-compute", Share(2, 30), nodes={memory_only.node})
    assert isinstance(reason, str)
    assert "hold memory-only shares, which never mix" in reason


def test_at_most_48_mps_clients_per_gpu() -> None:
    book = ledger(("n", True), count=2, memory=100)
    for i in range(keys.MPS_MAX_CLIENTS):
        assert placed(book.place(f"p{i}", Share(1))).gpu == 0
    assert placed(book.place("49th", Share(1))).gpu == 1
    assert book.nodes["n"].gpus[0].clients == keys.MPS_MAX_CLIENTS


def test_binpack_nodes_first_fullest_first_then_spread_emptiest_first() -> None:
    book = ledger(("s1", False), ("b1", True), ("b2", True))
    placed(book.place("x", Share(10, 10), nodes={"b2"}))
    assert placed(book.place("y", Share(1, 5))).node == "b2"
    book2 = ledger(("s1", False), ("s2", False))
    placed(book2.place("x", Share(10, 10), nodes={"s1"}))
    assert placed(book2.place("y", Share(1, 5))).node == "s2"


def test_eligible_nodes_limit_the_choice() -> None:
    book = ledger(("a", True), ("b", True))
    assert placed(book.place("p", Share(1, 5), nodes=["b"])).node == "b"
    reason = book.place("q", Share(1, 5), nodes=[])
    assert isinstance(reason, str)
    assert "no opted-in node" in reason


def test_room_is_asked_of_candidates_best_first_and_skips_a_full_node() -> None:
    book = ledger(("a", True), ("b", True), ("c", False))
    placed(book.place("first", Share(2, 30), ["a"]))  # a is now the fullest binpack node
    asked: list[str] = []

    def room(node: str) -> bool:
        asked.append(node)
        return node != "a"

    assert placed(book.place("p", Share(2, 30), room=room)).node == "b"
    assert asked == ["a", "b"]
    reason = book.place("q", Share(2, 30), room=lambda node: False)
    assert reason == (
        "no eligible node has both a GPU with 2 GiB and 30% free and room for the pod's other"
        " requests (cpu, memory, pods): 3 of 3 have the GPU but not the room"
    )


def test_place_all_counts_its_own_pods_against_a_node_s_room() -> None:
    book = ledger(("a", True), ("b", True))
    # Room for two more pods on each node: four workers that GPU-wise fit one node split.
    result = book.place_all(
        [(f"w{i}", Share(2, 25)) for i in range(4)], room=lambda node, already: already < 2
    )
    assert isinstance(result, list)
    assert sorted(p.node for p in result) == ["a", "a", "b", "b"]


def test_placing_a_pod_twice_returns_its_share() -> None:
    book = ledger(("n", True))
    first = placed(book.place("p", Share(2, 30)))
    assert book.place("p", Share(2, 30)) == first
    assert book.nodes["n"].gpus[first.gpu].memory_used == 2


def test_release_frees_the_share() -> None:
    book = ledger(("n", True), count=1)
    placed(book.place("a", Share(15, 100)))
    assert isinstance(book.place("b", Share(1, 5)), str)
    assert book.release("a") is not None
    assert book.release("a") is None
    assert placed(book.place("b", Share(1, 5))).gpu == 0
    assert book.nodes["n"].compute_pods == 1


def test_place_all_is_all_or_nothing() -> None:
    book = ledger(("n", True), count=2)
    workers = [(f"w{i}", Share(2, 25)) for i in range(8)]
    result = book.place_all(workers)
    assert isinstance(result, list)
    assert len({(p.node, p.gpu) for p in result}) == 2
    too_many = [(f"v{i}", Share(2, 25)) for i in range(9)]
    book2 = ledger(("n", True), count=2)
    assert isinstance(book2.place_all(too_many), str)
    assert len(book2) == 0
    assert all(g.memory_used == 0 for g in book2.nodes["n"].gpus.values())


def test_place_all_keeps_what_was_held_before_a_failed_batch() -> None:
    book = ledger(("n", True), count=1)
    before = placed(book.place("w0", Share(2, 25)))
    assert isinstance(book.place_all([("w0", Share(2, 25)), ("w1", Share(14, 80))]), str)
    assert book.held("w0") == before


def test_could_ever_fit_reads_gpu_capacity() -> None:
    book = ledger(("n", True), memory=15)
    assert book.could_ever_fit(Share(15, 100))
    assert not book.could_ever_fit(Share(16, 5))
    assert not Ledger().could_ever_fit(Share(1, 5))


def test_rebuild_restores_holdings_even_before_their_node_is_known() -> None:
    book = ledger(("a", True))
    facts = [
        ("p1", Placed("a", 0, "GPU-0", Share(10, 60))),
        ("p2", Placed("late", 1, "GPU-1", Share(2))),
    ]
    book.rebuild(facts)
    assert book.nodes["a"].gpus[0].memory_used == 10
    book.set_node("late", gpus(), binpack=False)
    assert book.nodes["late"].gpus[1].memory_used == 2
    assert book.nodes["late"].memory_only_pods == 1
    assert isinstance(book.place("compute", Share(1, 5), nodes={"late"}), str)


def test_a_node_update_keeps_its_holdings() -> None:
    book = ledger(("n", False))
    where = placed(book.place("p", Share(3, 30)))
    book.set_node("n", gpus(), binpack=True)
    assert book.nodes["n"].gpus[where.gpu].memory_used == 3
    assert book.nodes["n"].binpack


def test_random_admissions_and_releases_never_overcommit() -> None:
    rng = random.Random(11)
    book = ledger(*[(f"n{i}", i % 2 == 0) for i in range(6)], count=4, memory=16)
    live: list[str] = []
    for step in range(3000):
        if live and rng.random() < 0.35:
            book.release(live.pop(rng.randrange(len(live))))
            continue
        compute = rng.random() < 0.8
        share = Share(rng.randint(1, 8), rng.choice(range(5, 101, 5)) if compute else None)
        if isinstance(book.place(f"p{step}", share), Placed):
            live.append(f"p{step}")
        assert book.overcommitted() == []
    for node in book.nodes.values():
        assert not (node.compute_pods and node.memory_only_pods)
        for gpu in node.gpus.values():
            assert gpu.memory_used == sum(s.memory_gib for s in gpu.holders.values())


def node_object(**labels: str) -> dict[str, Any]:
    topology = topologies.for_node("dgx1-v100", "n")
    return {
        "metadata": {
            "name": "n",
            "labels": labels,
            "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topology)},
        },
        "status": {
            "allocatable": {
                keys.GPU_COUNT_RESOURCE: "8",
                keys.GPU_MEM_RESOURCE: "632",
                keys.GPU_CORE_PERCENTAGE_RESOURCE: "800",
            }
        },
    }


def test_read_node_takes_opted_in_nodes_only() -> None:
    core_mem = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM}
    read = read_node(node_object(**core_mem, **{keys.NODE_GPU_PLACEMENT_LABEL: "binpack"}))
    assert read is not None
    node_gpus, binpack = read
    assert binpack
    assert [g.memory_gib for g in node_gpus] == [79] * 8
    assert [g.index for g in node_gpus] == list(range(8))
    assert read_node(node_object()) is None
    spread = read_node(node_object(**core_mem))
    assert spread is not None
    assert not spread[1]


@pytest.mark.parametrize("value", ["0", "junk"])
def test_read_node_without_advertised_gpus_is_none(value: str) -> None:
    node = node_object(**{keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM})
    node["status"]["allocatable"][keys.GPU_COUNT_RESOURCE] = value
    assert read_node(node) is None
