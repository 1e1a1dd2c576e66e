"""The annotation codec against reference (c): encodings, every malformed form, rewrites."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shared.core import codec
from shared.core.errors import AnnotationError
from shared.core.model import ContainerDevice

WORKED = "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;"


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def test_worked_example_decodes_to_three_entries_with_trailing_empty() -> None:
    entries = codec.decode_pod(WORKED)
    assert entries == [(dev("GPU-b", 30000, 60),), (dev("GPU-a", 20000, 30),), ()]
    assert all(d.idx == -1 and d.slots == 0 for e in entries for d in e)


def test_encoder_terminates_every_device_and_entry() -> None:
    assert codec.encode_container([dev("GPU-a", 1, 2), dev("GPU-b", 3, 4)]) == (
        "GPU-a,NVIDIA,1,2:GPU-b,NVIDIA,3,4:"
    )
    assert codec.encode_container([]) == ""
    assert codec.encode_pod([[], [dev("GPU-a", 1, 2)], []]) == ";GPU-a,NVIDIA,1,2:;;"


def test_empty_entries_are_kept_positionally() -> None:
    # HAMi #2899: dropping an empty init slot would shift every app container.
    entries = codec.decode_pod(";;GPU-a,NVIDIA,5,0:;")
    assert [len(e) for e in entries] == [0, 0, 1, 0]


def test_decoder_skips_empty_device_segments_and_ignores_extra_fields() -> None:
    assert codec.decode_container("::GPU-a,NVIDIA,1,2,extra,more::") == (dev("GPU-a", 1, 2),)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("GPU-a:", "no ',' separated fields"),
        ("GPU-a,NVIDIA,1:", "has 3 fields, needs 4"),
        (",NVIDIA,1,2:", "empty UUID"),
        ("GPU-a,,1,2:", "empty type"),
        ("GPU-a,NVIDIA,x,2:", "memory 'x' is not an integer"),
        ("GPU-a,NVIDIA,1,2.5:", "cores '2.5' is not an integer"),
        ("GPU-a,NVIDIA,-1,2:", "memory '-1' is negative"),
        ("GPU-a,NVIDIA,1,-2:", "cores '-2' is negative"),
        ("GPU-a,NVIDIA,2147483648,2:", "overflows int32"),
        ("GPU-a,NVIDIA, 1,2:", "is not an integer"),
        ("GPU-a,NVIDIA,1_000,2:", "is not an integer"),
        ("GPU-a,NVIDIA,,2:", "is not an integer"),
    ],
)
def test_decoder_rejects_every_malformed_form(text: str, fragment: str) -> None:
    with pytest.raises(AnnotationError, match=fragment.replace(".", r"\.")):
        codec.decode_container(text)
    with pytest.raises(AnnotationError):
        codec.decode_pod(f";{text};")


def test_decoder_accepts_go_style_sign_and_int32_max() -> None:
    assert codec.decode_container("GPU-a,NVIDIA,+5,2147483647:") == (dev("GPU-a", 5, 2147483647),)


def test_rewrite_replaces_only_the_target_piece() -> None:
    assert codec.rewrite_entry(WORKED, 1, [dev("GPU-b", 20000, 30)]) == (
        "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
    )
    assert codec.rewrite_entry(";GPU-a,NVIDIA,20000,30:;", 1, [dev("GPU-b", 20000, 30)]) == (
        ";GPU-b,NVIDIA,20000,30:;"
    )


def test_rewrite_keeps_odd_bytes_of_other_entries() -> None:
    raw = "GPU-x,NVIDIA,1,2,extra:;GPU-a,NVIDIA,5,5:;;"
    assert codec.rewrite_entry(raw, 1, [dev("GPU-b", 5, 5)]) == (
        "GPU-x,NVIDIA,1,2,extra:;GPU-b,NVIDIA,5,5:;;"
    )


@pytest.mark.parametrize(("raw", "index"), [(";GPU-a,NVIDIA,1,1:;", 0), ("A,NVIDIA,1,1:;", 5)])
def test_rewrite_refuses_blank_or_missing_targets(raw: str, index: int) -> None:
    with pytest.raises(AnnotationError):
        codec.rewrite_entry(raw, index, [dev("GPU-b", 1, 1)])


def test_blank_entry_keeps_the_separator_layout() -> None:
    assert codec.blank_entry(WORKED, 0) == ";GPU-a,NVIDIA,20000,30:;"


@pytest.mark.parametrize(
    ("device_id", "physical"),
    [
        ("GPU-12345678-1234-1234-1234-123456789abc-3", "GPU-12345678-1234-1234-1234-123456789abc"),
        ("GPU-12345678-1234-1234-1234-123456789abc", "GPU-12345678-1234-1234-1234-123456789abc"),
        ("GPU-a::4", "GPU-a"),
        ("MIG-abc[1g.10gb]", "MIG-abc"),
        ("GPU-a-3", "GPU-a-3"),  # HAMi's rule alone: not six dashes
        (
            "GPU-12345678-1234-1234-1234-123456789abc-x",
            "GPU-12345678-1234-1234-1234-123456789abc-x",
        ),
    ],
)
def test_physical_id_follows_hami(device_id: str, physical: str) -> None:
    assert codec.physical_id(device_id) == physical


def test_physical_id_knows_the_plugins_own_short_uuids() -> None:
    assert codec.physical_id("GPU-a-3", frozenset({"GPU-a"})) == "GPU-a"
    assert codec.physical_id("GPU-a-3", frozenset({"GPU-b"})) == "GPU-a-3"
    ids = ["GPU-b-0", "GPU-a-1", "GPU-b-2"]
    assert codec.unique_physical_ids(ids, frozenset({"GPU-a", "GPU-b"})) == ["GPU-b", "GPU-a"]


def test_register_json_and_legacy_forms() -> None:
    devices = codec.parse_register(
        '[{"id":"GPU-a","index":0,"count":10,"devmem":40000,"devcore":100,'
        '"type":"NVIDIA A100","numa":1,"mode":"hami-core","health":true,"customInfo":{}}]'
    )
    assert devices[0].id == "GPU-a" and devices[0].numa == 1 and devices[0].health
    legacy = codec.parse_register(
        "GPU-a,10,40000,100,NVIDIA A100,1,true:GPU-b,10,40000,100,NVIDIA A100,0,false,1,mig:"
    )
    assert [(d.id, d.numa, d.health, d.index, d.mode) for d in legacy] == [
        ("GPU-a", 1, True, 0, "hami-core"),
        ("GPU-b", 0, False, 1, "mig"),
    ]
    assert codec.parse_register(codec.encode_register(devices)) == devices


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[{", "not valid JSON"),
        ('{"id": 1}', "7/9-field"),
        ('[{"id":"a"}]', "lacks 'count'"),
        (
            '[{"id":"a","count":"10","devmem":1,"devcore":1,"type":"NVIDIA"}]',
            "'count' must be an integer",
        ),
        (
            '[{"id":"a","count":true,"devmem":1,"devcore":1,"type":"NVIDIA"}]',
            "'count' must be an integer",
        ),
        (
            '[{"id":"a","count":1,"devmem":1,"devcore":1,"type":"NVIDIA","health":"yes"}]',
            "'health' must be a bool",
        ),
        ('[{"id":"a","count":-1,"devmem":1,"devcore":1,"type":"NVIDIA"}]', "negative"),
        (
            '[{"id":"a","count":1,"devmem":1,"devcore":1,"type":"N"},{"id":"a","count":1,"devmem":1,"devcore":1,"type":"N"}]',
            "twice",
        ),
        ("[1]", "not an object"),
        ("GPU-a,10,x,100,NVIDIA,0,true", "GPU-a"),
    ],
)
def test_register_rejects_malformed_values(text: str, fragment: str) -> None:
    with pytest.raises(AnnotationError, match=fragment):
        codec.parse_register(text)


def test_uuid_lists_are_trimmed_and_empty_means_none() -> None:
    assert codec.parse_uuid_list(" GPU-a , ,GPU-b") == frozenset({"GPU-a", "GPU-b"})
    assert codec.parse_uuid_list("  ") == frozenset()
    assert codec.parse_uuid_list(None) == frozenset()


_uuid = st.text(
    alphabet=st.characters(blacklist_characters=",:;", blacklist_categories=["Cs"]), min_size=1
)
_device = st.builds(
    ContainerDevice,
    uuid=_uuid,
    type=_uuid,
    usedmem=st.integers(0, 2**31 - 1),
    usedcores=st.integers(0, 100),
)
_entries = st.lists(st.lists(_device, max_size=4).map(tuple), max_size=6)


@given(_entries)
def test_codec_round_trip(entries: list[tuple[ContainerDevice, ...]]) -> None:
    encoded = codec.encode_pod(entries)
    decoded = codec.decode_pod(encoded)
    assert decoded == [*entries, ()]  # the terminator yields HAMi's trailing empty entry
    assert codec.encode_pod(decoded[:-1]) == encoded


@given(_entries, st.data())
def test_rewrite_changes_exactly_one_piece(
    entries: list[tuple[ContainerDevice, ...]], data: st.DataObject
) -> None:
    filled = [i for i, e in enumerate(entries) if e]
    assume(filled)
    index = data.draw(st.sampled_from(filled))
    new = data.draw(st.lists(_device, min_size=1, max_size=3).map(tuple))
    raw = codec.encode_pod(entries)
    rewritten = codec.rewrite_entry(raw, index, new)
    expected = list(entries)
    expected[index] = new
    assert rewritten == codec.encode_pod(expected)


def test_a_decoded_value_is_the_callers_own_list() -> None:
    """Decodings are remembered; what a caller does with its list never reaches the next."""
    first = codec.decode_pod(WORKED)
    first[0] = ()
    first.append((dev("GPU-x", 1, 1),))
    assert codec.decode_pod(WORKED) == [(dev("GPU-b", 30000, 60),), (dev("GPU-a", 20000, 30),), ()]


def test_an_undecodable_value_is_refused_every_time() -> None:
    for _ in range(3):
        with pytest.raises(AnnotationError, match="needs 4"):
            codec.decode_pod("GPU-a,NVIDIA,1:;")


def test_values_longer_than_the_cache_takes_decode_alike() -> None:
    entry = "GPU-a,NVIDIA,100,1:"
    long_value = (entry * (codec.DECODED_CACHE_LENGTH // len(entry) + 1)) + ";"
    assert len(long_value) > codec.DECODED_CACHE_LENGTH
    decoded = codec.decode_pod(long_value)
    assert len(decoded) == 2 and len(decoded[0]) == codec.DECODED_CACHE_LENGTH // len(entry) + 1
    assert codec.decode_pod(long_value) == decoded
