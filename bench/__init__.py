"""The benchmarks (``make bench*``).

The operator they start runs from this tree, as its image runs it:

- Its image ships compiled bytecode (hack/operator_image.py, ``COMPILE``); here the package's
  bytecode is compiled once, on import, so that an environment that forbids writing it
  (``PYTHONDONTWRITEBYTECODE``, as the image sets) does not make every start of the operator
  compile the package from source, a cost the deployed operator does not pay. Sources edited
  later are noticed by their modification time and compiled in memory, as Python always does.
- Every process of ours a benchmark starts gets the image's environment (:func:`ours_env`)
  over the benchmark's own: how Python writes bytecode and where OpenSSL finds its CAs change
  what a start costs. Only ours: the builds and the peers keep the machine's.
"""

import compileall
import os
from pathlib import Path

from hack.operator_image import CONFIG

compileall.compile_dir(Path(__file__).resolve().parent.parent / "operator", quiet=1)

IMAGE_ENV = {
    name: value
    for name, value in (pair.split("=", 1) for pair in CONFIG["Env"])
    if name != "PATH"  # the virtualenv's, in the image; here this one's
}
"""The variables the operator's image sets, but ``PATH``."""


def ours_env(**extra: str) -> dict[str, str]:
    """The environment of an operator process of ours: this process's, the image's variables
    over it, then ``extra``."""
    return {**os.environ, **IMAGE_ENV, **extra}
