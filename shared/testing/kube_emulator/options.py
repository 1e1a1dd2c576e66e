"""A write's options (dryRun, fieldValidation, fieldManager, force), read and checked as the API
server's handlers do before they touch anything.

An invalid value is answered like upstream's Validate{Create,Update,Patch,Delete}Options:
422 Invalid, e.g. `CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value:
[]string{"bogus"}: supported values: "All"`. A value that does not even parse (force=maybe)
is 400. DELETE takes dryRun from the query or from its DeleteOptions body, as kubectl sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from . import errors
from .errors import FieldError
from .field_validation import DIRECTIVES, Directive

if TYPE_CHECKING:
    from collections.abc import Iterable

    from multidict import MultiMapping

    from .objects import JSONDict

Verb = Literal["Create", "Update", "Patch", "Delete"]

DRY_RUN_ALL = "All"
FIELD_MANAGER_MAX_LENGTH = 128
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class GoLiteral:
    """A value that field errors print verbatim (Go's %#v of a []string, say)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass
class WriteOptions:
    dry_run: bool = False
    field_validation: Directive = "Warn"
    """What to do with unknown fields: the API server's default is Warn."""
    field_manager: str = ""
    """Who writes: the fieldManager parameter, or the User-Agent's product (for managedFields)."""
    force: bool = False
    warnings: list[str] = field(default_factory=list)
    """Filled in while the request is served: sent back as `Warning: 299 - "..."` headers."""


def _go_strings(values: Iterable[str]) -> GoLiteral:
    return GoLiteral("[]string{" + ", ".join(f'"{v}"' for v in values) + "}")


def _dry_run_errors(values: list[str]) -> list[FieldError]:
    if all(value == DRY_RUN_ALL for value in values):
        return []
    return [FieldError("dryRun", "not_supported", 'supported values: "All"', _go_strings(values))]


def _manager_errors(manager: str) -> list[FieldError]:
    problems = []
    if len(manager) > FIELD_MANAGER_MAX_LENGTH:
        problems.append(
            FieldError(
                "fieldManager",
                "invalid",
                f"may not be longer than {FIELD_MANAGER_MAX_LENGTH}",
                manager,
            )
        )
    for position, char in enumerate(manager):
        if not char.isprintable():
            problems.append(
                FieldError(
                    "fieldManager",
                    "invalid",
                    f"invalid character U+{ord(char):04X} (at position {position})",
                    manager,
                )
            )
    return problems


def _parse_bool(name: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise errors.bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax ({name})')


def default_manager(user_agent: str) -> str:
    """The manager of a write without fieldManager: the User-Agent up to its first '/'."""
    return user_agent.split("/", 1)[0][:FIELD_MANAGER_MAX_LENGTH]


def _dry_run_values(query: MultiMapping[str], delete_options: JSONDict | None) -> list[str]:
    """dryRun from the query and, for a delete, from its DeleteOptions body."""
    dry_run = list(query.getall("dryRun", []))
    from_body = delete_options.get("dryRun") if delete_options is not None else None
    if from_body is not None:
        if not isinstance(from_body, list) or not all(isinstance(v, str) for v in from_body):
            raise errors.bad_request("DeleteOptions.dryRun must be a list of strings")
        dry_run += from_body
    return dry_run


def _directive_errors(directive_text: str) -> list[FieldError]:
    if directive_text in ("", *DIRECTIVES):
        return []
    return [
        FieldError(
            "fieldValidation",
            "not_supported",
            'supported values: "", "Ignore", "Strict", "Warn"',
            directive_text,
        )
    ]


def _patch_force(
    force_text: str | None, manager: str, apply: bool, problems: list[FieldError]
) -> bool:
    """A patch's force flag (appending what is wrong with it and with its manager to
    `problems`)."""
    force = False
    if force_text is not None:
        force = _parse_bool("force", force_text)
        if not apply:
            problems.append(
                FieldError("force", "forbidden", "may not be specified for non-apply patch")
            )
    if apply and not manager:
        problems.append(FieldError("fieldManager", "required", "is required for apply patch"))
    return force


def write_options(
    query: MultiMapping[str],
    verb: Verb,
    *,
    apply: bool = False,
    user_agent: str = "",
    delete_options: JSONDict | None = None,
) -> WriteOptions:
    """The options of one write, or a KubeError saying why they are refused."""
    dry_run = _dry_run_values(query, delete_options)
    problems = _dry_run_errors(dry_run)
    manager = query.get("fieldManager", "")
    directive_text = query.get("fieldValidation", "")
    if verb != "Delete":
        problems += _manager_errors(manager)
        problems += _directive_errors(directive_text)
    force = False
    if verb == "Patch":
        force = _patch_force(query.get("force"), manager, apply, problems)
    if problems:
        raise errors.invalid(f"{verb}Options", "", problems, "meta.k8s.io")
    directive: Directive = "Warn"
    for allowed in DIRECTIVES:
        if directive_text == allowed:
            directive = allowed
    return WriteOptions(
        dry_run=bool(dry_run),
        field_validation=directive,
        field_manager=manager or default_manager(user_agent),
        force=force,
    )
