"""Every NATS subject and queue group numafit uses; no subject literal lives anywhere else.

Node names become one subject token: every `.` is replaced by `_` (DESIGN.md), so a node's
subjects can be granted to that node alone with one permission entry.
"""

from __future__ import annotations

from typing import Final

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
"""Accounting operations, each on `numafit.accounting.v1.<op>.<node>`."""

ALL_NODES: Final = "_all"
"""The node token of a cluster-wide snapshot request."""


def node_token(node: str) -> str:
    """The subject token of a node name."""
    return node.replace(".", "_")


def refit(node: str) -> str:
    return f"{REFIT_PREFIX}.{node_token(node)}"


def accounting(op: str, node: str) -> str:
    if op not in ACCOUNTING_OPS:
        raise ValueError(f"unknown accounting operation {op!r}")
    return f"{ACCOUNTING_PREFIX}.{op}.{node_token(node)}"


def accounting_wildcard(op: str) -> str:
    return f"{ACCOUNTING_PREFIX}.{op}.*"


def usage(node: str) -> str:
    return f"{USAGE_PREFIX}.{node_token(node)}"


def last_token(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]
