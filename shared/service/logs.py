"""Structured logs: one JSON object per line (or readable text), fields passed via `extra`.

log.info("refit refused", extra={"pod": "ml/train", "code": "no_fit"})

Every line is bounded: a field or message longer than MAX_FIELD characters is cut (with its
length noted), so a flood of requests carrying megabytes of input cannot grow the log by more
than a bounded amount each. Services also cut what they echo; this is the safety net.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import argparse

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


MAX_FIELD = 1000
"""Characters kept of one log field (or the message); the rest is replaced by a note."""


def log_field(value: Any) -> Any:
    """`value` as a log line carries it: a string, or the repr of a container, longer than
    MAX_FIELD is cut with a note of its length; anything else as is. (The safety net for every
    field; what a service echoes of outside input it cuts itself, shorter and quoted.)"""
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return f"{value[:MAX_FIELD]}... ({len(value)} characters)"
    if isinstance(value, (dict, list, tuple)):
        text = repr(value)
        return log_field(text) if len(text) > MAX_FIELD else value
    return value


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: log_field(v)
        for k, v in vars(record).items()
        if k not in _STANDARD and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": log_field(record.getMessage()),
        }
        body.update(_fields(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{record.levelname.lower():<7} {record.name}: {log_field(record.getMessage())}"
        text = f"{line} {fields}" if fields else line
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


LOG_LEVELS = ("debug", "info", "warning", "error")
"""What every `--log-level` takes (any case: `INFO` is `info`)."""


def add_log_level_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    default: str = "info",
    help: str = "log level (default %(default)s)",
) -> None:
    """`--log-level`, the same for every numafit command: LOG_LEVELS, case-insensitive."""
    parser.add_argument(
        "--log-level",
        type=str.lower,
        default=default.lower(),
        choices=LOG_LEVELS,
        help=f"{help}; one of {', '.join(LOG_LEVELS)}, any case",
    )


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Library chatter stays at warning unless debugging.
    for noisy in ("aiohttp.access", "nats", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
