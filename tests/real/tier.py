"""`pytestmark = real_tier()` at the top of every real-tier module: the `real` marker where the
binaries are there; else the module is skipped at collection, from this one place, so pytest
folds the whole tier into one line (`SKIPPED [n] tests/real/tier.py:..: real tier: ...`)."""

from __future__ import annotations

import pytest

from tests.real.controlplane import Assets


def real_tier() -> pytest.MarkDecorator:
    found = Assets.find()
    if isinstance(found, str):
        pytest.skip(found, allow_module_level=True)
    return pytest.mark.real
