"""How a setting's text (a flag's or an environment variable's) becomes its value.

Each parser raises ValueError saying, in words, what is wrong with the text (the setting's
name is added by whoever reports it), and says what it accepts (`Parser.accepts`), which help
and the settings reference show, so the rule and its description live together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_SHOWN = 80
"""Characters of a refused value echoed in an error (the environment can hold anything)."""

T = TypeVar("T")


class Parser(Generic[T]):
    """Text to a value, and what it accepts in words (empty: nothing worth saying)."""

    __slots__ = ("accepts", "convert")

    def __init__(self, convert: Callable[[str], T], accepts: str = "") -> None:
        self.convert = convert
        self.accepts = accepts

    def __call__(self, value: str) -> T:
        return self.convert(value)


def shown(text: str) -> str:
    """`text` quoted for an error, cut when long."""
    return repr(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "...")


def text(value: str) -> str:
    return value


def optional_text(value: str) -> str | None:
    """Text, where empty means not set."""
    return value or None


def whole(low: int | None = None, high: int | None = None) -> Parser[int]:
    """A whole number within [low, high]."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not a whole number") from None
        if (low is not None and number < low) or (high is not None and number > high):
            raise ValueError(f"{shown(value)}: must be {_range(low, high)}")
        return number

    if low is None and high is None:
        return Parser(parse)
    if low is not None and high is not None:
        return Parser(parse, f"{low} to {high}")
    return Parser(parse, f"{low} or more" if low is not None else f"{high} or less")


def _range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def seconds(*, allow_zero: bool = False) -> Parser[float]:
    """A finite number of seconds, positive (or also 0 when `allow_zero`)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not a number of seconds") from None
        low_ok = number >= 0 if allow_zero else number > 0
        if not low_ok or number == float("inf"):  # NaN fails both comparisons
            what = "a non-negative" if allow_zero else "a positive"
            raise ValueError(f"{shown(value)}: must be {what} number of seconds")
        return number

    return Parser(parse, "0 or more" if allow_zero else "more than 0")


TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"", "0", "false", "no", "off"})


def _boolean(value: str) -> bool:
    folded = value.strip().lower()
    if folded in TRUE:
        return True
    if folded in FALSE:
        return False
    raise ValueError(f"{shown(value)} is not true or false (1/0, yes/no, on/off)")


boolean: Parser[bool] = Parser(_boolean)
"""A switch's variable: 1, true, yes, on (any case) or 0, false, no, off, empty."""


def checked(rule: Callable[[str], str | None], accepts: str = "") -> Parser[str]:
    """Text that `rule` has no objection to (`rule` returns why not, or None)."""

    def parse(value: str) -> str:
        why = rule(value)
        if why:
            raise ValueError(why)
        return value

    parse.__name__ = getattr(rule, "__name__", "value")
    return Parser(parse, accepts)
