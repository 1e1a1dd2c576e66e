"""`codec.only_entry_changed`: what accounting's move lets a refit change in a pod value."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shared.core import codec
from shared.core.model import ContainerDevice

WORKED = "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;"


@pytest.mark.parametrize(
    ("new", "index", "expected"),
    [
        (WORKED, 1, True),  # nothing changed at all
        ("GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;", 1, True),  # the target's piece
        ("GPU-b,NVIDIA,30000,60:;;", 1, True),  # the target blanked
        ("GPU-a,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;", 1, False),  # another piece
        ("GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;", 0, False),  # index 1 is not index 0
        ("GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:", 1, False),  # trailing ';' dropped
        ("GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;;", 1, False),  # a piece added
        ("GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:; ", 1, False),  # one byte elsewhere
        (WORKED, 7, True),  # an index past the value: every piece must be the same
        ("GPU-b,NVIDIA,30000,60:;GPU-c,NVIDIA,20000,30:;", 7, False),
    ],
)
def test_only_the_target_piece_may_change(new: str, index: int, expected: bool) -> None:
    assert codec.only_entry_changed(WORKED, new, index) is expected


def test_empty_values_have_one_piece() -> None:
    assert codec.only_entry_changed("", "GPU-a,NVIDIA,1,1:", 0)
    assert not codec.only_entry_changed("", ";", 0)


_uuid = st.text(alphabet="GPUabc-019 .", min_size=1)
_device = st.builds(
    ContainerDevice,
    uuid=_uuid,
    type=_uuid,
    usedmem=st.integers(0, 2**31 - 1),
    usedcores=st.integers(0, 100),
)
_entries = st.lists(st.lists(_device, min_size=1, max_size=3).map(tuple), min_size=1, max_size=5)


@given(_entries, st.data())
def test_a_rewrite_of_one_entry_changes_only_that_entry(
    entries: list[tuple[ContainerDevice, ...]], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(entries) - 1))
    new = data.draw(st.lists(_device, min_size=1, max_size=3).map(tuple))
    raw = codec.encode_pod(entries)
    rewritten = codec.rewrite_entry(raw, index, new)
    assert codec.only_entry_changed(raw, rewritten, index)
    assert codec.only_entry_changed(raw, codec.blank_entry(raw, index), index)


@given(_entries, st.data())
def test_a_rewrite_is_refused_for_any_other_index(
    entries: list[tuple[ContainerDevice, ...]], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(entries) - 1))
    other = data.draw(st.integers(0, len(entries)))
    new = data.draw(st.lists(_device, min_size=1, max_size=3).map(tuple))
    assume(other != index and new != entries[index])
    raw = codec.encode_pod(entries)
    assert not codec.only_entry_changed(raw, codec.rewrite_entry(raw, index, new), other)
