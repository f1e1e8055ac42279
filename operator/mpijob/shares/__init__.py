"""GPU shares (``aliyun.com/gpu-mem`` and ``aliyun.com/gpu-core.percentage``), a pure core and
its shell.

Pure: :mod:`request` (what a pod asks for), :mod:`ledger` (which pod holds how much of which
GPU), :mod:`node_room` (a node's room for a pod's other requests), :mod:`pod_edits` (what a
placed share writes into a pod, and the webhook configurations). Shell: :mod:`service` (the
ledger behind its lock, fed by the watches), :mod:`webhook` (the share webhook's Kopf wiring,
its server and configurations), its certificate from :mod:`mpijob.platform.tls`.
"""
