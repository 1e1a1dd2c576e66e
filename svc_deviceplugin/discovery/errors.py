"""Errors raised while discovering GPUs.

One tree, so callers (the device plugin's startup, ``--inventory``) can catch
discovery problems without catching programming errors::

    DiscoveryError            NVML missing or failing, unreadable topology file
     └── TopologyError        a simulated topology that does not validate
"""

from __future__ import annotations

__all__ = ["DiscoveryError", "TopologyError"]


class DiscoveryError(Exception):
    """The GPUs of this node could not be discovered."""


class TopologyError(DiscoveryError):
    """A simulated GPU topology is malformed; the message names the item and key."""
