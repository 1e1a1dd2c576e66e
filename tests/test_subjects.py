"""`all_valid_names`: the filter's check of every candidate name, remembering the valid ones."""

from __future__ import annotations

import pytest

from shared import subjects


@pytest.fixture(autouse=True)
def forget() -> None:
    subjects._KNOWN_VALID.clear()


@pytest.mark.parametrize(
    "bad",
    ["a" * 5000, "A" * 254, "node 1", "bad\tname", "*", "node-1.>", "", "Node-1", "-node", 7, None],
)
def test_one_bad_name_makes_the_whole_list_invalid_and_is_never_remembered(bad: object) -> None:
    assert subjects.all_valid_names(["node-1", "node-2"])
    assert not subjects.all_valid_names(["node-1", bad, "node-2"])
    assert not subjects.all_valid_names([bad])  # asked again: still judged, not remembered
    assert bad not in subjects._KNOWN_VALID


def test_valid_names_are_remembered_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subjects, "KNOWN_VALID_LIMIT", 3)
    names = [f"gpu.node-{i}" for i in range(5)]
    assert subjects.all_valid_names(names)
    assert len(subjects._KNOWN_VALID) <= 3  # forgotten at once past the limit, learnt again
    assert subjects.all_valid_names(names)
    assert all(subjects.valid_name(n) for n in subjects._KNOWN_VALID)


def test_the_longest_valid_name_passes_and_one_more_character_does_not() -> None:
    longest = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert len(longest) == subjects.MAX_NAME_LENGTH
    assert subjects.all_valid_names([longest])
    assert not subjects.all_valid_names([longest + "c"])


def test_a_list_holding_something_unhashable_is_invalid() -> None:
    assert not subjects.all_valid_names(["node-1", ["node-2"]])


def test_an_iterator_of_names_is_read_once_and_judged_whole() -> None:
    assert subjects.all_valid_names(iter(["node-1", "node-2"]))
    assert not subjects.all_valid_names(iter(["node-3", "bad name"]))


def test_valid_names_keeps_the_valid_ones_in_order() -> None:
    assert subjects.valid_names(["node-2", "node-1"]) == ["node-2", "node-1"]
    assert subjects.valid_names(iter(["node-1", "bad name", "node-3", "*"])) == [
        "node-1",
        "node-3",
    ]
