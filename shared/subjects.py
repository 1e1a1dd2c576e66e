"""Every NATS subject and queue group numafit uses; no subject literal lives anywhere else.

Node names become one subject token: every `.` is replaced by `_` (docs/reference/messages.md),
so a node's subjects can be granted to that node alone with one permission entry.

Accounting's subjects also carry the node's *slot* (shared/core/partitions.py), just before the
node token: `numafit.accounting.v1.<op>.<slot>.<node>`. The slot is a pure function of the node
name, so every caller (scheduler, refit, device plugin, the tools) builds the subject from the
node alone, and each accounting replica subscribes to the slots of the partitions it owns and
nothing else (docs/design/partitioned-accounting.md). The node token stays last, so a node's
permission reads `numafit.accounting.v1.<op>.*.<node>`.

Every name is validated before it becomes a token. A Kubernetes node name is a DNS-1123
subdomain of at most 253 characters; anything else (whitespace, a wildcard, 5,000 characters)
would make a subject nats-server refuses, and a protocol line over its `max_control_line` (4096)
makes the server close the whole connection. So an invalid name is refused here, with
`InvalidName`, and never reaches the client library.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final, NamedTuple, TypeGuard

from shared.core.partitions import SLOTS, slot_of

if TYPE_CHECKING:
    from collections.abc import Iterable

REFIT_PREFIX: Final = "numafit.refit.v1"
REFIT_WILDCARD: Final = f"{REFIT_PREFIX}.*"
REFIT_QUEUE: Final = "numafit-refit"

ACCOUNTING_PREFIX: Final = "numafit.accounting.v1"
ACCOUNTING_QUEUE: Final = "numafit-accounting"

USAGE_PREFIX: Final = "numafit.usage.v1"
USAGE_WILDCARD: Final = f"{USAGE_PREFIX}.*"

ACCOUNTING_OPS: Final = (
    "reserve",
    "bind-phase",
    "move",
    "consume",
    "pending",
    "snapshot",
    "register",
)
"""Accounting operations, each on `numafit.accounting.v1.<op>.<slot>.<node>`."""

ALL_NODES: Final = "_all"
"""The node token of a snapshot of every node of one partition (`accounting_all`)."""
ACCOUNTING_EVERY_SLOT: Final = f"{ACCOUNTING_PREFIX}.*.*.*"
"""Every accounting request: what one unpartitioned replica (`--partitions 0`) subscribes to."""

MAX_NAME_LENGTH: Final = 253
"""Kubernetes object names (DNS-1123 subdomain) are at most 253 characters."""

_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_TOKEN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(_[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SHOWN: Final = 64


class InvalidName(ValueError):
    """A name that is not a Kubernetes name, so it can never be a subject token."""


def shown(text: str, limit: int = _SHOWN) -> str:
    """`text` for an error message or log line: repr'd and cut, so unbounded input stays
    bounded wherever it is echoed."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def valid_name(name: object) -> TypeGuard[str]:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME_LENGTH
        and _SUBDOMAIN.fullmatch(name) is not None
    )


_KNOWN_VALID: set[str] = set()
"""Names already found valid: a filter names every node of the cluster each time, and one set
lookup is much cheaper than a regular expression per name."""
KNOWN_VALID_LIMIT: Final = 65536
"""Names remembered at most (then forgotten at once and learnt again): made-up names in
requests cannot grow it without bound."""


def all_valid_names(names: Iterable[object]) -> bool:
    """Is every one of `names` a valid name (`valid_name`)? Remembers the valid ones."""
    known = _KNOWN_VALID
    names = names if isinstance(names, (list, tuple)) else list(names)  # read twice
    try:
        if known.issuperset(names):
            return True
    except TypeError:  # something unhashable: not a name
        return False
    for name in names:
        if not valid_name(name):
            return False
        if len(known) >= KNOWN_VALID_LIMIT:
            known.clear()
        known.add(name)
    return True


def valid_names(names: Iterable[str]) -> list[str]:
    """Those of `names` that are valid names, in order (all of them, at once, in the usual
    case that every one is)."""
    names = names if isinstance(names, (list, tuple)) else list(names)
    if all_valid_names(names):
        return list(names)
    return [name for name in names if valid_name(name)]


def check_name(name: object, what: str = "node name") -> str:
    """`name` when it is a DNS-1123 subdomain of at most 253 characters, else `InvalidName`."""
    if not isinstance(name, str):
        raise InvalidName(f"{what} must be a string")
    if not name:
        raise InvalidName(f"{what} is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH}")
    if _SUBDOMAIN.fullmatch(name) is None:
        raise InvalidName(
            f"{what} {shown(name)} is not a Kubernetes name (lower-case letters, digits, '-' "
            "and '.')"
        )
    return name


