"""The one table of watched kinds (``WATCHED``): every registration is made from its rows."""

from __future__ import annotations

import kopf
import pytest

from mpijob.handlers import watches
from mpijob.handlers.cache import Index
from mpijob.handlers.watches import WATCHED, Mode, Source

pytestmark = pytest.mark.unit


def test_every_index_is_filled_by_exactly_one_row() -> None:
    assert set(WATCHED) == set(Index)
    assert all(index is row.index for index, row in WATCHED.items())


def test_each_row_names_what_its_source_needs() -> None:
    for row in WATCHED.values():
        if row.source is Source.INFORMER:
            assert row.handle is not None, row.index
            assert row.index_fn is None, row.index
            assert row.on_event is None, row.index
        else:
            assert row.index_fn is not None, row.index
            assert row.handle is None, row.index
        assert row.filed_by, row.index
        assert row.triggers, row.index


@pytest.mark.parametrize("dra", [False, True])
def test_the_informers_are_the_informer_rows_of_the_mode(dra: bool) -> None:
    informed = watches.informed(dra=dra)
    assert Index.PODS in informed
    assert (Index.CLAIMS in informed) is dra
    assert (Index.SLICES_BY_NODE in informed) is dra
    assert not {i for i in informed if WATCHED[i].source is Source.KOPF}


def _kopf_indices(registry: kopf.OperatorRegistry) -> set[str]:
    return {str(h.id) for h in registry._indexing.get_all_handlers()}


@pytest.mark.parametrize(
    ("gang", "dra"), [(None, False), ("scheduling.x-k8s.io/v1alpha1", False), (None, True)]
)
def test_kopf_gets_the_kopf_rows_of_the_mode(gang: str | None, dra: bool) -> None:
    registry = kopf.OperatorRegistry()
    watches.register(registry, gang_api_version=gang, dra=dra)
    wanted = {
        row.index.value
        for row in WATCHED.values()
        if row.source is Source.KOPF
        and (
            row.mode is Mode.ALWAYS
            or (row.mode is Mode.DRA and dra)
            or (row.mode is Mode.GANG and bool(gang))
        )
    }
    assert _kopf_indices(registry) == wanted
    # The MPIJob is reached through Kopf's handlers, as a Kopf user looks for it.
    assert Index.MPIJOBS_BY_KEY.value in wanted
    assert WATCHED[Index.MPIJOBS_BY_KEY].index_fn is watches.mpijobs_by_key
    assert WATCHED[Index.MPIJOBS_BY_KEY].on_event is watches.mpijob_deleted
    assert (Index.PODGROUPS_BY_JOB.value in wanted) is bool(gang)
    assert (Index.GPU_CLASSES_BY_NAME.value in wanted) is dra


def test_the_docs_table_is_the_rows() -> None:
    from docs import generate_watches  # type: ignore[import-not-found]

    page = generate_watches.OUTPUT.read_text()
    assert generate_watches.render(page) == page, "docs/informers.md is stale: make reference"
