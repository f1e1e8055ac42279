"""Our own all-or-nothing admission of topology-placed jobs, as pure decisions.

* :mod:`queue` orders waiting jobs fairly and decides which are admitted, wait or time out;
  :mod:`timeout` gives their deadlines.
* :mod:`topology` translates between Kubernetes objects and the placement engine: what a job
  asks for, which GPUs of which nodes are taken, and the decision recorded on the MPIJob.
* :mod:`outcome` turns a decision into the conditions and Event the status function applies.
* :mod:`fractional` is the ledger of GPU shares (``aliyun.com/gpu-mem`` and
  ``aliyun.com/gpu-core.percentage``): which pod holds how much of which GPU.

Its I/O shell is :mod:`mpijob.handlers.admission`; it imports the builders, placement and api,
never kopf or the kubernetes client.
"""