_UID: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]{0,126}[A-Za-z0-9])?")


def valid_uid(uid: object) -> bool:
    """Is `uid` what an API server assigns as `metadata.uid` (a UUID; at most 128 characters of
    letters, digits and `._:-`)? Bounded, so no request carrying it can outgrow NATS's limit."""
    return isinstance(uid, str) and _UID.fullmatch(uid) is not None


def check_pod(namespace: str, name: str, uid: str) -> None:
    """A pod's namespace, name and UID are what the API server could hold (they travel in
    accounting requests, API paths and events), else `InvalidName` naming the field."""
    check_name(namespace, "pod namespace")
    check_name(name, "pod name")
    if not valid_uid(uid):
        raise InvalidName(f"pod UID {shown(uid)} is not a Kubernetes UID")


def valid_token(token: str) -> bool:
    """Is `token` the subject token of some valid node name?"""
    return 0 < len(token) <= MAX_NAME_LENGTH and _TOKEN.fullmatch(token) is not None


def node_token(node: str) -> str:
    """The subject token of a node name (`InvalidName` when it is not one)."""
    return check_name(node).replace(".", "_")


def refit(node: str) -> str:
    return f"{REFIT_PREFIX}.{node_token(node)}"


def accounting(op: str, node: str) -> str:
    """The subject of accounting operation `op` for `node`: its slot, then its token. For
    `ALL_NODES` (snapshot only), the snapshot of the partition holding slot 0."""
    if op not in ACCOUNTING_OPS:
        raise ValueError(f"unknown accounting operation {op!r}")
    if node == ALL_NODES:
        if op != "snapshot":
            raise ValueError(f"{op} cannot address every node")
        return accounting_all(0)
    token = node_token(node)
    return f"{ACCOUNTING_PREFIX}.{op}.{slot_of(node)}.{token}"


def accounting_all(slot: int) -> str:
    """The snapshot of every node its answerer serves, asked of the owner of `slot` (slot k
    belongs to partition k for every k below the partition count)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is not one of {SLOTS}")
    return f"{ACCOUNTING_PREFIX}.snapshot.{slot}.{ALL_NODES}"


def accounting_slot(slot: int) -> str:
    """Every operation on the nodes of `slot`: what the owner of its partition subscribes to."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is not one of {SLOTS}")
    return f"{ACCOUNTING_PREFIX}.*.{slot}.*"


def accounting_wildcard(op: str) -> str:
    """Operation `op` on every node."""
    return f"{ACCOUNTING_PREFIX}.{op}.*.*"


class AccountingSubject(NamedTuple):
    op: str
    slot: int
    token: str
    """A node token, or `ALL_NODES`."""

    @property
    def node(self) -> str:
        """The node name the token stands for (`_` is never part of a node name)."""
        return self.token.replace("_", ".")

    def slot_matches(self) -> bool:
        """Is the slot the node's own? A caller may build a subject by hand; one naming another
        slot reached a replica that may not own the node. A token that names no node is let
        through: the operation refuses it for what it is."""
        if self.token == ALL_NODES or not valid_token(self.token):
            return True
        return slot_of(self.node) == self.slot


def accounting_token(op: str, token: str) -> str:
    """The subject of `op` for a subject token taken as it is, unchecked (what a hostile or
    careless client sends): its slot is computed as for the node it would name."""
    return f"{ACCOUNTING_PREFIX}.{op}.{slot_of(token.replace('_', '.'))}.{token}"


_SLOT_TOKEN: Final = re.compile(r"0|[1-9][0-9]{0,2}")


def parse_accounting(subject: str) -> AccountingSubject | None:
    """The operation, slot and node token of an accounting subject; None when it is not one
    (the token itself is judged by the operation, as it was before slots)."""
    prefix = f"{ACCOUNTING_PREFIX}."
    if not subject.startswith(prefix):
        return None
    parts = subject[len(prefix) :].split(".")
    if len(parts) != 3 or _SLOT_TOKEN.fullmatch(parts[1]) is None:
        return None
    slot = int(parts[1])
    if slot >= SLOTS:
        return None
    return AccountingSubject(parts[0], slot, parts[2])


def usage(node: str) -> str:
    return f"{USAGE_PREFIX}.{node_token(node)}"


def last_token(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]
