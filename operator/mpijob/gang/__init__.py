"""Gang admission: our own all-or-nothing admission of topology-placed jobs, as pure decisions.

* :mod:`queue` orders waiting jobs fairly and decides which are admitted, wait or time out;
  :mod:`timeout` gives their deadlines.
* :mod:`topology` translates between Kubernetes objects and the placement engine: what a job
  asks for, which GPUs of which nodes are taken, and the decision recorded on the MPIJob.
* :mod:`outcome` turns a decision into the conditions and Event the status function applies.
* :mod:`decide` is one admission pass's decision, from a snapshot of the caches;
  :mod:`gate` is where a job stands as its reconcile plans it: the release of a decision it no
  longer needs and the giving back of a placement that no longer holds, as actions.
* :mod:`quota` checks a job against its namespace's GPU quotas before it is admitted; :mod:`kueue`
  words the wait of a job Kueue admitted but our placement cannot place yet.

Its I/O shell is :mod:`mpijob.gang.service`; the rest imports the builders, placement and api,
never kopf, aiohttp or the kubernetes client.
"""
