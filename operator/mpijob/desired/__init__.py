"""Pure: an MPIJob model and what the caches observed in, the desired children, PodGroups and
status out.

No I/O, no clock: the reconciler passes ``now`` and the observation, and applies the plan that
comes back. Children: :mod:`names`, :mod:`service`, :mod:`config_map`, :mod:`ssh`,
:mod:`worker`, :mod:`launcher` (with :mod:`template`); gang scheduling: :mod:`gang_mode` (the
``--gang-scheduling`` flag), :mod:`podgroup` (PodGroups and pod decoration, with
:mod:`min_resources`); GPU binding: :mod:`gpu_binding` (the
``--gpu-binding`` flag and its mode), :mod:`claims` (a placed worker's ResourceClaim and the pod
that uses it); the sync: :mod:`observed` (what was seen), :mod:`sync` (the plan), :mod:`status`
(the one status function, with :mod:`conditions` and :mod:`events`); :mod:`binding`
(creation-to-bound time for the histogram). What a placed GPU share writes into a pod is
:mod:`mpijob.shares.pod_edits`.
"""
