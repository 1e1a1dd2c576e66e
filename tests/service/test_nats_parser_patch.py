"""shared/service/nats_parser_patch.py: what it replaces is still what it was written against,
and with it a subject holding a form feed or a vertical tab arrives whole instead of dropping
the connection."""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from nats.protocol import parser
from packaging.requirements import Requirement

from shared.service import nats_parser_patch, natsconn

if TYPE_CHECKING:
    from types import ModuleType

    from nats.aio.msg import Msg

ROOT = Path(__file__).resolve().parents[2]


def pristine_parser() -> ModuleType:
    """A fresh copy of the installed nats-py's parser module, as nats-py ships it (the one
    nats-py runs has been patched at import)."""
    origin = parser.__spec__.origin if parser.__spec__ is not None else None
    assert origin is not None
    spec = importlib.util.spec_from_file_location("pristine_nats_parser", origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_parser_is_the_one_the_patch_replaces() -> None:
    """Fails on a nats-py upgrade that changes the MSG/HMSG expressions or stops reading them
    as module globals at each parse: review the patch then (its docstring says how)."""
    pristine = pristine_parser()
    assert pristine.MSG_RE.pattern == nats_parser_patch.UPSTREAM_MSG
    assert pristine.HMSG_RE.pattern == nats_parser_patch.UPSTREAM_HMSG
    assert {"MSG_RE", "HMSG_RE"} <= set(pristine.Parser.parse.__code__.co_names)
    assert importlib.metadata.version("nats-py") == nats_parser_patch.WRITTEN_AGAINST


def test_pyproject_pins_the_version_the_patch_was_written_against() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (nats_py,) = [
        Requirement(text) for text in project["dependencies"] if Requirement(text).name == "nats-py"
    ]
    assert [(s.operator, s.version) for s in nats_py.specifier] == [
        ("==", nats_parser_patch.WRITTEN_AGAINST)
    ]


def test_the_patch_is_applied_once_natsconn_is_imported() -> None:
    assert natsconn is not None  # imported above: the patch is applied
    assert parser.MSG_RE is nats_parser_patch.MSG_RE
    assert parser.HMSG_RE is nats_parser_patch.HMSG_RE
    nats_parser_patch.apply()  # again: nothing changes
    assert parser.MSG_RE is nats_parser_patch.MSG_RE


def test_the_patch_refuses_an_expression_it_was_not_written_against(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    changed = pristine_parser().MSG_RE.pattern.replace(b"\\s+", b" +", 1)
    monkeypatch.setattr(parser, "MSG_RE", re.compile(changed))
    with pytest.raises(nats_parser_patch.ParserChanged, match=re.escape("nats-py 2.16.0")):
        nats_parser_patch.apply()
    assert parser.MSG_RE.pattern == changed  # left alone


@pytest.mark.parametrize(
    ("line", "subject", "reply", "sizes"),
    [
        (b"MSG probe.a\x0cb 7 12\r\n", b"probe.a\x0cb", None, (b"12",)),
        (b"MSG probe.\x0b 7 _INBOX.r 12\r\n", b"probe.\x0b", b"_INBOX.r", (b"12",)),
        (b"HMSG probe.a\x0cb 7 _INBOX.r 12 20\r\n", b"probe.a\x0cb", b"_INBOX.r", (b"12", b"20")),
        (b"HMSG probe.\x0b\t7 12 20\r\n", b"probe.\x0b", None, (b"12", b"20")),
    ],
)
def test_the_patched_expressions_split_on_space_and_tab_only(
    line: bytes, subject: bytes, reply: bytes | None, sizes: tuple[bytes, ...]
) -> None:
    """nats-py's own expressions cut these subjects short (then fail on the sid, dropping the
    connection); the patch's take the whole subject, as nats-server wrote it."""
    headers = line.startswith(b"H")
    pristine = pristine_parser()
    theirs = (pristine.HMSG_RE if headers else pristine.MSG_RE).match(line)
    assert theirs is None or theirs.group(1, 2) != (subject, b"7")
    ours = (nats_parser_patch.HMSG_RE if headers else nats_parser_patch.MSG_RE).match(line)
    assert ours is not None and ours.end() == len(line)
    assert (ours.group(1), ours.group(2), ours.group(4), ours.groups()[4:]) == (
        subject,
        b"7",
        reply,
        sizes,
    )


def test_ordinary_lines_parse_as_nats_py_parses_them() -> None:
    pristine = pristine_parser()
    for line in (
        b"MSG numafit.refit.node-1 3 _INBOX.abc.1 128\r\n",
        b"MSG numafit.usage 12 0\r\n",
        b"HMSG numafit.refit.node-1 3 _INBOX.abc.1 22 128\r\n",
        b"HMSG numafit.usage 12 22 40\r\n",
    ):
        ours = nats_parser_patch.HMSG_RE if line.startswith(b"H") else nats_parser_patch.MSG_RE
        theirs = pristine.HMSG_RE if line.startswith(b"H") else pristine.MSG_RE
        theirs_match, ours_match = theirs.match(line), ours.match(line)
        assert theirs_match is not None and ours_match is not None
        assert ours_match.group(1, 2, 4, 5) == theirs_match.group(1, 2, 4, 5)
        assert ours_match.end() == theirs_match.end()


async def test_a_form_feed_subject_arrives_whole_and_the_connection_stays(nats_url: str) -> None:
    connection = await natsconn.connect(nats_url, "parser-probe")
    nc = connection.client
    received: asyncio.Queue[Msg] = asyncio.Queue()

    async def got(msg: Msg) -> None:
        await received.put(msg)

    try:
        await nc.subscribe("probe.*", cb=got)
        await nc.flush()
        await nc.publish("probe.a\x0cb", b"hostile")
        await nc.publish("probe.ok", b"ordinary")
        async with asyncio.timeout(5):
            first, second = await received.get(), await received.get()
        assert (first.subject, first.data) == ("probe.a\x0cb", b"hostile")
        assert (second.subject, second.data) == ("probe.ok", b"ordinary")
        assert nc.is_connected
    finally:
        await connection.close()
