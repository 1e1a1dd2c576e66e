"""Settings declared once, on the fields of a frozen dataclass, resolved once.

A field made with `setting(...)` (or `switch`, `listing`, `group`) carries everything about
its setting: the default (the field's own), how text becomes a value and what it refuses,
the unit, the help, the flag (`--write-timeout`, from the field name unless given) and the
environment variable, always `NUMAFIT_<FLAG>` (`NUMAFIT_WRITE_TIMEOUT`). `SettingsParser`
adds the flags to argparse and, once parsing is done, fills in every setting not given as a
flag from its environment variable, else from the declared default: flags over environment
over defaults, resolved in one place. `SettingsParser.resolve` then builds the dataclass, the
object a service receives whole.

Why: a setting spread over argparse, an options class and a constructor drifts (one default
of 16 partitions in the options and 0 in the constructor; an environment variable for some
flags and not others, and help that did not say which). Here nothing but the field holds the
default, and the help and the reference table (`shared.service.reference`) are written from
the same declaration, so they cannot disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from shared.service.values import boolean, seconds, shown, text, whole

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

ENV_PREFIX = "NUMAFIT_"
SETTING = "numafit.setting"
"""The field metadata key of one setting."""
GROUP = "numafit.group"
"""The field metadata key of a group: a dataclass whose fields are set by settings."""

T = TypeVar("T")
Kind = Literal["value", "switch", "list"]


class _Unset:
    """What argparse leaves for a flag that was not given (so that it can be told apart from
    one given with the default's value)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: what the declaration says and, once bound to its field, its name."""

    help: str
    parse: Callable[[Any], Any]
    """Text (a flag's or the environment's) to value; ValueError says why not, in words. A
    list's takes every text given (a list of str)."""
    unit: str = ""
    flag: str = ""
    """`--write-timeout`; empty: `--` and the field name with dashes."""
    aliases: tuple[str, ...] = ()
    """Older environment variables still read (after `NUMAFIT_<FLAG>`), shown as deprecated."""
    choices: tuple[str, ...] = ()
    kind: Kind = "value"
    """value: one flag's value; switch: a flag without value (on); list: repeatable, and its
    environment variable a comma-separated list."""
    shown_default: str | None = None
    """How the default reads in help and in the table when its value says little ('')."""
    metavar: str | None = None
    section: str = ""
    """The help section it is listed under (empty: the parser's own options)."""
    name: str = ""
    """The field; set when read from the dataclass."""
    group: str = ""
    """For a member of a `group`: the dataclass field holding the group."""
    default: Any = None

    @property
    def dest(self) -> str:
        """Its attribute on argparse's namespace: the flag's name (`--listen-port` is
        `listen_port` even where the field is `port`), as before settings were declared."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").replace("-", "_").upper()

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.kind == "switch":
            return "off"
        if self.kind == "list":
            return ",".join(str(item) for item in self.default)
        return "none" if self.default is None else str(self.default)

    @property
    def env_text(self) -> str:
        """The environment variables, as help and the table name them."""
        shown = self.env + ("=true" if self.kind == "switch" else "")
        if self.kind == "list":
            shown += " (comma-separated)"
        for alias in self.aliases:
            shown += f", or {alias} (deprecated)"
        return shown

    @property
    def accepts(self) -> str:
        """What its parser accepts, in words (shared.service.values.Parser)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        accepts = getattr(self.parse, "accepts", "")
        return accepts if isinstance(accepts, str) else ""

    def full_help(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        accepts = f"{self.accepts}; " if self.accepts else ""
        return f"{self.help} ({accepts}env {self.env_text}; default {self.default_text}{unit})"


def setting(
    default: T,
    help: str,
    *,
    parse: Callable[[str], T] | None = None,
    unit: str = "",
    flag: str = "",
    aliases: tuple[str, ...] = (),
    choices: tuple[str, ...] = (),
    shown_default: str | None = None,
    metavar: str | None = None,
    section: str = "",
) -> T:
    """A dataclass field that is a setting with one value (`--flag VALUE`)."""
    chosen = parse if parse is not None else _parser_for(default)
    declared = Setting(
        help,
        chosen,
        unit=unit,
        flag=flag,
        aliases=aliases,
        choices=choices,
        shown_default=shown_default,
        metavar=metavar,
        section=section,
    )
    return field(default=default, metadata={SETTING: declared})


def switch(help: str, *, flag: str = "", section: str = "") -> bool:
    """A dataclass field that is an on/off setting: off unless the flag is given (or its
    environment variable is true)."""
    declared = Setting(help, boolean, kind="switch", flag=flag, section=section)
    return field(default=False, metadata={SETTING: declared})


def listing(
    default: tuple[str, ...],
    help: str,
    *,
    parse: Callable[[Sequence[str]], tuple[str, ...]],
    flag: str = "",
    metavar: str | None = None,
    section: str = "",
) -> tuple[str, ...]:
    """A dataclass field set by a repeatable flag (or a comma-separated environment
    variable); `parse` turns every text given into the value and says what is wrong."""
    declared = Setting(help, parse, kind="list", flag=flag, metavar=metavar, section=section)
    return field(default=default, metadata={SETTING: declared})


def group(cls: Callable[..., T], **members: Setting) -> T:
    """A dataclass field holding an object of `cls` (itself a dataclass, e.g. CoreConfig)
    whose named fields are settings: their defaults stay `cls`'s own, not repeated here."""
    return field(default_factory=cls, metadata={GROUP: (cls, members)})


def member(help: str, *, parse: Callable[[str], Any] | None = None, **more: Any) -> Setting:
    """One setting of a `group`: as `setting`, the default taken from the group's class."""
    return Setting(help, parse if parse is not None else str, **more)


def default_of(cls: type[Any], name: str) -> Any:
    """The default of dataclass `cls`'s field `name`, for a setting that feeds it (so the
    value is written once, there)."""
    (found,) = [f for f in dataclasses.fields(cls) if f.name == name]
    if found.default is not dataclasses.MISSING:
        return found.default
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    raise ValueError(f"{cls.__name__}.{name} has no default")


def _bound(declared: Setting, name: str, default: Any, group: str = "") -> Setting:
    flag = declared.flag or "--" + name.replace("_", "-")
    return dataclasses.replace(declared, name=name, flag=flag, default=default, group=group)


def declared_settings(cls: type[Any], defaults: Mapping[str, Any] | None = None) -> list[Setting]:
    """The settings of dataclass `cls`, in field order, bound to their fields (`defaults`
    replaces some: the metrics port differs per service)."""
    found: list[Setting] = []
    for f in dataclasses.fields(cls):
        if SETTING in f.metadata:
            found.append(_bound(f.metadata[SETTING], f.name, f.default))
        elif GROUP in f.metadata:
            inner, members = f.metadata[GROUP]
            inner_defaults = {g.name: g.default for g in dataclasses.fields(inner)}
            found += [_bound(s, name, inner_defaults[name], f.name) for name, s in members.items()]
    if defaults:
        found = [
            dataclasses.replace(s, default=defaults[s.name]) if s.name in defaults else s
            for s in found
        ]
    return found


def _parser_for(default: Any) -> Callable[[str], Any]:
    """The parser a setting without one gets, from its default's type (every float setting is
    a duration so far: a positive number of seconds)."""
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return whole()
    if isinstance(default, float):
        return seconds()
    return text


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse shows an ArgumentTypeError's words (a ValueError only as 'invalid value')."""

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


# --- the parser ------------------------------------------------------------------------------


class SettingsParser(argparse.ArgumentParser):
    """An ArgumentParser that knows its settings and fills in the ones not given as flags
    from the environment, then the defaults, as part of parsing (so every caller of
    parse_args, tests included, sees the values the service would run with)."""

    def __init__(self, *args: Any, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.settings: list[Setting] = []
        self._sections: dict[str, argparse._ArgumentGroup] = {}

    def declare(
        self,
        cls: type[Any],
        *,
        title: str | None = None,
        sections: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        """Add the flags of dataclass `cls`'s settings: under `title` when given, and each
        setting with a section under that section (described by `sections`)."""
        target: argparse.ArgumentParser | argparse._ArgumentGroup = (
            self.add_argument_group(title) if title else self
        )
        for declared in declared_settings(cls, defaults):
            where = target
            if declared.section:
                if declared.section not in self._sections:
                    described = (sections or {}).get(declared.section)
                    self._sections[declared.section] = self.add_argument_group(
                        declared.section, described
                    )
                where = self._sections[declared.section]
            _add(where, declared)
            self.settings.append(declared)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        for declared in self.settings:
            given = getattr(parsed, declared.dest, UNSET)
            if given is UNSET or (given is None and declared.kind == "list"):
                setattr(parsed, declared.dest, self._from_env_or_default(declared))
            elif declared.kind == "list":
                self._check_list(declared, given)
        return parsed, rest

    def _from_env_or_default(self, declared: Setting) -> Any:
        for variable in (declared.env, *declared.aliases):
            raw = self.env.get(variable)
            if raw is None or (raw == "" and declared.kind == "list"):
                continue
            try:
                if declared.kind == "list":
                    declared.parse([raw])  # refused here, as a bad flag is
                    return [raw]
                value = declared.parse(raw)
            except ValueError as exc:
                # One line naming the variable, exit 2, as argparse does for a bad flag.
                self.exit(2, f"{self.prog}: error: {variable}: {exc}\n")
            if declared.choices and value not in declared.choices:
                choices = ", ".join(declared.choices)
                self.exit(
                    2, f"{self.prog}: error: {variable}: {shown(raw)} is not one of {choices}\n"
                )
            return value
        return list(declared.default) if declared.kind == "list" else declared.default

    def _check_list(self, declared: Setting, given: list[str]) -> None:
        try:
            declared.parse(given)
        except ValueError as exc:
            self.error(f"{declared.flag}: {exc}")

    def resolve(self, cls: type[T], parsed: argparse.Namespace, **extra: Any) -> T:
        """Dataclass `cls` from the parsed settings (`extra`: fields that are not settings,
        e.g. a GPU backend or a TLS context)."""
        values: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for declared in declared_settings(cls):
            value = getattr(parsed, declared.dest)
            if declared.kind == "list":
                value = declared.parse(value)
            if declared.group:
                groups.setdefault(declared.group, {})[declared.name] = value
            else:
                values[declared.name] = value
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if GROUP in f.metadata:
                values[f.name] = f.metadata[GROUP][0](**groups.get(f.name, {}))
        return cls(**values, **extra)


def _add(where: argparse.ArgumentParser | argparse._ArgumentGroup, declared: Setting) -> None:
    # `%` would be read as a format by argparse's help.
    shown = declared.full_help().replace("%", "%%")
    if declared.kind == "switch":
        where.add_argument(
            declared.flag,
            dest=declared.dest,
            action="store_const",
            const=True,
            default=UNSET,
            help=shown,
        )
        return
    where.add_argument(
        declared.flag,
        dest=declared.dest,
        # A list's absence is None: `append` adds to its default, so it must not be UNSET.
        default=None if declared.kind == "list" else UNSET,
        type=str if declared.kind == "list" else _argparse_type(declared.parse),
        action="append" if declared.kind == "list" else "store",
        choices=declared.choices or None,
        metavar=declared.metavar,
        help=shown,
    )
