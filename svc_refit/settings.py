"""`numafit run refit`'s settings, declared once (`shared.service.declare`)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.core.config import CoreConfig
from shared.service.declare import group
from shared.service.settings import gpu_scheduler_policy

METRICS_PORT = 9103


@dataclass(frozen=True, slots=True)
class RefitOptions:
    """Everything the refit service is configured with, received whole."""

    config: CoreConfig = group(CoreConfig, gpu_scheduler_policy=gpu_scheduler_policy())
    """The core's rules; the CLI sets the default GPU policy, the rest keep HAMi's."""
