"""The benchmarks (``make bench*``).

The operator they start runs from this tree. Its image ships compiled bytecode
(hack/operator_image.py, ``COMPILE``); here the package's bytecode is compiled once, on import,
so that an environment that forbids writing it (``PYTHONDONTWRITEBYTECODE``, as the image sets)
does not make every start of the operator compile the package from source, a cost the deployed
operator does not pay. Sources edited later are noticed by their modification time and compiled
in memory, as Python always does.
"""

import compileall
from pathlib import Path

compileall.compile_dir(Path(__file__).resolve().parent.parent / "operator", quiet=1)
