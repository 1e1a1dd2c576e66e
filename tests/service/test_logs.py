"""Log lines stay bounded whatever a request carried (35,000 fuzzed requests once grew a log to
174 MB because refusals echoed their input)."""

from __future__ import annotations

import logging

import orjson

from shared.service.logs import MAX_FIELD, JsonFormatter, TextFormatter


def record(message: str, **fields: object) -> logging.LogRecord:
    rec = logging.LogRecord("numafit.test", logging.INFO, __file__, 1, message, None, None)
    for key, value in fields.items():
        setattr(rec, key, value)
    return rec


def test_json_lines_cut_long_fields_and_messages() -> None:
    huge = "x" * (1 << 20)
    line = JsonFormatter().format(
        record("refused " + huge, error=huge, names=[huge], code="invalid_request")
    )
    assert len(line) < 4 * MAX_FIELD + 500
    body = orjson.loads(line)
    assert body["code"] == "invalid_request"  # short fields untouched
    assert body["error"].endswith(f"({1 << 20} characters)")


def test_text_lines_cut_long_fields() -> None:
    huge = "y" * 100_000
    line = TextFormatter().format(record("refused", error=huge))
    assert len(line) < MAX_FIELD + 200
    assert "(100000 characters)" in line
