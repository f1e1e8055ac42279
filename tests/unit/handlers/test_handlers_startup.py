"""Start-up choices that change how Kopf runs: its watch streams' JSON decoding."""

from __future__ import annotations

import json

import pytest
from kopf._cogs.clients import api

from mpijob.handlers import startup

pytestmark = pytest.mark.unit


def test_kopfs_watch_lines_decode_through_orjson_to_the_same_objects() -> None:
    startup.decode_watch_events_with_orjson()
    line = '{"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "pi-worker-0"}}}'
    assert api.json is not json
    assert api.json.loads is startup._loads
    assert api.json.loads(line) == json.loads(line)
    assert api.json.loads('"\\ud800"') == "\ud800"  # orjson refuses a lone surrogate; json takes it
    assert api.json.dumps({"a": 1}) == json.dumps({"a": 1})
