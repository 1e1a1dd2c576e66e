"""The core stays pure: no asyncio, NATS, gRPC or Kubernetes client imports (DESIGN: Ownership 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "shared" / "core"
FORBIDDEN = {
    "asyncio",
    "nats",
    "grpc",
    "kubernetes",
    "kubernetes_asyncio",
    "aiohttp",
    "socket",
    "subprocess",
    "pynvml",
}


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_nothing_that_does_io(path: Path) -> None:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    assert not names & FORBIDDEN, f"{path.name} imports {sorted(names & FORBIDDEN)}"
