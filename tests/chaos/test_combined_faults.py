"""Every fault at once, briefly (tests/chaos/combined.py says what is measured and how; its
`__main__` runs it for longer, for the figures in docs/design/fencing.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from tests.chaos.combined import combined_run

if TYPE_CHECKING:
    from pathlib import Path

SECONDS = 40.0


async def test_pauses_joins_kills_and_late_writes_leave_the_accounting_exact(
    nats_url: str, tmp_path: Path
) -> None:
    report = await combined_run(SECONDS, seed=11, tmp=tmp_path, nats_url=nats_url)
    shown = orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode()
    # The run did what it is for: faults of every kind, and moves both refused and carried out.
    assert set(report.faults) == {"pause", "kill", "join", "late"}, shown
    assert report.commits > 20, shown
    assert any(k.startswith("move:") and k != "move:ok" for k in report.answers), shown
    assert report.answered_twice == 0, shown
    assert report.commits_after_refusal == 0, shown
    assert report.unasked_commits == 0, shown
    assert report.late_sent_landed == 0, shown
    assert report.overcommitted_moments == 0, shown
    assert report.acknowledged_missing == 0, shown
    assert report.ledger_differs == [], shown
