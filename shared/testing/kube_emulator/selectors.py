"""Label and field selectors: parsed once per request, then matched against every candidate.

Both grammars follow k8s.io/apimachinery (labels.Parse and fields.ParseSelector) closely enough
that a selector the API server accepts is accepted here and means the same thing, including
the easy-to-forget cases: `key!=v` and `notin` also match objects without the label, and
`spec.nodeName=` (empty value) selects pods that are not scheduled yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping


class SelectorError(ValueError):
    """A selector the API server would refuse with 400 BadRequest; str() is its message."""


# --- field selectors -------------------------------------------------------------------------

FieldOp = Literal["=", "!="]


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    op: FieldOp
    value: str


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A conjunction of `field=value` / `field!=value` terms."""

    requirements: tuple[FieldRequirement, ...] = ()

    def check_supported(self, supported: Mapping[str, object]) -> None:
        for requirement in self.requirements:
            if requirement.field not in supported:
                raise SelectorError(f"field label not supported: {requirement.field}")

    def matches(self, fields: Mapping[str, str]) -> bool:
        for requirement in self.requirements:
            equal = fields.get(requirement.field, "") == requirement.value
            if equal != (requirement.op == "="):
                return False
        return True


# At each position, tried in this order so that `!=` and `==` are not read as `=`.
_FIELD_OPERATORS: tuple[tuple[str, FieldOp], ...] = (("!=", "!="), ("==", "="), ("=", "="))


def parse_field_selector(text: str) -> FieldSelector:
    """Parse e.g. `spec.nodeName=node-1,status.phase!=Succeeded`; `\\,` `\\=` `\\\\` escape."""
    requirements = []
    for term in _split_terms(text):
        if term:
            requirements.append(_field_requirement(term, text))
    return FieldSelector(tuple(requirements))


def _field_requirement(term: str, text: str) -> FieldRequirement:
    # The first operator from the left splits the term, as upstream's splitTerm does.
    index = 0
    while index < len(term):
        if term[index] == "\\":
            index += 2
            continue
        for token, op in _FIELD_OPERATORS:
            if term.startswith(token, index):
                field, value = term[:index].strip(), term[index + len(token) :]
                return FieldRequirement(field, op, _unescape(value))
        index += 1
    raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")


def _split_terms(text: str) -> list[str]:
    """Split on the commas that are not escaped."""
    terms, start, index = [], 0, 0
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == ",":
            terms.append(text[start:index])
            start = index + 1
        index += 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


# --- label selectors -------------------------------------------------------------------------

LabelOp = Literal["exists", "!exists", "=", "!=", "in", "notin", "gt", "lt"]

_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s!=(),<>]+)")
_KEY = re.compile(
    r"^([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"
)
_VALUE = re.compile(r"^([a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?)?$")


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    op: LabelOp
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.op:
            case "exists":
                return present
            case "!exists":
                return not present
            case "=" | "in":
                return present and value in self.values
            case "!=" | "notin":
                # Absent counts as "not equal", as in the API server.
                return not present or value not in self.values
            case "gt" | "lt":
                try:
                    have, bound = int(value), int(next(iter(self.values)))
                except ValueError:
                    return False
                return present and (have > bound if self.op == "gt" else have < bound)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A conjunction of label requirements; the empty selector matches everything."""

    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)


def parse_label_selector(text: str) -> LabelSelector:
    """Parse e.g. `app=web,tier in (a, b),!legacy,gpu,priority>5`."""
    return _LabelParser(text).parse()


class _LabelParser:
    """A recursive-descent parser over the tokens of one selector (labels.Parse's grammar)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.position = 0

    def parse(self) -> LabelSelector:
        requirements = []
        while self.position < len(self.tokens):
            requirements.append(self._requirement())
            if self.position < len(self.tokens):
                if self._take() != ",":
                    raise self._error("expected ',' or end of string")
                if self.position == len(self.tokens):
                    raise self._error("trailing ','")
        return LabelSelector(tuple(requirements))

    def _requirement(self) -> LabelRequirement:
        token = self._take()
        if token == "!":
            return LabelRequirement(_check_key(self._take()), "!exists")
        key = _check_key(token)
        following = self._peek()
        if following in (None, ","):
            return LabelRequirement(key, "exists")
        self._take()
        if following in ("=", "==", "!="):
            value = "" if self._peek() in (None, ",") else self._take()
            op: LabelOp = "!=" if following == "!=" else "="
            return LabelRequirement(key, op, frozenset({_check_value(value)}))
        if following == "in":
            return LabelRequirement(key, "in", self._value_set())
        if following == "notin":
            return LabelRequirement(key, "notin", self._value_set())
        if following in (">", "<"):
            bound = self._take()
            if not bound.lstrip("-").isdigit():
                raise self._error(
                    f"for 'Gt', 'Lt' operators, the value must be an integer: {bound}"
                )
            return LabelRequirement(key, "gt" if following == ">" else "lt", frozenset({bound}))
        raise self._error(f"found '{following}', expected: in, notin, =, ==, !=, gt, lt")

    def _value_set(self) -> frozenset[str]:
        if self._take() != "(":
            raise self._error("expected '(' after in/notin")
        values: set[str] = set()
        expect_value = True
        while (token := self._take()) != ")":
            if token == ",":
                if expect_value:
                    values.add("")  # `in (a,,b)` names the empty value, as upstream allows
                expect_value = True
            elif expect_value:
                values.add(_check_value(token))
                expect_value = False
            else:
                raise self._error("expected ',' or ')' in a value set")
        if not values:
            raise self._error("for 'in', 'notin' operators, values set can't be empty")
        return frozenset(values)

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise self._error("unexpected end of selector")
        self.position += 1
        return token

    def _error(self, why: str) -> SelectorError:
        return SelectorError(f"unable to parse requirement: {why} in '{self.text}'")


def _tokenize(text: str) -> list[str]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise SelectorError(f"unable to parse requirement: unexpected character in '{text}'")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _check_key(key: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f'unable to parse requirement: invalid label key "{key}"')
    return key


def _check_value(value: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise SelectorError(f'unable to parse requirement: invalid label value: "{value}"')
    return value
