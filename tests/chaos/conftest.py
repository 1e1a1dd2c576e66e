"""The chaos tier's shared fixture: one hostile-input system for the fuzz and name tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.hostile import Hostile, open_hostile

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="package")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    yield from open_hostile(tmp_path_factory.mktemp("hostile"))
