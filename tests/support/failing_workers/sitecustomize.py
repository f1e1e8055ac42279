"""Test-only, on the ``PYTHONPATH`` of one operator process of a test (never shipped): Python
imports ``sitecustomize`` at start-up, before ``python -m mpijob`` runs.

With ``MPIJOB_TEST_FAIL_WORKERS`` set, the reconcile workers (the runnable the manager starts
once this replica leads) run as usual until the process gets SIGUSR1; then their task raises,
as a bug in them would. No production code has a hook for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

if os.environ.get("MPIJOB_TEST_FAIL_WORKERS"):
    from mpijob.platform import workers

    serve = workers.Workers.serve

    async def serve_until_signalled(self: workers.Workers, reconcile: Any) -> None:
        signalled = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, signalled.set)
        real = asyncio.ensure_future(serve(self, reconcile))
        try:
            await signalled.wait()
        finally:
            real.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await real
        raise RuntimeError("the reconcile workers failed (the test's injected bug)")

    workers.Workers.serve = serve_until_signalled  # type: ignore[method-assign]
