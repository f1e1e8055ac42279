"""Helpers shared by the test suites.

Unit tests: :mod:`support.jobs` (``body``: the one MPIJob factory; ``parsed``; ``gpu_template``),
:mod:`support.desired_jobs` and :mod:`support.gang_jobs` (the builder and gang tests' jobs, on
``body``), :mod:`support.console_objects`, :mod:`support.fake_kube` (``FakeKube``: the API in
memory, typed as the adapter's Protocol ``mpijob.platform.kube_api.KubeApi``),
:mod:`support.virtual_time` (``@virtual_time`` for asyncio tests that wait; ``FakeClock`` and
``LoopClock`` for code that is given a clock), :mod:`support.fake_kubelet` (the kubelet's
pod-resources API).

Integration tests: cluster access, waiting on state, the operator process, tenants, Kueue,
real nodes, upstream's e2e suite.
"""
