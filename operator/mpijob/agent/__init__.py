"""The node agent (``mpijob-agent``, a DaemonSet): reads the GPU topology with NVML and publishes
it as the ``mpijob.io/gpu-topology`` Node annotation.

:mod:`~mpijob.agent.nvml_reader` builds the topology from any pynvml-shaped object,
:mod:`~mpijob.agent.fake_nvml` answers like NVML from a shipped topology (tests, simulated
nodes), :mod:`~mpijob.agent.publish` is the one module that talks to the API, and
:mod:`~mpijob.agent.main` is the CLI loop. :mod:`~mpijob.agent.podresources` reads what the
kubelet's pod-resources API says each container holds (a gRPC client, stubs generated in
:mod:`~mpijob.agent.podresources_v1`) and compares it with the placement; the agent loop does not
call it yet.
"""
