"""The ``--gang-scheduling`` flag, parsed once into a value the pure code can branch on.

As upstream: an empty value turns gang scheduling off, ``volcano`` selects Volcano's PodGroup
(``scheduling.volcano.sh/v1beta1``), and any other value selects scheduler-plugins'
Coscheduling PodGroup (``scheduling.x-k8s.io/v1alpha1``) with that value as the pods'
``schedulerName``. One value of our own, ``workload-api``, selects Kubernetes' own gang
scheduling: a Workload and a PodGroup of ``scheduling.k8s.io/v1beta1``, pods naming the group in
``spec.schedulingGroup`` and keeping their ``schedulerName`` (kube-scheduler's default profile
runs the GangScheduling plugin once ``GenericWorkload`` is on).

Built by the CLI; read by :mod:`mpijob.desired.podgroup` and the reconciler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mpijob import keys


class GangKind(enum.Enum):
    """Which PodGroup API a gang is expressed in, if any."""

    OFF = "off"
    VOLCANO = "volcano"
    SCHEDULER_PLUGINS = "scheduler-plugins"
    WORKLOAD_API = "workload-api"


@dataclass(frozen=True)
class GangMode:
    """The parsed ``--gang-scheduling`` flag."""

    kind: GangKind
    scheduler_name: str = ""
    """The ``schedulerName`` given to gang members; empty when gang scheduling is off, and with
    the Workload API, whose members keep their own."""

    @classmethod
    def from_flag(cls, value: str) -> GangMode:
        """Parse the flag's value exactly as upstream does."""
        if not value:
            return cls(GangKind.OFF)
        if value == keys.VOLCANO_SCHEDULER_NAME:
            return cls(GangKind.VOLCANO, keys.VOLCANO_SCHEDULER_NAME)
        if value == keys.WORKLOAD_GANG_FLAG:
            return cls(GangKind.WORKLOAD_API)
        return cls(GangKind.SCHEDULER_PLUGINS, value)

    @property
    def enabled(self) -> bool:
        """Whether PodGroups are created and pods decorated."""
        return self.kind is not GangKind.OFF

    @property
    def pod_group_api_version(self) -> str | None:
        """The PodGroup API to create and watch, or None when gang scheduling is off."""
        return _API_VERSIONS.get(self.kind)


_API_VERSIONS = {
    GangKind.VOLCANO: keys.VOLCANO_POD_GROUP_API_VERSION,
    GangKind.SCHEDULER_PLUGINS: keys.SCHED_PLUGINS_POD_GROUP_API_VERSION,
    GangKind.WORKLOAD_API: keys.WORKLOAD_API_VERSION,
}


OFF = GangMode(GangKind.OFF)
