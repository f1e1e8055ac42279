"""The node agent (``mpijob-agent``, a DaemonSet): reads the GPU topology with NVML and publishes
it as the ``mpijob.io/gpu-topology`` Node annotation.

:mod:`~mpijob.agent.nvml_reader` builds the topology from any pynvml-shaped object,
:mod:`~mpijob.agent.fake_nvml` answers like NVML from a shipped topology (tests, simulated
nodes), :mod:`~mpijob.agent.publish` is the one module that talks to the API, and
:mod:`~mpijob.agent.main` is the CLI loop.
"""
