"""The first NATS connection, when it cannot be made: each distinct error is said once, not on
every attempt, and the line that gives up says the last error."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from shared.service import natsconn
from shared.testing.nats_server import NatsServer
from tests.integration.processes import free_port

if TYPE_CHECKING:
    from pathlib import Path


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        str(getattr(r, "error", ""))
        for r in caplog.records
        if r.name == "numafit.nats" and r.levelno >= logging.WARNING
    ]


async def test_refused_credentials_are_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "auth.conf"
    config.write_text('authorization { user: numafit, password: "right" }\n')
    with NatsServer(config=config, jetstream=False) as server:
        url = server.url.replace("nats://", "nats://numafit:wrong@")
        caplog.set_level(logging.DEBUG, logger="numafit.nats")
        with pytest.raises(ConnectionError) as caught:
            # Every 0.05 s for 1.5 s: about 30 attempts, each refused alike.
            await natsconn.connect(url, "probe", initial_timeout=1.5, reconnect_wait=0.05)
    attempts = [r for r in caplog.records if r.name == "numafit.nats"]
    assert len(attempts) > 4  # the broker was really asked many times
    warnings = said(caplog)
    assert warnings.count("nats: 'Authorization Violation'") == 1
    assert len(warnings) == len(set(warnings))  # each distinct error once
    # The line that gives up names the broker (not the password) and the last error.
    shown = server.url.replace("nats://", "nats://numafit:***@")
    head, _, last = str(caught.value).partition(" (last error: ")
    assert head == f"cannot reach NATS at {shown} within 1.5s"
    assert last.removesuffix(")") in warnings
    assert "wrong" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://u:secret@nats:4222", "nats://u:***@nats:4222"),
        ("nats://a:x@n1:4222,nats://b:y@n2:4222", "nats://a:***@n1:4222,nats://b:***@n2:4222"),
        ("nats://s3cr3t-token@nats:4222", "nats://***@nats:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ],
)
def test_passwords_are_hidden(url: str, shown: str) -> None:
    assert natsconn.redacted(url) == shown


async def test_nothing_listening_is_said_once_and_named_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    caplog.set_level(logging.DEBUG, logger="numafit.nats")
    with pytest.raises(ConnectionError) as caught:
        await natsconn.connect(
            f"nats://127.0.0.1:{port}", "probe", initial_timeout=1.0, reconnect_wait=0.05
        )
    assert said(caplog) == [f"[Errno 111] Connect call failed ('127.0.0.1', {port})"]
    assert str(caught.value) == (
        f"cannot reach NATS at nats://127.0.0.1:{port} within 1s "
        f"(last error: [Errno 111] Connect call failed ('127.0.0.1', {port}))"
    )
