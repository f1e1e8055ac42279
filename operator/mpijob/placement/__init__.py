"""NVLink-aware GPU placement. Pure: no Kubernetes, no I/O, no clocks.

* :mod:`~mpijob.placement.model`: a node's GPUs and the link of every pair (networkx view);
  :mod:`~mpijob.placement.bandwidth`: GB/s per direction of each kind of link.
* Sources of a topology: :mod:`~mpijob.placement.topologies` (shipped systems, by name),
  :mod:`~mpijob.placement.smi` (``nvidia-smi topo -m`` text), :mod:`~mpijob.placement.codec`
  (the ``mpijob.io/gpu-topology`` node annotation); the node agent reads NVML.
* Scoring: :mod:`~mpijob.placement.scoring` (a set's best ring bottleneck, the reference);
  :mod:`~mpijob.placement.tables` (the same over every subset, precomputed per topology).
* Deciding: :mod:`~mpijob.placement.allocator` (best GPUs on one node),
  :mod:`~mpijob.placement.spread` (workers per node over several nodes),
  :mod:`~mpijob.placement.job` (a whole job: :func:`~mpijob.placement.job.place_job`).
* :mod:`~mpijob.placement.baselines`: brute force, first-fit and BestEffort, for tests and bench.
* Between nodes: :mod:`~mpijob.placement.fabric` (levels of domains, a bandwidth each, shipped
  fabrics), :mod:`~mpijob.placement.fabric_labels` (levels from settings, HyperNodes),
  :mod:`~mpijob.placement.span` (a whole job over the fabric:
  :func:`~mpijob.placement.span.place_on_fabric`), :mod:`~mpijob.placement.fabric_baselines`
  (optimum, upper bound, Kueue-like and Volcano-like policies, for tests and bench).

The handlers call :func:`~mpijob.placement.job.place_job` with the opted-in nodes and the GPUs
live pods hold; nothing here imports the builders or the handlers.
"""
