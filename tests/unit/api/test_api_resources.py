"""One reading of our GPU-ids annotation, for the operator and the console."""

from __future__ import annotations

import pytest

from mpijob import api

pytestmark = pytest.mark.unit


def test_gpu_ids_skips_what_is_not_an_index() -> None:
    assert api.gpu_ids("0, 3,x,,7") == (0, 3, 7)
    assert api.gpu_ids(None) == ()
