"""The node agent (``mpijob-agent``, a DaemonSet): reads the GPU topology with NVML and publishes
it as the ``mpijob.io/gpu-topology`` Node annotation, and reports placed pods whose containers
hold other GPUs than were chosen; on nodes that share GPUs out, it also runs their MPS daemons
and advertises the GPU-share extended resources.

:mod:`~mpijob.agent.nvml_reader` builds the topology from any pynvml-shaped object,
:mod:`~mpijob.agent.fake_nvml` answers like NVML from a shipped topology (tests, simulated
nodes), :mod:`~mpijob.agent.mps` runs the MPS control daemons, :mod:`~mpijob.agent.share`
computes and publishes the shares' node status, :mod:`~mpijob.agent.publish` is the one module
that talks to the API, and :mod:`~mpijob.agent.main` is the CLI loop.
:mod:`~mpijob.agent.podresources` reads what the kubelet's pod-resources API says each
container holds (a gRPC client, stubs generated in :mod:`~mpijob.agent.podresources_v1`) and
compares it with the placement; :mod:`~mpijob.agent.gpu_actual` is the loop's step that turns a
mismatch into the ``mpijob.io/gpu-actual`` annotation, a metric and an Event on the MPIJob.
:mod:`~mpijob.agent.csi` is the CSI node service ``mps.mpijob.io`` that shows a placed share pod
its own GPU's MPS pipe directory (stubs in :mod:`~mpijob.agent.csi_v1` and
:mod:`~mpijob.agent.pluginregistration_v1`), served to the kubelet by
:mod:`~mpijob.agent.csi_server` (``mpijob-agent-csi``).
"""
