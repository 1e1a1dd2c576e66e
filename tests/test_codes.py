"""shared.codes: one enum holds every reply code the services send."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shared import codes
from shared.codes import Code
from shared.core import refit as core_refit
from tests.design import DESIGN_REFIT_CODES

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]

REFUSING_CALLS = {"Refused", "SnapshotRefused", "_refusal", "from_accounting"}
"""Calls whose first argument is a reply code (svc_accounting, svc_refit)."""


def _sources() -> Iterator[Path]:
    for pattern in ("svc_*/**/*.py", "shared/**/*.py"):
        yield from sorted(ROOT.glob(pattern))


def _is_code_expression(node: ast.expr) -> bool:
    """`code`, `result`, or `<something>.get("code")`."""
    if isinstance(node, ast.Name):
        return node.id in {"code", "result"}
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "code"
    )


def _strings(node: ast.expr) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value


def codes_in_sources() -> dict[str, str]:
    """Every reply code used in the services and shared/: the first argument of a refusal, a
    `"code": ...` literal, a comparison with a reply's code, the scheduler's RETRY_CODES, and
    every `Code.NAME`; each with one place it was found."""
    found: dict[str, str] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            for text in _codes_at(node):
                found.setdefault(text, f"{where}:{getattr(node, 'lineno', '?')}")
    return found


def _codes_at(node: ast.AST) -> list[str]:
    """The reply codes one syntax node names (most name none)."""
    if isinstance(node, ast.Call):
        return _refusal_codes(node)
    if isinstance(node, ast.Dict):
        return _code_literals(node)
    if isinstance(node, ast.Compare):
        return _compared_codes(node)
    if isinstance(node, ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == "RETRY_CODES" for t in node.targets):
            return list(_strings(node.value))
        return []
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Code"
        and node.attr.isupper()
    ):
        # `Code.NO_FIT` (shared.codes or the core's): its value, or the name itself when no
        # member has it.
        member = Code.__members__.get(node.attr)
        return [member.value if member is not None else f"Code.{node.attr}"]
    return []


def _refusal_codes(call: ast.Call) -> list[str]:
    """A string first argument of a refusing call."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name not in REFUSING_CALLS or not call.args:
        return []
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return [first.value]
    return []


def _code_literals(node: ast.Dict) -> list[str]:
    """The string values of `"code"` keys."""
    return [
        value.value
        for key, value in zip(node.keys, node.values, strict=True)
        if isinstance(key, ast.Constant)
        and key.value == "code"
        and isinstance(value, ast.Constant)
        and isinstance(value.value, str)
    ]


def _compared_codes(node: ast.Compare) -> list[str]:
    """The strings a code expression is compared with."""
    sides = [node.left, *node.comparators]
    if not any(_is_code_expression(side) for side in sides):
        return []
    return [text for side in sides if not _is_code_expression(side) for text in _strings(side)]


def test_every_code_the_services_send_is_a_member() -> None:
    found = codes_in_sources()
    # The scan must actually see the services' codes (else it proves nothing).
    assert {"ok", "conflict", "no_fit", "node_unavailable", "invalid_request"} <= set(found)
    assert len(found) >= 15
    unknown = {value: where for value, where in found.items() if value not in set(Code)}
    assert not unknown, f"codes used but not in shared.codes.Code: {unknown}"


def test_the_core_codes_are_a_subset_with_identical_names_and_values() -> None:
    for member in core_refit.Code:
        assert Code[member.name].value == member.value
        assert Code(member.value) == member.value


def test_design_refit_codes_and_ok_are_all_the_members() -> None:
    assert [c.value for c in Code] == ["ok", *DESIGN_REFIT_CODES]
    assert set(codes.REFIT) == set(DESIGN_REFIT_CODES)
    assert Code.OK not in codes.REFIT


def test_a_code_is_its_wire_string() -> None:
    assert Code("no_fit") is Code.NO_FIT
    assert isinstance(Code.NO_FIT, str)
    assert str(Code.ALREADY_ALIGNED) == "already_aligned"
    assert f"{Code.API_ERROR}" == "api_error"


@pytest.mark.parametrize("value", ["ok", *DESIGN_REFIT_CODES])
def test_parse_knows_every_member(value: str) -> None:
    assert Code.parse(value).value == value
    assert Code.parse(value, Code.CONFLICT).value == value


@pytest.mark.parametrize("text", ["", "future_code", "MOVED", " moved", "moved ", "x" * 10_000])
def test_parse_maps_an_unknown_string_to_api_error_by_default(text: str) -> None:
    assert Code.parse(text) is Code.API_ERROR


@pytest.mark.parametrize("value", [None, 1, True, ["moved"], {"code": "moved"}, b"moved"])
def test_parse_maps_a_non_string_to_the_default(value: object) -> None:
    assert Code.parse(value) is Code.API_ERROR
    assert Code.parse(value, Code.DEADLINE_EXCEEDED) is Code.DEADLINE_EXCEEDED


def test_parse_returns_the_given_default_for_an_unknown_code() -> None:
    assert Code.parse("brand_new", Code.INVALID_REQUEST) is Code.INVALID_REQUEST
    assert Code.parse(Code.MOVED) is Code.MOVED


def test_success_and_failure_split_every_code() -> None:
    assert {c.value for c in codes.SUCCESS} == {"ok", "moved", "already_aligned"}
    assert codes.SUCCESS.isdisjoint(codes.FAILURE)
    assert set(Code) == codes.SUCCESS | codes.FAILURE
    assert Code.MOVED.succeeded
    assert Code.OK.succeeded
    assert not Code.NO_FIT.succeeded
    assert {c.value for c in codes.REFIT_SUCCESS} == {"moved", "already_aligned"}


def test_scheduler_retry_set_is_the_extenders() -> None:
    assert {c.value for c in codes.SCHEDULER_RETRY} == {
        "conflict",
        "quota_exceeded",
        "node_unavailable",
        "no_fit",
    }


def test_accounting_codes_are_what_accounting_sends() -> None:
    sent = {
        value for value, where in codes_in_sources().items() if where.startswith("svc_accounting/")
    }
    assert sent <= {c.value for c in codes.ACCOUNTING}
    assert "ok" in sent
    assert {c.value for c in codes.UNCERTAIN} == {"deadline_exceeded", "api_error"}


def test_codes_module_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "shared" / "codes.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            assert node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "enum", "typing"}
