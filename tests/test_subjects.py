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


def test_an_accounting_subject_carries_the_nodes_slot_before_its_token() -> None:
    from shared.core.partitions import fnv1a_32

    subject = subjects.accounting("pending", "gpu.node-7")
    slot = fnv1a_32(b"gpu.node-7") % 256
    assert subject == f"numafit.accounting.v1.pending.{slot}.gpu_node-7"
    parsed = subjects.parse_accounting(subject)
    assert parsed == ("pending", slot, "gpu_node-7")
    assert parsed is not None and parsed.node == "gpu.node-7" and parsed.slot_matches()
    # The node token stays last: one permission line per operation and node.
    assert subject.rsplit(".", 1)[1] == subjects.node_token("gpu.node-7")


def test_a_slot_that_is_not_the_nodes_is_told_apart() -> None:
    from shared.core.partitions import slot_of

    wrong = (slot_of("node-1") + 1) % 256
    parsed = subjects.parse_accounting(f"numafit.accounting.v1.pending.{wrong}.node-1")
    assert parsed is not None and not parsed.slot_matches()
    # A token that names no node is left to the operation to refuse.
    odd = subjects.parse_accounting("numafit.accounting.v1.pending.3.BAD")
    assert odd is not None and odd.slot_matches()


@pytest.mark.parametrize(
    "subject",
    [
        "numafit.accounting.v1.pending.node-1",
        "numafit.accounting.v1.pending.256.node-1",
        "numafit.accounting.v1.pending.07.node-1",
        "numafit.accounting.v1.pending.x.node-1",
        "numafit.accounting.v1.pending.1.node-1.extra",
        "numafit.refit.v1.node-1",
    ],
)
def test_what_is_not_an_accounting_subject_is_none(subject: str) -> None:
    assert subjects.parse_accounting(subject) is None


def test_every_node_of_a_partition_is_asked_on_one_of_its_slots() -> None:
    assert subjects.accounting("snapshot", subjects.ALL_NODES) == subjects.accounting_all(0)
    assert subjects.accounting_all(5) == "numafit.accounting.v1.snapshot.5._all"
    assert subjects.accounting_slot(5) == "numafit.accounting.v1.*.5.*"
    with pytest.raises(ValueError, match="slot"):
        subjects.accounting_all(256)
    with pytest.raises(ValueError, match="every node"):
        subjects.accounting("pending", subjects.ALL_NODES)
