"""The node annotation: compact, versioned, lossless, and strict about bad input."""

from __future__ import annotations

import json

import pytest

from mpijob.placement import codec, topologies

pytestmark = pytest.mark.unit

RTX8000_JSON = (
    '{"v":1,"name":"rtx8000-4x","nvlink":2,"pcie":3,'
    '"gpus":[{"numa":0},{"numa":0},{"numa":1},{"numa":1}],'
    '"links":["NODE","SYS","NV2:SYS","NV2:SYS","SYS","NODE"]}'
)


@pytest.mark.parametrize("name", topologies.NAMES)
def test_round_trip_with_identities(name: str) -> None:
    topology = topologies.for_node(name, "node-7")
    text = codec.dumps(topology)
    assert codec.loads(text) == topology
    assert len(text) < 3000


def test_shape_is_stable() -> None:
    assert codec.dumps(topologies.load("rtx8000-4x")) == RTX8000_JSON
    dgx2 = json.loads(codec.dumps(topologies.load("dgx2")))
    assert dgx2["links"][0] == "NS6:PIX"
    assert len(dgx2["links"]) == 120


def test_loads_is_cached_per_text() -> None:
    assert codec.loads(RTX8000_JSON) is codec.loads(RTX8000_JSON)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1]", "expected a JSON object, got list"),
        ('{"v":2}', "unsupported version 2"),
        ('{"v":1,"gpus":[],"links":[]}', "name: Field required"),
        ('{"v":1,"name":"x","gpus":[{"uuid":1}],"links":[]}', r"gpus\[0\].uuid"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":[]}', "2 GPUs need 1 links, found 0"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":["NV2PIX"]}', r"\(0, 1\): unknown code"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":["NV2:"]}', "unknown code 'NV2:'"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":[""]}', "unknown code ''"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":["NV2"]}', "NVLink generation is unknown"),
        ('{"v":1,"name":"x","gpus":[{},{}],"links":["SYS"],"extra":1}', "extra: Extra inputs"),
    ],
)
def test_bad_annotations_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        codec.loads(text)
    assert str(caught.value).startswith("mpijob.io/gpu-topology: ")
