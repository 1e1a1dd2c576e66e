"""The test tiers, as pytest markers given at collection (`-m pure` and so on).

- `pure`: the core and everything else that starts nothing (no nats-server, no emulator, no
  process, no socket): `make unit`, well under a minute;
- `services`: services on a real nats-server, the API emulator, gRPC over unix sockets, CLI
  processes;
- `e2e`: whole scenarios (`numafit simulate`, sim-node);
- `chaos`: faults, kills, pauses and fuzzing with real processes;
- `ops`: compose, Helm, Prometheus rules, the image;
- `real`: upstream Kubernetes from KUBEBUILDER_ASSETS (`make test-real`).

A test's tier is its folder's (core, chaos, ops, e2e, real, integration), else `services` when
it uses a fixture or its module a name that starts something (below), else `pure`. A test that
is slow without doing I/O is a bench, not a test (numafit bench).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable

TIERS = {
    "pure": "starts nothing: the core and in-memory tests (make unit)",
    "services": "services on a real nats-server, the API emulator, gRPC, CLI processes",
    "e2e": "whole scenarios: numafit simulate, sim-node",
    "chaos": "faults, kills, pauses and fuzzing with real processes",
    "ops": "compose, Helm, Prometheus rules, the image",
}
"""Marker -> what it holds (`real` is registered in pyproject.toml beside these)."""

BY_FOLDER = {
    "core": "pure",
    "chaos": "chaos",
    "ops": "ops",
    "e2e": "e2e",
    "real": "real",
    "integration": "services",
}
IO_FIXTURES = frozenset({"nats_url", "processes", "tmp_socket", "emulator", "kube"})
"""Fixtures that start something."""
IO_NAMES = frozenset(
    {
        "KubeEmulator",
        "NatsServer",
        "harness",
        "subprocess",
        "grpc",
        "serve_remote",
        "run_cli",
        "service",
        "aiohttp",
        "TestClient",
        "TestServer",
    }
)
"""Names whose presence in a test module means its tests start something."""


def register(config: pytest.Config) -> None:
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def tier_of(item: pytest.Item) -> str:
    parts = item.path.parts
    folder = parts[parts.index("tests") + 1] if "tests" in parts[:-1] else ""
    if folder in BY_FOLDER:
        return BY_FOLDER[folder]
    if IO_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return "services"
    module = getattr(item, "module", None)
    if module is not None and IO_NAMES.intersection(vars(module)):
        return "services"
    return "pure"


def mark(items: Iterable[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if not any(m.name == tier for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, tier))
