"""What the handlers share for the life of the process, one object per concern.

- :class:`~mpijob.handlers.cache.Cache`: the indices, expectations and our last status write;
- :class:`~mpijob.platform.workers.Workers`: the work queue, its workers and the leader gate;
- :class:`JobMetrics`: the little state the job-level gauges and histograms need;
- :class:`~mpijob.desired.life.Lives`: what was counted and announced of each job's life;
- the API adapter, the Event recorder, the deferred patches and the admission loop.

Built by the composition root (:mod:`mpijob.handlers.startup`) and kept in Kopf's memo
(:class:`OperatorMemo`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import kopf

from mpijob import keys, metrics
from mpijob.api import JobKey
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.desired.life import Lives
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
    """Jobs whose Running condition is True (the gauge), the GPUs finished jobs' workers hold
    (the gauge), and jobs whose creation-to-bound, -workers-Ready and -launcher-running times
    were observed already (each histogram counts each job once)."""

    running: set[JobKey] = field(default_factory=set)
    bound: set[JobKey] = field(default_factory=set)
    workers_ready: set[JobKey] = field(default_factory=set)
    launcher_running: set[JobKey] = field(default_factory=set)
    gpus_held: dict[JobKey, int] = field(default_factory=dict)

    def set_gpus_held(self, key: JobKey, gpus: int) -> None:
        if gpus:
            self.gpus_held[key] = gpus
        else:
            self.gpus_held.pop(key, None)
        metrics.FINISHED_JOBS_GPUS_HELD.set(sum(self.gpus_held.values()))

    def set_running(self, key: JobKey, running: bool) -> None:
        if running:
            self.running.add(key)
        else:
            self.running.discard(key)
        metrics.JOBS_RUNNING.set(len(self.running))

    def forget(self, key: JobKey) -> None:
        self.bound.discard(key)
        self.workers_ready.discard(key)
        self.launcher_running.discard(key)
        self.set_running(key, False)
        self.set_gpus_held(key, 0)
        # Upstream's series stays for the job's life only: a series per job ever run would grow
        # the scrape without end.
        namespace, name = key
        with contextlib.suppress(KeyError):
            metrics.JOB_INFO.remove(name + keys.LAUNCHER_SUFFIX, namespace)


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: KubeApi
    recorder: Recorder
    deferred: DeferredPatches
    workers: Workers
    cache: Cache = field(default_factory=Cache)
    job_metrics: JobMetrics = field(default_factory=JobMetrics)
    lives: Lives = field(default_factory=Lives)
    """What was counted and announced of each live job's life (:mod:`mpijob.desired.life`)."""
    admission: Admission | None = None
    gpu_binding: GpuBinding = GpuBinding.ANNOTATIONS
    """How placed workers get their GPUs, chosen once at startup (``--gpu-binding``)."""
    reported_actual: dict[str, str] = field(default_factory=dict)
    """Pod uid -> the ``mpijob.io/gpu-actual`` last counted (only pods the agent flagged)."""

    def forget(self, key: JobKey) -> None:
        """Drop every memory of a deleted job, so a long-lived process holds what exists."""
        self.cache.forget(key)
        self.job_metrics.forget(key)
        self.lives.forget(key)
        self.recorder.forget(key)
        self.deferred.forget(key)
        if self.admission is not None:
            self.admission.drop(key)


class OperatorMemo(kopf.Memo):
    """Kopf's memo, made complete by the composition root (:func:`mpijob.handlers.startup.main`)
    before Kopf starts. Every handler receives it (a shallow copy per object)."""

    settings: OperatorSettings
    gpu_binding: GpuBinding
    fabric: Fabric | None
    runtime: Runtime
