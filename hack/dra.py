"""A simulated NVIDIA DRA driver for the local cluster's kwok GPU nodes.

Publishes what NVIDIA's DRA driver (``gpu.nvidia.com``) publishes on a real node, from the GPU
topology the node already carries (``mpijob.io/gpu-topology``, the agent's annotation):

- the DeviceClass ``gpu.nvidia.com`` (the driver's chart installs it), selecting the driver's
  full GPUs;
- one ResourceSlice per node: pool = node name, devices ``gpu-<index>`` with the GPU's ``uuid``,
  ``type: gpu``, ``productName``, the standard ``resource.kubernetes.io/pciBusID`` and
  ``pcieRoot``, and capacity ``memory``; owned by its Node, so deleting the node deletes it.

The real kube-scheduler then allocates ResourceClaims against these devices and the
controller-manager's claim controllers run. Nothing prepares a device (kwok runs no kubelet):
what a pod got is read from ``ResourceClaim.status.allocation``, never from its phase.

Called by ``hack/cluster.py`` after it ensured the nodes (``make cluster`` does it by default);
``python -m hack.dra manifests`` prints the objects for a cluster of its own.

The driver's ComputeDomain side (``compute-domain.nvidia.com``, IMEX channels for multi-node
NVLink) is simulated in part, for tests that place jobs on NVLink cliques: its DeviceClass
``compute-domain-default-channel.nvidia.com`` (:func:`channel_class`), a ResourceSlice per node
with the node's channel 0 (:func:`channel_slice`), and the channel ResourceClaimTemplate its
controller creates for a ComputeDomain (:func:`channel_template`). No IMEX daemon runs and no
channel is prepared: what is real is the claim of every worker, made from the template by the
controller-manager and allocated on the worker's node by the scheduler.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVER = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
TOPOLOGY_ANNOTATION = "mpijob.io/gpu-topology"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
#: Product name and memory of the GPUs of each shipped topology, as the driver would read them.
PRODUCTS = {
    "dgx1-p100": ("Tesla P100-SXM2-16GB", "16Gi"),
    "dgx1-v100": ("Tesla V100-SXM2-32GB", "32Gi"),
    "dgx2": ("Tesla V100-SXM3-32GB", "32Gi"),
    "dgx-a100": ("NVIDIA A100-SXM4-80GB", "80Gi"),
    "dgx-h100": ("NVIDIA H100 80GB HBM3", "80Gi"),
    "pcie-8gpu-2socket": ("NVIDIA A100-PCIE-40GB", "40Gi"),
    "pcie-nvlink-bridge": ("NVIDIA A100 80GB PCIe", "80Gi"),
    "rtx8000-4x": ("Quadro RTX 8000", "48Gi"),
}
UNKNOWN_PRODUCT = ("NVIDIA GPU", "16Gi")

Kubectl = Callable[..., str]
"""``kubectl(*args, input=None) -> stdout`` against the cluster, raising on failure."""


def device_class() -> dict[str, Any]:
    """The DeviceClass of full GPUs, as NVIDIA's chart defines it."""
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The node's ResourceSlice, or None when it has no readable GPU topology."""
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(TOPOLOGY_ANNOTATION)
    if not text:
        return None
    from mpijob.placement import codec

    try:
        topology = codec.loads(text)
    except ValueError:
        return None
    name = str(meta["name"])
    product, memory = PRODUCTS.get(topology.name, UNKNOWN_PRODUCT)
    roots = pcie_roots(topology)
    devices = []
    for gpu in topology.gpus:
        attributes: dict[str, Any] = {
            "type": {"string": "gpu"},
            "productName": {"string": product},
            "resource.kubernetes.io/pcieRoot": {"string": roots[gpu.index]},
        }
        if gpu.uuid:
            attributes["uuid"] = {"string": gpu.uuid}
        if gpu.pci_bus_id:
            attributes["resource.kubernetes.io/pciBusID"] = {"string": pci_bus_id(gpu.pci_bus_id)}
        devices.append(
            {
                "name": f"gpu-{gpu.index}",
                "attributes": attributes,
                "capacity": {"memory": {"value": memory}},
            }
        )
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid")}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{DRIVER}",
            "ownerReferences": [owner] if meta.get("uid") else [],
        },
        "spec": {
            "driver": DRIVER,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "nodeName": name,
            "devices": devices,
        },
    }


