"""Pure builders of an MPIJob's children (plain dicts) and upstream's status rules.

No I/O, no clock: the reconcile loop passes ``now`` and observed children in and applies what
comes back. Modules: :mod:`names`, :mod:`service`, :mod:`config_map`, :mod:`ssh`,
:mod:`worker`, :mod:`launcher`, :mod:`status` (with :mod:`events` and :mod:`observed`).
"""
