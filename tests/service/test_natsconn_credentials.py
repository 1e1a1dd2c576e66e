"""Credentials in the first URL reach the cluster members nats-py discovers."""

from __future__ import annotations

from shared.service.natsconn import credentials_of


def test_user_and_password_of_the_first_url_that_has_them() -> None:
    servers = ["nats://a:4222", "nats://acc:p%40ss@b:4222", "nats://other:x@c:4222"]
    assert credentials_of(servers) == {"user": "acc", "password": "p@ss"}


def test_a_token_alone_is_a_token() -> None:
    assert credentials_of(["nats://s3cret@a:4222"]) == {"token": "s3cret"}


def test_no_credentials_no_options() -> None:
    assert credentials_of(["nats://a:4222", "b:4222"]) == {}
