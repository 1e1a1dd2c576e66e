"""Histogram buckets shared by more than one service (services do not import each other).

REFIT_LATENCY_BUCKETS resolve 1 ms .. 2 s (the refit budget) with boundaries at the thresholds
the alerts use. svc_refit times its handling with them and svc_deviceplugin the refit round
trip and kubelet's calls, so the two sides of a refit can be read on the same scale.
"""

from __future__ import annotations

REFIT_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
)
