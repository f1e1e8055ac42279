"""What the handlers share for the life of the process, one object per concern.

- :class:`~mpijob.handlers.cache.Cache`: the indices, expectations and our last status write;
- :class:`~mpijob.platform.workers.Workers`: the work queue, its workers and the leader gate;
- :class:`JobMetrics`: the little state the job-level gauges and histograms need;
- the API adapter, the Event recorder, the deferred patches and the admission loop.

Built by the composition root (:mod:`mpijob.handlers.startup`) and kept in Kopf's memo
(:class:`OperatorMemo`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kopf

from mpijob import metrics
from mpijob.api import JobKey
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.gang.service import Admission
from mpijob.handlers.cache import Cache
from mpijob.placement.fabric import Fabric
from mpijob.platform.deferred import DeferredPatches
from mpijob.platform.kube_api import KubeApi
from mpijob.platform.recorder import Recorder
from mpijob.platform.workers import Workers
from mpijob.settings import OperatorSettings


@dataclass
class JobMetrics:
    """Jobs whose Running condition is True (the gauge), and jobs whose creation-to-bound time
    was observed already (the histogram counts each job once)."""

    running: set[JobKey] = field(default_factory=set)
    bound: set[JobKey] = field(default_factory=set)

    def set_running(self, key: JobKey, running: bool) -> None:
        if running:
            self.running.add(key)
        else:
            self.running.discard(key)
        metrics.JOBS_RUNNING.set(len(self.running))

    def forget(self, key: JobKey) -> None:
        self.bound.discard(key)
        self.set_running(key, False)


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: KubeApi
    recorder: Recorder
    deferred: DeferredPatches
    workers: Workers
    cache: Cache = field(default_factory=Cache)
    job_metrics: JobMetrics = field(default_factory=JobMetrics)
    admission: Admission | None = None
    gpu_binding: GpuBinding = GpuBinding.ANNOTATIONS
    """How placed workers get their GPUs, chosen once at startup (``--gpu-binding``)."""
    reported_actual: dict[str, str] = field(default_factory=dict)
    """Pod uid -> the ``mpijob.io/gpu-actual`` last counted (only pods the agent flagged)."""

    def forget(self, key: JobKey) -> None:
        """Drop every memory of a deleted job."""
        self.cache.forget(key)
        self.job_metrics.forget(key)
        if self.admission is not None:
            self.admission.drop(key)


class OperatorMemo(kopf.Memo):
    """Kopf's memo, made complete by the composition root (:func:`mpijob.handlers.startup.main`)
    before Kopf starts. Every handler receives it (a shallow copy per object)."""

    settings: OperatorSettings
    gpu_binding: GpuBinding
    fabric: Fabric | None
    runtime: Runtime
