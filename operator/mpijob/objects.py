"""The one name for a Kubernetes object, or any part of one, as JSON decodes it.

Dependency-free, so the agent and the console share it with the operator without loading what
the operator loads.
"""

from typing import Any

JSON = dict[str, Any]
