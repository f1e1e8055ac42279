"""The node agent (``mpijob-agent``, a DaemonSet): reads the GPU topology with NVML and publishes
it as the ``mpijob.io/gpu-topology`` Node annotation; on nodes that share GPUs out, it also runs
their MPS daemons and advertises the GPU-share extended resources.

:mod:`~mpijob.agent.nvml_reader` builds the topology from any pynvml-shaped object,
:mod:`~mpijob.agent.fake_nvml` answers like NVML from a shipped topology (tests, simulated
nodes), :mod:`~mpijob.agent.mps` runs the MPS control daemons, :mod:`~mpijob.agent.share`
computes and publishes the shares' node status, :mod:`~mpijob.agent.publish` is the one module
that talks to the API, and :mod:`~mpijob.agent.main` is the CLI loop.
"""
