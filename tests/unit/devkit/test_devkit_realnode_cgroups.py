"""The real nodes' cgroupRoot on either host mode, built on a fake /sys/fs/cgroup."""

from __future__ import annotations

from pathlib import Path

from hack import realnode


def v2_root(tmp_path: Path, available: str, enabled: str) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(available + "\n")
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    return root


def v1_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    for hierarchy in ("cpu,cpuacct", "cpuset", "memory", "pids"):
        (root / hierarchy).mkdir(parents=True)
        (root / hierarchy / "cgroup.procs").write_text("")
    (root / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (root / "cpuset" / "cpuset.mems").write_text("0\n")
    return root


def test_the_mode_is_read_from_the_hierarchy(tmp_path: Path) -> None:
    assert realnode.cgroup_mode(v2_root(tmp_path / "a", "cpu memory", "")) == "v2"
    assert realnode.cgroup_mode(v1_root(tmp_path / "b")) == "v1"
    (tmp_path / "c").mkdir()
    assert realnode.cgroup_mode(tmp_path / "c") is None


def test_on_v2_one_cgroup_is_made_and_the_missing_controllers_enabled_for_it(
    tmp_path: Path,
) -> None:
    root = v2_root(tmp_path, "cpuset cpu io memory hugetlb pids rdma misc", "cpu memory")
    st = realnode.NodeState(id="abc123")
    realnode.make_cgroups(st, 0, root)
    # A plain file stands in for the kernel's subtree_control: the last write is what was asked.
    asked = (root / "cgroup.subtree_control").read_text().split()
    assert sorted(asked) == ["+cpuset", "+hugetlb", "+io", "+pids"]
    assert st.cgroups == [str(root / "mpijob-abc123-0")]
    assert (root / "mpijob-abc123-0").is_dir()


def test_on_v2_nothing_is_written_to_the_root_when_every_controller_is_on(tmp_path: Path) -> None:
    on = "cpuset cpu io memory hugetlb pids"
    root = v2_root(tmp_path, on, on)
    st = realnode.NodeState(id="abc123")
    realnode.make_cgroups(st, 1, root)
    realnode.make_cgroups(st, 1, root)
    assert (root / "cgroup.subtree_control").read_text() == on + "\n"
    assert st.cgroups == [str(root / "mpijob-abc123-1")]


def test_on_v1_one_cgroup_per_hierarchy_with_the_cpuset_copied(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    st = realnode.NodeState(id="abc123")
    realnode.make_cgroups(st, 0, root)
    assert sorted(Path(p).parent.name for p in st.cgroups) == [
        "cpu,cpuacct",
        "cpuset",
        "memory",
        "pids",
    ]
    assert (root / "cpuset" / "mpijob-abc123-0" / "cpuset.cpus").read_text() == "0-1\n"
