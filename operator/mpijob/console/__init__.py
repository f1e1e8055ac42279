"""The user CLI ``mpijob`` (also the kubectl plugin ``kubectl-mpijob``): submit, inspect, follow.

``main`` is the click shell; ``submit``, ``jobs``, ``render`` and ``topology`` are pure (bodies
in, data or rich renderables out); ``plot`` draws the NVLink picture; ``kube`` is the only module
that talks to the API server. Not to be confused with :mod:`mpijob.cli`, the operator's command.
"""
