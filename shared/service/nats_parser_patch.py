"""nats-py's MSG/HMSG line parser, made to split arguments the way nats-server writes them.

Why this patch exists: nats-server separates the arguments of a MSG or HMSG line with spaces
and tabs only, so a subject token may hold any other byte, form feed (0x0c) and vertical tab
(0x0b) included, and any client allowed to publish on a subject a service subscribes to with a
wildcard can send one. nats-py's expressions split on bytes `\\s`, which matches those two as
well: the line does not parse, nats-py takes it for a protocol error and drops the connection,
with every request in flight on it. The expressions below split on space and tab only (nats-py's
group numbering kept), so such a message arrives whole and is refused like any other bad
subject.

It replaces module globals of `nats.protocol.parser` that nats-py reads at every parse. It was
written against nats-py 2.16.0, the version pyproject.toml pins: `apply` refuses to replace
expressions that are not exactly the ones it was written against, so an upgrade that changes
the parser fails loudly (at import, and in tests/service/test_nats_parser_patch.py) instead of
being silently undone or misapplied. On such an upgrade, check whether nats-py now splits as the
server does (then delete this module) or adapt both the expected and the replacing expressions.
"""

from __future__ import annotations

import re

from nats.protocol import parser

WRITTEN_AGAINST = "2.16.0"
"""The nats-py version whose parser this patch replaces (pinned in pyproject.toml)."""

UPSTREAM_MSG = b"\\AMSG\\s+([^\\s]+)\\s+([^\\s]+)\\s+(([^\\s]+)[^\\S\r\n]+)?(\\d+)\r\n"
UPSTREAM_HMSG = (
    b"\\AHMSG\\s+([^\\s]+)\\s+([^\\s]+)\\s+(([^\\s]+)[^\\S\r\n]+)?([\\d]+)\\s+(\\d+)\r\n"
)
"""The patterns of `parser.MSG_RE` and `parser.HMSG_RE` in nats-py 2.16.0: what is replaced."""

_SEP = rb"[ \t]+"
_ARG = rb"([^ \t\r\n]+)"
# Groups as nats-py numbers them: subject, sid, (reply + separator), reply, [header size,] size.
_REPLY = rb"(" + _ARG + _SEP + rb")?"
MSG_RE = re.compile(rb"\AMSG" + _SEP + _ARG + _SEP + _ARG + _SEP + _REPLY + rb"(\d+)\r\n")
HMSG_RE = re.compile(
    rb"\AHMSG" + _SEP + _ARG + _SEP + _ARG + _SEP + _REPLY + rb"(\d+)" + _SEP + rb"(\d+)\r\n"
)


class ParserChanged(RuntimeError):
    """nats-py's MSG/HMSG expressions are not those this patch was written against."""


def apply() -> None:
    """Make nats-py parse MSG/HMSG lines as nats-server writes them; idempotent."""
    if parser.MSG_RE is MSG_RE and parser.HMSG_RE is HMSG_RE:
        return
    if parser.MSG_RE.pattern != UPSTREAM_MSG or parser.HMSG_RE.pattern != UPSTREAM_HMSG:
        raise ParserChanged(
            f"nats-py's MSG/HMSG parser is not the one of nats-py {WRITTEN_AGAINST} that "
            "shared/service/nats_parser_patch.py replaces: review the patch before upgrading"
        )
    parser.MSG_RE = MSG_RE
    parser.HMSG_RE = HMSG_RE
