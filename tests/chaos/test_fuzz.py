"""Hostile input to every entry point: refit and every accounting operation over NATS (body and
subject token), the extender's verbs and the admission webhook over HTTP.

For each generated request: no HTTP 500 (nor its NATS form, an "internal error" reply), an
answer whenever the broker delivered the request, and nothing changed (every pod and node in
the API server, accounting's whole ledger). Afterwards every service is alive, ready and
answers a valid request. Violations are collected rather than raised, so hypothesis neither
shrinks nor replays (the state a failed example left behind would make a replay flaky), and
the first few are shown. Seeded (derandomized) and bounded: about 1,500 requests in all.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import subjects
from tests.chaos import fuzzing
from tests.chaos.hostile import SILENT, Hostile

EXAMPLES = 110
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
SHOWN = 5


def silenced(violations: list[str]) -> bool:
    """Once a service stopped answering, later examples would only time out (2 s each)."""
    return any(SILENT in v for v in violations)


def verdict(hostile: Hostile, violations: list[str], target: str) -> None:
    still = hostile.run(hostile.problems_serving())
    report = violations[:SHOWN] + [f"afterwards: {p}" for p in still]
    more = f"\n... and {len(violations) - SHOWN} more" if len(violations) > SHOWN else ""
    assert not violations and not still, f"{target}:\n" + "\n".join(report) + more


def test_refit_survives_fuzzed_bodies_and_subject_tokens(hostile: Hostile) -> None:
    violations: list[str] = []

    @FUZZ
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        token = data.draw(fuzzing.TOKENS, "token")
        node = fuzzing.node_name_for(token)
        body = data.draw(fuzzing.bodies(fuzzing.refit_shape(node)), "body")
        subject = f"{subjects.REFIT_PREFIX}.{token}"
        if silenced(violations):
            return
        violations.extend(hostile.run(hostile.nats_case("refit", subject, body)))

    one()
    verdict(hostile, violations, "refit")


@pytest.mark.parametrize("op", subjects.ACCOUNTING_OPS)
def test_accounting_survives_fuzzed_bodies_and_subject_tokens(hostile: Hostile, op: str) -> None:
    violations: list[str] = []
    # node-1 exists: a well-formed register there is a legitimate write, not hostile input.
    tokens = fuzzing.TOKENS.filter(lambda t: t != "node-1") if op == "register" else fuzzing.TOKENS

    @FUZZ
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        token = data.draw(tokens, "token")
        node = fuzzing.node_name_for(token)
        body = data.draw(fuzzing.bodies(fuzzing.accounting_shape(op, node)), "body")
        subject = subjects.accounting_token(op, token)
        if silenced(violations):
            return
        violations.extend(hostile.run(hostile.nats_case(op, subject, body)))

    one()
    verdict(hostile, violations, f"accounting {op}")


HTTP_TARGETS = {
    "/filter": fuzzing.EXTENDER_ARGS,
    "/prioritize": fuzzing.EXTENDER_ARGS,
    "/bind": fuzzing.BINDING_ARGS,
    "/webhook": fuzzing.ADMISSION_REVIEW,
    "/validate": fuzzing.ADMISSION_REVIEW,
}


@pytest.mark.parametrize("path", list(HTTP_TARGETS))
def test_scheduler_http_survives_fuzzed_bodies(hostile: Hostile, path: str) -> None:
    violations: list[str] = []

    @FUZZ
    @given(body=fuzzing.bodies(HTTP_TARGETS[path]))
    def one(body: bytes) -> None:
        if silenced(violations):
            return
        violations.extend(hostile.run(hostile.http_case(path, body)))

    one()
    verdict(hostile, violations, f"POST {path}")
