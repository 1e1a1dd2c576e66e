"""numafit uses NATS as it is meant to be used (issue 23): no code reads meaning into the
server's error texts, and no service stores anything of its own on nats-py's objects."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING

from nats.aio.client import Client

from tests.builders import gpu, node
from tests.integration.harness import harness

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("shared", "svc_accounting", "svc_deviceplugin", "svc_refit", "svc_scheduler")
SERVER_TEXTS = re.compile(
    r"permissions? violation|authorization violation|maximum payload|slow consumer|"
    r"no responders|stale connection",
    re.IGNORECASE,
)
"""Error texts nats-server sends (-ERR lines) or nats-py builds from them."""


MATCHING = frozenset(
    {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "split"}
    | {"startswith", "endswith", "find", "rfind", "index", "count", "partition"}
)
"""Calls that match a text against a constant (regular expressions, string methods)."""


def matched_strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """String constants that text is matched against: compared (`==`, `in`), or given to a
    regular expression or a string method that searches. Log messages, help and docs are
    neither."""
    for found in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(found, ast.Compare):
            operands = [found.left, *found.comparators]
        elif (
            isinstance(found, ast.Call)
            and isinstance(found.func, ast.Attribute)
            and found.func.attr in MATCHING
        ):
            operands = [*found.args, found.func.value]
        for operand in operands:
            for constant in ast.walk(operand):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                    yield constant


def test_no_product_code_matches_the_servers_error_texts() -> None:
    """Behaviour never hangs on the wording of a server error (the answer relay matched
    "permissions violation for publish to ..." with a regular expression): a string, regular
    expression or comparison naming one is found here. Log messages, help and docs may
    mention them."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for constant in matched_strings(tree):
                if SERVER_TEXTS.search(str(constant.value)):
                    found.append(f"{path.relative_to(ROOT)}:{constant.lineno}: {constant.value!r}")
    assert found == []


async def test_nothing_of_numafit_is_stored_on_a_nats_client(nats_url: str, tmp_path: Path) -> None:
    """The running services' NATS clients carry exactly the attributes nats-py gives a client
    (its own, set in its constructor and while connecting): numafit keeps its state beside
    them (shared/service/natsconn.py), never on them."""
    nats_py = set(vars(Client()))
    objects = [("node", node("node-1", [gpu("GPU-a", 0)]))]
    async with harness(nats_url, tmp_path, objects) as h:
        assert h.accounting is not None and h.refit is not None
        await h.client.snapshot("node-1")
        clients = {"accounting": h.accounting.nc, "refit": h.refit.nc}
        extra = [
            f"{who}: {name}"
            for who, nc in clients.items()
            for name in sorted(set(vars(nc)) - nats_py)
        ]
    assert extra == []
