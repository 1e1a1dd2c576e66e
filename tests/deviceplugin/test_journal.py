"""The consume journal on its own: what one run writes the next run reads; a file that cannot
be read is set aside with a log line, never a crash; the file is bounded and replaced whole."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
import pytest

from svc_deviceplugin.journal import (
    MAX_FILE_BYTES,
    ConsumeJournal,
    DeferredConsume,
    JournalFull,
)

if TYPE_CHECKING:
    from pathlib import Path

NODE = "node-1"


def record(uid: str = "uid-1", index: int = 0, gpu: str = "GPU-b") -> DeferredConsume:
    return DeferredConsume(
        pod_uid=uid,
        pod_namespace="ml",
        pod_name=f"pod-{uid}",
        container_index=index,
        container_name="main",
        devices=(gpu,),
        container_devices=f"{gpu},NVIDIA,20000,30:",
        deferred_at=1_700_000_000.5,
    )


def set_aside(directory: Path) -> list[Path]:
    return list(directory.glob("consume-journal.json.*.corrupt"))


async def test_what_one_run_keeps_the_next_one_replays(tmp_path: Path) -> None:
    path = tmp_path / "state" / "consume-journal.json"  # the directory is made when needed
    first = ConsumeJournal(path, NODE)
    assert first.load() == []  # no file yet: an empty journal
    assert await first.add(record("uid-1"))
    assert await first.add(record("uid-2", 1, "GPU-a"))
    assert await first.add(record("uid-1", 0, "GPU-a"))  # the same container: replaced
    assert len(first) == 2

    restarted = ConsumeJournal(path, NODE)
    assert restarted.load() == [record("uid-1", 0, "GPU-a"), record("uid-2", 1, "GPU-a")]
    assert restarted.indices("uid-2") == {1}
    assert await restarted.remove(("uid-1", 0))
    assert await restarted.remove(("uid-1", 0))  # already gone: nothing to do

    again = ConsumeJournal(path, NODE)
    assert again.load() == [record("uid-2", 1, "GPU-a")]
    # Replaced whole through a temporary file: nothing else is left beside it.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    written = orjson.loads(path.read_bytes())
    assert written["version"] == 1 and written["node"] == NODE
    assert written["entries"][0]["podUID"] == "uid-2"


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b'{"version": 1, "node": "node-1", "entries": [{"podUID": 3}]}',
        b'{"version": 2, "node": "node-1", "entries": []}',
        b'{"version": 1, "node": "another-node", "entries": []}',
    ],
    ids=["torn", "empty", "bad-entry", "newer-version", "other-node"],
)
async def test_an_unreadable_file_is_set_aside_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / "consume-journal.json"
    path.write_bytes(content)
    journal = ConsumeJournal(path, NODE)
    with caplog.at_level(logging.ERROR, logger="numafit.deviceplugin"):
        assert journal.load() == []
    assert journal.unreadable
    (line,) = [r for r in caplog.records if r.getMessage().startswith("consume journal")]
    assert line.getMessage() == "consume journal unreadable; starting with an empty journal"
    assert getattr(line, "path") == str(path)  # noqa: B009 - a structured log field
    (aside,) = set_aside(tmp_path)
    assert aside.read_bytes() == content  # kept for a person to look at
    # The journal works from there on.
    assert await journal.add(record())
    assert ConsumeJournal(path, NODE).load() == [record()]


async def test_an_oversized_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "consume-journal.json"
    path.write_bytes(b" " * (MAX_FILE_BYTES + 1))
    journal = ConsumeJournal(path, NODE)
    assert journal.load() == [] and journal.unreadable


async def test_the_journal_is_bounded(tmp_path: Path) -> None:
    journal = ConsumeJournal(tmp_path / "j.json", NODE, limit=2)
    await journal.add(record("uid-1"))
    await journal.add(record("uid-2"))
    with pytest.raises(JournalFull):
        await journal.add(record("uid-3"))
    assert len(journal) == 2
    assert await journal.add(record("uid-2", 0, "GPU-a"))  # a replacement takes no room


async def test_a_write_that_fails_keeps_the_record_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the state directory should be")
    journal = ConsumeJournal(blocker / "consume-journal.json", NODE)
    with caplog.at_level(logging.WARNING, logger="numafit.deviceplugin"):
        assert journal.load() == []  # said at start, not only at the first deferral
        assert not await journal.add(record())
    assert list(journal) == [record()]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("consume journal directory not usable") for m in messages)
    assert any(m.startswith("consume journal not written") for m in messages)


async def test_without_a_path_the_journal_is_in_memory(tmp_path: Path) -> None:
    journal = ConsumeJournal(None, NODE)
    assert journal.load() == []
    assert not await journal.add(record())  # kept, not durable
    assert journal.indices("uid-1") == {0}
