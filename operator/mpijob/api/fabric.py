"""A job's fabric level: which domain of the fabric must (or should) hold all its workers.

Read from the MPIJob's annotations ``mpijob.io/fabric-required-level`` or
``mpijob.io/fabric-preferred-level`` (one, not both). The value is a level name of the
operator's fabric (for example ``clique``, ``leaf``, ``block``) or ``node``; the fabric's names
come from the caller, since the API layer does not see placement. Errors name the annotation and
the values that would do. Pure; read by the handlers before placing a job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mpijob import keys
from mpijob.api.errors import FieldError, forbidden, not_supported, required


@dataclass(frozen=True)
class FabricLevel:
    """The level a job asked for and how firmly."""

    level: str
    required: bool
    """True: the job waits rather than span the level; False: it spans when it must."""


def _path(key: str) -> str:
    return f"metadata.annotations[{key}]"


def fabric_level(
    annotations: Mapping[str, str], levels: Sequence[str]
) -> tuple[FabricLevel | None, list[FieldError]]:
    """The job's level (None when it names none) and what is wrong with the annotations."""
    asked = {
        key: annotations[key]
        for key in (keys.FABRIC_REQUIRED_LEVEL, keys.FABRIC_PREFERRED_LEVEL)
        if key in annotations
    }
    if len(asked) == 2:
        detail = (
            f"set only one of {keys.FABRIC_REQUIRED_LEVEL} (wait for one domain) and "
            f"{keys.FABRIC_PREFERRED_LEVEL} (span domains when none has room)"
        )
        return None, [forbidden(_path(keys.FABRIC_PREFERRED_LEVEL), detail)]
    if not asked:
        return None, []
    ((key, value),) = asked.items()
    if not value:
        known = ", ".join(levels)
        return None, [required(_path(key), f"name a fabric level, one of: {known}")]
    if value not in levels:
        return None, [not_supported(_path(key), value, levels)]
    return FabricLevel(value, key == keys.FABRIC_REQUIRED_LEVEL), []
