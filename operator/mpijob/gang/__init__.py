"""Gang scheduling: PodGroups for Volcano and scheduler-plugins, and our own admission. Pure.

* :mod:`mode` parses ``--gang-scheduling``.
* :mod:`podgroup` builds and compares PodGroups and decorates pods (with the WaitForWorkersReady
  quorum fix); :mod:`min_resources` and :mod:`quantity` compute ``minResources``.
* :mod:`admission` orders waiting jobs and decides which are admitted when no gang scheduler runs;
  :mod:`timeout` gives their deadlines; :mod:`outcome` turns decisions into conditions and Events.
* :mod:`binding` measures creation-to-bound time for the histogram.

Called by the reconciler and the builders' callers; imports api, build's names and events, never
kopf or the kubernetes client.
"""
