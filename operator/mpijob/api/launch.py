"""How a job's ranks are launched: ``mpijob.io/launch`` (``sshd``, the default, or ``agent``).

``agent`` needs the image that carries the operator's launch agent (the operator's own, unless
``--launch-image`` names another); an operator that knows none refuses such a job, saying how to
give it one, rather than create pods that could never start. Pure; read by the handlers with
upstream's validation.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpijob import keys
from mpijob.api.errors import FieldError, not_supported, required

VALUES = (keys.LAUNCH_SSHD, keys.LAUNCH_AGENT)
PATH = f"metadata.annotations[{keys.LAUNCH}]"


def launch_errors(annotations: Mapping[str, str], launch_image: str) -> list[FieldError]:
    """What is wrong with the job's launch annotation, given the operator's launch image."""
    value = annotations.get(keys.LAUNCH)
    if value is None or value == keys.LAUNCH_SSHD:
        return []
    if value != keys.LAUNCH_AGENT:
        return [not_supported(PATH, value, VALUES)]
    if not launch_image:
        return [
            required(
                PATH,
                "the operator knows no image holding its launch agent: run it in its Deployment "
                "(it uses its own image) or start it with --launch-image, or remove the "
                "annotation to launch through sshd",
            )
        ]
    return []