def pci_bus_id(nvml: str) -> str:
    """NVML's ``00000000:18:00.0`` as the kernel (and DRA) writes it: ``0000:18:00.0``."""
    domain, _, rest = nvml.partition(":")
    return f"{domain[-4:].lower()}:{rest.lower()}" if rest else nvml.lower()


def pcie_roots(topology: Any) -> dict[int, str]:
    """Per GPU index, its PCIe root complex: GPUs that meet at a host bridge or closer share one.

    Where the topology gives no PCIe level for a pair, GPUs on one NUMA node share a root.
    """
    from mpijob.placement.model import PcieLevel

    parent = {gpu.index: gpu.index for gpu in topology.gpus}

    def find(index: int) -> int:
        while parent[index] != index:
            index = parent[index]
        return index

    numa = {gpu.index: gpu.numa_node for gpu in topology.gpus}
    for link in topology.links:
        if link.pcie is None:
            same = numa[link.a] is not None and numa[link.a] == numa[link.b]
        else:
            same = link.pcie <= PcieLevel.PHB
        if same:
            parent[find(link.b)] = find(link.a)
    numbers: dict[int, int] = {}
    out = {}
    for gpu in topology.gpus:
        root = numbers.setdefault(find(gpu.index), len(numbers))
        out[gpu.index] = f"pci0000:{0x10 * root:02x}"
    return out


def manifests(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The DeviceClass and the slices of the kwok nodes among ``nodes``."""
    slices = [
        resource_slice(node)
        for node in nodes
        if ((node.get("metadata") or {}).get("annotations") or {}).get(KWOK_ANNOTATION)
    ]
    return [device_class(), *(s for s in slices if s is not None)]


CHANNEL_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"


def channel_class() -> dict[str, Any]:
    """The DeviceClass of a ComputeDomain's default channel (channel 0), as the chart has it."""
    attributes = f"device.attributes['{CHANNEL_DRIVER}']"
    expression = (
        f"device.driver == '{CHANNEL_DRIVER}' && {attributes}.type == 'channel' && "
        f"{attributes}.id == 0"
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": CHANNEL_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def channel_slice(node: str, uid: str) -> dict[str, Any]:
    """The node's ComputeDomain ResourceSlice: its IMEX channel 0, owned by the Node."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{CHANNEL_DRIVER}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "driver": CHANNEL_DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": "channel-0",
                    "attributes": {"type": {"string": "channel"}, "id": {"int": 0}},
                }
            ],
        },
    }


def channel_template(domain: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate the driver's controller creates for a ComputeDomain: named by
    its ``spec.channel.resourceClaimTemplate.name``, in its namespace, owned by it."""
    meta = domain["metadata"]
    name = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    owner = {
        "apiVersion": domain["apiVersion"],
        "kind": domain["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    request = {"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": meta["namespace"], "ownerReferences": [owner]},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def publish(kubectl: Kubectl) -> int:
    """Apply the DeviceClass and every kwok GPU node's slice; returns how many slices."""
    nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    objects = manifests(nodes)
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl("apply", "--server-side", "--field-manager=fake-dra", "-f", "-", input=text)
    return len(objects) - 1


def main() -> int:
    import yaml

    if sys.argv[1:] != ["manifests"]:
        print("usage: python -m hack.dra manifests < nodes.json", file=sys.stderr)
        return 2
    nodes = json.load(sys.stdin)
    print(yaml.safe_dump_all(manifests(nodes.get("items", [nodes])), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
