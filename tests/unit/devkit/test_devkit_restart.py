"""A control-plane component of the local cluster that exits is started again, as a kubelet
restarts a static pod; stopping its loop stops it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hack import common

pytestmark = pytest.mark.unit


def test_a_component_that_exits_is_started_again_and_stops_with_its_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPIJOB_CLUSTER_DIR", str(tmp_path))
    state = common.State()
    common.start("flaky", ["sh", "-c", "echo started; exit 3"], state, restart=True)
    log = tmp_path / "logs" / "flaky.log"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and log.read_text().count("started") < 2:
        time.sleep(0.1)
    text = log.read_text()
    assert text.count("started") >= 2
    assert "[cluster] flaky exited with status 3; starting it again in 1 s" in text
    pid = state.pids["flaky"]
    assert common.alive(pid), "the loop, which the cluster's state names, stays"
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and common.alive(pid):
        time.sleep(0.05)
    assert not common.alive(pid)
    runs = log.read_text().count("started")
    time.sleep(1.5)
    assert log.read_text().count("started") == runs, "nothing started after the stop"
